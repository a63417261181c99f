"""The logs a witness takes from bundles (``[witness] bundles``,
notary/server/witnessedlogs.py): read from files and directories, each key
once, a bad bundle skipped with a warning naming it, and read again on
SIGHUP on a real notary on loopback (a log dropped is refused with 404, a
log added is cosigned; a reload that cannot read its paths keeps the set)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import trio

from notary.config import load_config
from notary.errors import ConfigError, UsageError
from notary.protocol import tlog
from notary.protocol.bundle import BundleHost, BundleLog, make_bundle
from notary.server.witnessedlogs import read_witnessed_logs
from notary.state import crypto
from tests.support.made_log import MadeLog
from tests.support.notaries import LOCALHOST, NotaryUnderTest, RawResponse, open_v2_notary, send_raw

_CERT = crypto.certificate_pem(
    crypto.make_self_signed_certificate(crypto.generate_rsa_key(), LOCALHOST)
).decode("ascii")
WITNESS_NAME = "witness.test/bundles"
TIMEOUT_S = 20.0


A, B, C = MadeLog("a.test/log"), MadeLog("b.test/log"), MadeLog("c.test/log")


def write_bundle(path: Path, log: MadeLog | None, name: str = "Lab") -> None:
    made = make_bundle(
        name=name, location="https://127.0.0.1/lab.notary",
        hosts=[BundleHost(LOCALHOST, 443, 80, _CERT)],
        log=BundleLog.of(log.origin, log.public) if log is not None else None,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(made.to_json())


def test_a_directory_of_bundles_adds_their_logs_and_skips_the_bad_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    directory = tmp_path / "bundles"
    write_bundle(directory / "b.notary", B)
    write_bundle(directory / "again-a.notary", A)  # a key [witness] logs names already
    write_bundle(directory / "no-log.notary", None)
    (directory / "broken.notary").write_text("{not json")
    (directory / "readme.txt").write_text("not a bundle, not read")
    (directory / "subdirectory.notary").mkdir()
    os.mkfifo(directory / "pipe.notary")  # read, it would block the reading thread
    os.mkfifo(tmp_path / "named-pipe.notary")
    lone = tmp_path / "c.notary"
    write_bundle(lone, C)
    paths = (directory, tmp_path / "named-pipe.notary", lone)
    logs = read_witnessed_logs((A.vkey,), paths, strict=True)
    assert logs == (A.vkey, B.vkey, C.vkey)
    assert set(tlog.witnessed_logs(logs)) == {A.origin, B.origin, C.origin}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no-log.notary" in w and "names no log" in w for w in warnings), warnings
    assert any("broken.notary" in w and "not JSON" in w for w in warnings), warnings
    assert any("named-pipe.notary" in w and "not a regular file" in w for w in warnings)
    # What a directory holds besides bundle files is not read, nor said.
    assert not any(word in w for w in warnings for word in ("readme", "again-a", "/pipe"))


def test_a_path_that_cannot_be_read_fails_a_reload_and_warns_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    missing = tmp_path / "gone"
    with pytest.raises(UsageError, match="gone"):
        read_witnessed_logs((A.vkey,), (missing,), strict=True)
    assert read_witnessed_logs((A.vkey,), (missing,), strict=False) == (A.vkey,)
    assert any("gone" in r.getMessage() for r in caplog.records)
    # Nothing at all to witness: said, not fatal.
    assert read_witnessed_logs((), (tmp_path,), strict=True) == ()
    assert any("no log to witness" in r.getMessage() for r in caplog.records)


def test_witness_bundles_config(tmp_path: Path) -> None:
    files = {"key_file": tmp_path / "k", "cert_file": tmp_path / "c", "db_file": tmp_path / "d"}
    (tmp_path / "notary.toml").write_text(
        f'[server]\nkey_file = "{files["key_file"]}"\ncert_file = "{files["cert_file"]}"\n'
        f'db_file = "{files["db_file"]}"\n[v2]\nkey_file = "v2.key"\n'
        f'[witness]\nenabled = true\nname = "{WITNESS_NAME}"\nbundles = "trusted"\n'
    )
    config = load_config(tmp_path / "notary.toml")
    assert config.witness.bundles == (tmp_path / "trusted",) and config.witness.logs == ()
    base = {"server": files, "v2": {"key_file": tmp_path / "v"}}
    both = {"enabled": True, "name": WITNESS_NAME, "logs": (A.vkey,), "bundles": ["x", "y"]}
    assert load_config(None, {**base, "witness": both}).witness.bundles == (Path("x"), Path("y"))
    with pytest.raises(ConfigError, match=r"logs .* or bundles"):
        load_config(None, {**base, "witness": {"enabled": True, "name": WITNESS_NAME}})
    with pytest.raises(ConfigError, match="bundles"):
        load_config(None, {**base, "witness": {**both, "bundles": [3]}})


async def add(notary: NotaryUnderTest, payload: bytes) -> RawResponse:
    return await send_raw(notary.port, (
        f"POST /v2/witness/add-checkpoint HTTP/1.0\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload)


async def test_sighup_reads_the_bundles_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "bundles"
    write_bundle(directory / "a.notary", A)
    witness = {"enabled": True, "name": WITNESS_NAME, "bundles": (directory,)}
    async with open_v2_notary(tmp_path, {}, witness=witness) as notary:
        running = notary.running.witness
        assert running is not None and running.origins == {A.origin}
        assert (await add(notary, A.add_checkpoint(0, 3))).status == 200
        assert (await add(notary, B.add_checkpoint(0, 3))).status == 404
        # B's bundle in, A's out; the connections of the notary stay.
        write_bundle(directory / "b.notary", B)
        (directory / "a.notary").unlink()
        os.kill(os.getpid(), signal.SIGHUP)
        with trio.fail_after(TIMEOUT_S):
            while running.origins != {B.origin}:  # noqa: ASYNC110 (the signal task sets no event)
                await trio.sleep(0.01)
        assert (await add(notary, A.add_checkpoint(3, 5))).status == 404
        assert (await add(notary, B.add_checkpoint(0, 3))).status == 200
        # A reload that cannot read its directory keeps the logs.
        caplog.set_level(logging.ERROR)
        directory.rename(tmp_path / "moved")
        assert not await trio.to_thread.run_sync(running.reload)
        assert running.origins == {B.origin}
        assert any("kept the previous logs" in r.getMessage() for r in caplog.records)
        assert (await add(notary, B.add_checkpoint(3, 5))).status == 200
