"""The ``notary`` command line (notary.cli) and ``dev-init`` (notary.node.devsetup).

Most tests call ``main()`` in-process; a few run ``python -m notary`` in a
subprocess to prove that what the operator sees has no traceback. Nothing here
touches the network except one test that binds 127.0.0.1 to hold a port.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from notary import cli
from notary.cli import build_parser
from notary.cli.serve import config_from_args
from notary.config import Endpoint, load_config
from notary.model.targets import Target
from notary.protocol.bundle import parse_bundle
from notary.state import crypto
from notary.state.store import SCHEMA_VERSION, Store
from tests.support.command_line import python_m_notary
from tests.support.config_files import write_config
from tests.support.observations import probe_result

REPO = Path(__file__).resolve().parents[1]
LOCATION = "https://notary.example.test/example.notary"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``argv``; it must fail as a usage error. Returns the message."""
    status, _out, err = run(argv, capsys)
    assert status == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert err.endswith("\n")
    assert lines[0].startswith("notary: error: ")
    return lines[0].removeprefix("notary: error: ")


def sha1_pin_of_pem(pem: str) -> str:
    body = "".join(pem.split("-----")[2].split())
    digest = hashlib.sha1(base64.b64decode(body)).digest()
    return ":".join(f"{b:02X}" for b in digest)


@pytest.fixture(scope="module")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A key and certificate made once by ``notary keygen``."""
    directory = tmp_path_factory.mktemp("keys")
    key, cert = directory / "notary.key", directory / "notary.crt"
    assert cli.main(["keygen", "--out-key", str(key), "--out-cert", str(cert),
                     "--name", "notary.example.test"]) == 0
    return key, cert


# -- keygen ----------------------------------------------------------------------


def test_keygen_writes_a_private_key_and_a_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_path, cert_path = tmp_path / "n.key", tmp_path / "n.crt"
    before = datetime.datetime.now(datetime.UTC)
    status, out, err = run(["keygen", "--out-key", str(key_path), "--out-cert", str(cert_path),
                            "--name", "notary.example.test", "--days", "30"], capsys)
    after = datetime.datetime.now(datetime.UTC)
    assert (status, err) == (0, "")
    assert str(key_path) in out
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert not cert_path.stat().st_mode & 0o022
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    crypto.check_key_matches_certificate(key, cert)
    assert key.key_size == 2048
    thirty = datetime.timedelta(days=30)
    assert before + thirty - datetime.timedelta(seconds=5) <= cert.not_valid_after_utc
    assert cert.not_valid_after_utc <= after + thirty
    assert cert.not_valid_before_utc <= before
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["notary.example.test"]


def test_keygen_for_an_ip_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, _ = run(["keygen", "--out-key", str(tmp_path / "k"), "--out-cert",
                        str(tmp_path / "c"), "--name", "127.0.0.1", "--days", "1"], capsys)
    assert status == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "c").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_keygen_default_validity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["keygen", "--out-key", str(tmp_path / "k"), "--out-cert", str(tmp_path / "c"),
                "--name", "n.example.test"], capsys)[0] == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "c").read_bytes())
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc - crypto.BACKDATE).days
    assert days == crypto.DEFAULT_CERTIFICATE_DAYS


def test_keygen_refuses_to_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, cert = tmp_path / "k", tmp_path / "c"
    argv = ["keygen", "--out-key", str(key), "--out-cert", str(cert), "--name", "n.example.test"]
    assert run(argv, capsys)[0] == 0
    old_key, old_cert = key.read_bytes(), cert.read_bytes()
    message = usage_error(argv, capsys)
    assert "exists" in message
    assert "--force" in message
    assert (key.read_bytes(), cert.read_bytes()) == (old_key, old_cert)
    # Only the certificate exists: still refused, and the key is not written.
    key.unlink()
    assert "exists" in usage_error(argv, capsys)
    assert not key.exists()


def test_keygen_force_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key, cert = tmp_path / "k", tmp_path / "c"
    argv = ["keygen", "--out-key", str(key), "--out-cert", str(cert), "--name", "n.example.test"]
    assert run(argv, capsys)[0] == 0
    old_key = key.read_bytes()
    key.chmod(0o644)
    assert run([*argv, "--force"], capsys)[0] == 0
    assert key.read_bytes() != old_key
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c", "k"]  # no temp files left


def test_keygen_force_does_not_follow_a_planted_temp_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, cert = tmp_path / "k", tmp_path / "c"
    argv = ["keygen", "--out-key", str(key), "--out-cert", str(cert), "--name", "n.example.test"]
    assert run(argv, capsys)[0] == 0
    stolen = tmp_path / "stolen"
    (tmp_path / ".k.tmp").symlink_to(stolen)
    run([*argv, "--force"], capsys)
    assert not stolen.exists()
    assert not key.is_symlink()


@pytest.mark.parametrize("days", ["0", "-1", "3651", "99999", "ten", "1.5"])
def test_keygen_bad_days(tmp_path: Path, capsys: pytest.CaptureFixture[str], days: str) -> None:
    message = usage_error(["keygen", "--out-key", str(tmp_path / "k"), "--out-cert",
                           str(tmp_path / "c"), "--name", "n.example.test", "--days", days],
                          capsys)
    assert "--days" in message
    assert list(tmp_path.iterdir()) == []


def test_keygen_longest_validity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["keygen", "--out-key", str(tmp_path / "k"), "--out-cert", str(tmp_path / "c"),
                "--name", "n.example.test", "--days", str(crypto.MAX_CERTIFICATE_DAYS)],
               capsys)[0] == 0


def test_keygen_bad_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--name" in usage_error(["keygen", "--out-key", str(tmp_path / "k"), "--out-cert",
                                    str(tmp_path / "c"), "--name", ""], capsys)


def test_keygen_missing_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert "required" in usage_error(["keygen", "--out-cert", "c", "--name", "n"], capsys)
    assert "--out-cert and --name" in usage_error(["keygen", "--out-key", "k"], capsys)
    assert "drop --out-cert" in usage_error(
        ["keygen", "--perspectives", "--out-key", "k", "--out-cert", "c"], capsys
    )


def test_keygen_perspectives_and_the_notary_list_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    from notary.protocol.perspectives import parse_notary_list

    key = tmp_path / "perspectives.key"
    status, out, err = run(["keygen", "--perspectives", "--out-key", str(key)], capsys)
    assert (status, err) == (0, "")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    public_pem = out[out.index("-----BEGIN PUBLIC KEY-----"):]
    assert "exists" in usage_error(["keygen", "--perspectives", "--out-key", str(key)], capsys)
    config = write_config(tmp_path, *keypair, extra="")
    config.write_text(config.read_text() + f'\n[perspectives]\nkey_file = "{key}"\n')
    status, out, _ = run(["perspectives-entry", "--config", str(config),
                          "--host-port", "notary.example:8080"], capsys)
    assert status == 0
    (entry,) = parse_notary_list(out)
    assert (entry.host, entry.port) == ("notary.example", 8080)
    assert entry.public_key_pem.strip() == public_pem.strip()
    assert "host:port" in usage_error(["perspectives-entry", "--config", str(config),
                                       "--host-port", "nope"], capsys)
    (tmp_path / "bare").mkdir()
    bare = write_config(tmp_path / "bare", *keypair)
    assert "Perspectives is not served" in usage_error(
        ["perspectives-entry", "--config", str(bare), "--host-port", "n:8080"], capsys)


def test_keygen_unwritable_certificate_leaves_no_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "k"
    message = usage_error(["keygen", "--out-key", str(key), "--out-cert",
                           str(tmp_path / "no-dir" / "c"), "--name", "n.example.test"], capsys)
    assert "cannot write" in message
    assert not key.exists()


# -- bundle ----------------------------------------------------------------------


def test_bundle_with_the_v2_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    v2_key = tmp_path / "v2.key"
    status, out, err = run(["keygen", "--v2", "--out-key", str(v2_key)], capsys)
    assert (status, err) == (0, "") and "key id" in out
    out_file = tmp_path / "v2.notary"
    status, _, err = run(["bundle", "--name", "V2", "--location", LOCATION,
                          "--host", f"notary.example.test:443:80:{keypair[1]}",
                          "--v2-key", str(v2_key), "--out", str(out_file)], capsys)
    assert (status, err) == (0, "")
    raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(v2_key))
    assert parse_bundle(out_file.read_bytes()).hosts[0].v2_key_raw == raw
    status, out, _ = run(["bundle", "show", str(out_file)], capsys)
    assert status == 0 and "v2 key:" in out
    assert "not" in usage_error(["bundle", "--name", "V2", "--location", LOCATION,
                                 "--host", f"notary.example.test:443:80:{keypair[1]}",
                                 "--v2-key", str(keypair[0]), "--out", str(tmp_path / "x.notary")],
                                capsys).lower()


def test_bundle_pins_the_log_from_the_config_or_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    """`notary bundle --config` puts the notary's log in the bundle: its
    origin, the verifier key of the v2 key under it, and the witnesses of
    ``[log] witnesses`` (issue 30, item 11)."""
    from notary.protocol import tlog

    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(v2_key))
    witness = tlog.cosigner_key("w.example.test/witness", bytes(range(1, 33)))
    config = write_config(tmp_path, *keypair, extra=(
        f'[v2]\nkey_file = "{v2_key}"\n[log]\nenabled = true\n'
        'origin = "notary.example.test/v2/log"\n'
        f'witnesses = [{{ url = "https://w.example.test/v2/witness", key = "{witness}", '
        f'pin = "{"AB" * 20}" }}]\nmin_cosignatures = 1\n'
    ))
    host = f"notary.example.test:443:80:{keypair[1]}"
    made = tmp_path / "log.notary"
    status, _out, err = run(["bundle", "--name", "L", "--location", LOCATION, "--host", host,
                             "--config", str(config), "--out", str(made)], capsys)
    assert (status, err) == (0, "")
    bundle = parse_bundle(made.read_bytes())
    assert bundle.hosts[0].v2_key_raw == raw
    assert bundle.log is not None and bundle.log.origin == "notary.example.test/v2/log"
    assert bundle.log.key == tlog.verifier_key("notary.example.test/v2/log", raw)
    assert bundle.log.witnesses == (witness,)
    assert bundle.log.min_witnesses == 1  # [log] min_cosignatures: the operator's promise
    status, out, _err = run(["bundle", "show", str(made)], capsys)
    assert f"log:      notary.example.test/v2/log\n  key:    {bundle.log.key}\n" in out
    assert f"  witness: {witness}" in out and "cosignatures promised: 1 of 1" in out
    # Flags without a config; none: no log member, the bundle as before.
    flagged = tmp_path / "flags.notary"
    assert run(["bundle", "--name", "L", "--location", LOCATION, "--host", host,
                "--v2-key", str(v2_key), "--log-origin", "other.example.test/log",
                "--out", str(flagged)], capsys)[0] == 0
    pinned = parse_bundle(flagged.read_bytes()).log
    assert pinned is not None and pinned.origin == "other.example.test/log"
    assert pinned.witnesses == () and pinned.min_witnesses == 0
    plain = tmp_path / "plain.notary"
    assert run(["bundle", "--name", "L", "--location", LOCATION, "--host", host,
                "--v2-key", str(v2_key), "--out", str(plain)], capsys)[0] == 0
    assert "log" not in json.loads(plain.read_bytes())
    assert "not pinned" in run(["bundle", "show", str(plain)], capsys)[1]
    for argv, message in (
        (["--log-origin", "o.example.test/log"], "needs the v2 key"),
        (["--log-witness", witness], "--log-witness needs --log-origin"),
        (["--v2-key", str(v2_key), "--log-origin", "has space"], "log origin"),
        (["--v2-key", str(v2_key), "--log-origin", "o.example.test/log", "--log-witness",
          witness, "--log-min-witnesses", "2"], "--log-min-witnesses must be 0 to the 1"),
    ):
        assert message in usage_error(["bundle", "--name", "L", "--location", LOCATION,
                                       "--host", host, *argv, "--out", str(tmp_path / "x")],
                                      capsys)


def test_keys_shows_the_log_and_witness_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    from notary.protocol import tlog

    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(v2_key))
    witness = tlog.cosigner_key("w.example.test/witness", bytes(range(1, 33)))
    log_vkey = tlog.verifier_key("other.example.test/v2/log", bytes(range(2, 34)))
    config = write_config(tmp_path, *keypair, extra=(
        f'[v2]\nkey_file = "{v2_key}"\n[log]\nenabled = true\n'
        'origin = "notary.example.test/v2/log"\n'
        f'witnesses = [{{ url = "https://w.example.test/v2/witness", key = "{witness}", '
        f'pin = "{"AB" * 20}" }}]\nmin_cosignatures = 1\n'
        f'[witness]\nenabled = true\nname = "notary.example.test/witness"\n'
        f'logs = ["{log_vkey}"]\n'
    ))
    status, out, err = run(["keys", "--config", str(config)], capsys)
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"v2 key:      {crypto.ed25519_key_id(raw)} {base64.b64encode(raw).decode()}",
        "log:         notary.example.test/v2/log",
        f"log key:     {tlog.verifier_key('notary.example.test/v2/log', raw)}",
        f"log witness: {witness}",
        "cosignatures promised: 1 of 1",
        f"witness key: {tlog.cosigner_key('notary.example.test/witness', raw)}",
    ]
    bare = write_config(tmp_path, *keypair, extra=f'[v2]\nkey_file = "{v2_key}"\n')
    out = run(["keys", "--config", str(bare)], capsys)[1]
    assert "log:         off" in out and "witness:     off" in out
    none = write_config(tmp_path, *keypair)
    assert "no [v2] key_file" in usage_error(["keys", "--config", str(none)], capsys)


def test_bundle_create_then_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    _key, cert = keypair
    out_file = tmp_path / "example.notary"
    status, out, err = run([
        "bundle", "--name", "Example notary", "--location", LOCATION, "--region", "DE",
        "--host", f"notary.example.test:443:80:{cert}",
        "--host", f"[2001:db8::1]:4242:8080:{cert}",
        "--out", str(out_file),
    ], capsys)
    assert (status, err) == (0, "")
    assert str(out_file) in out
    bundle = parse_bundle(out_file.read_bytes())
    assert bundle.name == "Example notary"
    assert bundle.region == "DE"
    assert [(h.host, h.ssl_port, h.http_port) for h in bundle.hosts] == [
        ("notary.example.test", 443, 80), ("2001:db8::1", 4242, 8080)]
    assert json.loads(out_file.read_bytes())["version"] == 1

    pin = sha1_pin_of_pem(cert.read_text())
    status, out, err = run(["bundle", "show", str(out_file)], capsys)
    assert (status, err) == (0, "")
    assert "Example notary" in out
    assert LOCATION in out
    assert "DE" in out
    assert out.count(f"sha1:   {pin}") == 2
    assert re.search(r"notary\.example\.test ssl_port=443 http_port=80", out)


def test_bundle_show_the_real_bundle(capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "tests" / "vectors" / "convergence" / "thoughtcrime.notary"
    status, out, _ = run(["bundle", "show", str(path)], capsys)
    assert status == 0
    for host in json.loads(path.read_bytes())["hosts"]:
        assert sha1_pin_of_pem(host["certificate"]) in out


def test_bundle_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    out_file = tmp_path / "x.notary"
    out_file.write_text("keep me")
    argv = ["bundle", "--name", "n", "--location", LOCATION,
            "--host", f"n.example.test:443:80:{keypair[1]}", "--out", str(out_file)]
    assert "exists" in usage_error(argv, capsys)
    assert out_file.read_text() == "keep me"
    assert run([*argv, "--force"], capsys)[0] == 0
    assert parse_bundle(out_file.read_bytes()).name == "n"


@pytest.mark.parametrize(
    "spec",
    ["n.example.test:443:80", "n.example.test:443:{cert}", "n.example.test::80:{cert}",
     "n.example.test:443:80x:{cert}", "2001:db8::1:443:80:{cert}", "{cert}",
     "n.example.test:123456:80:{cert}"],
)
def test_bundle_bad_host_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path], spec: str
) -> None:
    message = usage_error(["bundle", "--name", "n", "--location", LOCATION,
                           "--host", spec.format(cert=keypair[1]),
                           "--out", str(tmp_path / "x.notary")], capsys)
    assert "--host" in message
    assert not (tmp_path / "x.notary").exists()


@pytest.mark.parametrize(("port", "field"), [("0", "ssl_port"), ("70000", "ssl_port")])
def test_bundle_bad_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path],
    port: str, field: str,
) -> None:
    message = usage_error(["bundle", "--name", "n", "--location", LOCATION,
                           "--host", f"n.example.test:{port}:80:{keypair[1]}",
                           "--out", str(tmp_path / "x.notary")], capsys)
    assert field in message


def test_bundle_missing_certificate_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.crt"
    message = usage_error(["bundle", "--name", "n", "--location", LOCATION,
                           "--host", f"n.example.test:443:80:{missing}",
                           "--out", str(tmp_path / "x.notary")], capsys)
    assert str(missing) in message


def test_bundle_certificate_file_is_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    message = usage_error(["bundle", "--name", "n", "--location", LOCATION,
                           "--host", f"n.example.test:443:80:{keypair[0]}",
                           "--out", str(tmp_path / "x.notary")], capsys)
    assert "PEM" in message


def test_bundle_binary_certificate_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "cert.der"
    binary.write_bytes(b"\x30\x82\xff\xfe" * 10)
    usage_error(["bundle", "--name", "n", "--location", LOCATION,
                 "--host", f"n.example.test:443:80:{binary}",
                 "--out", str(tmp_path / "x.notary")], capsys)


@pytest.mark.parametrize(
    "location",
    ["http://notary.example.test/example.notary", "https://notary.example.test/example.json",
     "notary.example.test", "https://[broken/x.notary"],
)
def test_bundle_bad_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path], location: str
) -> None:
    message = usage_error(["bundle", "--name", "n", "--location", location,
                           "--host", f"n.example.test:443:80:{keypair[1]}",
                           "--out", str(tmp_path / "x.notary")], capsys)
    assert "bundle_location" in message


def test_bundle_bad_region(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    assert "region" in usage_error(["bundle", "--name", "n", "--location", LOCATION,
                                    "--region", "Germany",
                                    "--host", f"n.example.test:443:80:{keypair[1]}",
                                    "--out", str(tmp_path / "x.notary")], capsys)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["bundle"], "--name, --location, --out"),
        (["bundle", "--name", "n", "--location", LOCATION, "--out", "x.notary"], "--host"),
        (["bundle", "show"], "file"),
    ],
)
def test_bundle_missing_arguments(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert expected in usage_error(argv, capsys)


def test_bundle_show_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "cannot read" in usage_error(["bundle", "show", str(tmp_path / "missing")], capsys)
    (tmp_path / "bad.notary").write_text("{}")
    assert "hosts" in usage_error(["bundle", "show", str(tmp_path / "bad.notary")], capsys)
    (tmp_path / "deep.notary").write_text("[" * 100_000)
    assert "JSON" in usage_error(["bundle", "show", str(tmp_path / "deep.notary")], capsys)


# -- the client's notary directory: bundle fetch, list; check ----------------------


def _bundle_file(directory: Path, file: str, name: str, cert: Path,
                 capsys: pytest.CaptureFixture[str]) -> Path:
    """A bundle named ``name`` pinning ``cert``, written by `notary bundle`."""
    path = directory / file
    assert run(["bundle", "--name", name, "--location", LOCATION,
                "--host", f"notary.example.test:443:80:{cert}", "--out", str(path)],
               capsys)[0] == 0
    return path


def _other_cert(directory: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    key, cert = directory / "other.key", directory / "other.crt"
    assert run(["keygen", "--out-key", str(key), "--out-cert", str(cert),
                "--name", "notary.example.test"], capsys)[0] == 0
    return cert


def test_bundle_fetch_refuses_other_pins_unless_replace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    """Issue 17 item 1: a bundle with other pins does not silently replace a
    stored one of the same name; with --replace, the old and new pins are
    shown."""
    old = _bundle_file(tmp_path, "old.notary", "Lab", keypair[1], capsys)
    new = _bundle_file(tmp_path, "new.notary", "Lab", _other_cert(tmp_path, capsys), capsys)
    old_pin = sha1_pin_of_pem(keypair[1].read_text())
    new_pin = sha1_pin_of_pem((tmp_path / "other.crt").read_text())
    directory = tmp_path / "notaries"
    status, out, _ = run(["bundle", "fetch", str(old), "--notaries", str(directory)], capsys)
    assert status == 0 and out.startswith("added 'Lab' (1 hosts): ")
    message = usage_error(["bundle", "fetch", str(new), "--notaries", str(directory)], capsys)
    assert f"Old pins: {old_pin}; new pins: {new_pin}" in message and "--replace" in message
    assert parse_bundle((directory / "lab.notary").read_bytes()).hosts[0].certificate_pem == (
        keypair[1].read_text())
    status, out, err = run(["bundle", "fetch", str(new), "--notaries", str(directory),
                            "--replace"], capsys)
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"replaced 'Lab' (1 hosts): {directory / 'lab.notary'}",
        f"  old pins: {old_pin}",
        f"  new pins: {new_pin}",
    ]
    status, out, _ = run(["bundle", "fetch", str(new), "--notaries", str(directory)], capsys)
    assert status == 0 and out.startswith("updated 'Lab' (1 hosts, same pins): ")


def test_bundle_fetch_gives_each_notary_its_own_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    """Issue 17 item 2: before, the second printed `added` and overwrote the
    first."""
    directory = tmp_path / "notaries"
    upper = _bundle_file(tmp_path, "a.notary", "LAB NOTARY", keypair[1], capsys)
    lower = _bundle_file(tmp_path, "b.notary", "Lab notary", _other_cert(tmp_path, capsys), capsys)
    assert run(["bundle", "fetch", str(upper), "--notaries", str(directory)], capsys)[0] == 0
    status, out, err = run(["bundle", "fetch", str(lower), "--notaries", str(directory)], capsys)
    assert (status, err) == (0, "")
    assert out == (f"added 'Lab notary' (1 hosts): {directory / 'lab-notary-2.notary'} "
                   "(lab-notary.notary holds 'LAB NOTARY': this one gets its own file)\n")
    status, out, _ = run(["bundle", "list", "--notaries", str(directory)], capsys)
    assert status == 0
    assert [line.split("  ")[0] for line in out.splitlines()] == ["LAB NOTARY", "Lab notary"]


def test_bundle_fetch_pin_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    local = _bundle_file(tmp_path, "x.notary", "X", keypair[1], capsys)
    pin = sha1_pin_of_pem(keypair[1].read_text())
    assert "local file" in usage_error(
        ["bundle", "fetch", str(local), "--pin", pin, "--notaries", str(tmp_path / "d")], capsys)
    assert "--pin" in usage_error(
        ["bundle", "fetch", "https://127.0.0.1:1/x.notary", "--pin", "zz"], capsys)
    assert not (tmp_path / "d").exists()


def test_bundle_list_shows_a_name_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    evil = _bundle_file(tmp_path, "e.notary", "Evil\nnotary\x1b[2J", keypair[1], capsys)
    directory = tmp_path / "notaries"
    status, out, _ = run(["bundle", "fetch", str(evil), "--notaries", str(directory)], capsys)
    assert status == 0 and "\x1b" not in out and len(out.splitlines()) == 1
    status, out, _ = run(["bundle", "list", "--notaries", str(directory)], capsys)
    assert status == 0 and out.startswith("Evil?notary?[2J  [") and len(out.splitlines()) == 1


def test_check_exits_1_only_for_a_rejection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure of the check itself is exit 5 on one line, never a
    traceback and exit 1 (which means "rejected by the vote")."""
    from notary.client import check as client

    bundle = _bundle_file(tmp_path, "x.notary", "X", keypair[1], capsys)
    fingerprint = ":".join(["AB"] * 20)

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(client, "check", broken)
    status, out, err = run(["check", "127.0.0.1:443", "--fingerprint", fingerprint,
                            "--notary", str(bundle), "--bounce", "off"], capsys)
    assert (status, out) == (5, "")
    assert err == "notary: the check failed: something?broke\n"
    # --bounce takes a bundle file (as documented), never fetches a URL.
    assert "cannot read bundle" in usage_error(
        ["check", "127.0.0.1:443", "--fingerprint", fingerprint, "--notary", str(bundle),
         "--bounce", "https://127.0.0.1:1/relay.notary"], capsys)


# -- db --------------------------------------------------------------------------


def test_db_init_twice_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "n.db"
    for _ in range(2):
        status, out, err = run(["db", "init", "--db", str(db)], capsys)
        assert (status, err) == (0, "")
        assert f"schema version {SCHEMA_VERSION}" in out
    status, out, _ = run(["db", "stats", "--db", str(db)], capsys)
    assert status == 0
    assert re.search(r"^targets:\s+0$", out, re.M)
    assert re.search(rf"^schema version:\s+{SCHEMA_VERSION}$", out, re.M)

    with Store(db) as store:
        store.record([
            probe_result("a.example.test", at=1),
            probe_result("a.example.test", cert="b.example.test", at=2),
            probe_result("b.example.test", at=3),
        ])
    status, out, _ = run(["db", "stats", "--db", str(db)], capsys)
    assert status == 0
    numbers = dict(re.findall(r"^([a-z ]+):\s+(\d+)$", out, re.M))
    assert numbers["targets"] == "2"
    assert numbers["certificates"] == "2"
    assert numbers["observations"] == "3"
    assert int(numbers["file bytes"]) > 0


def test_db_from_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "n.toml"
    config.write_text('[server]\nkey_file = "k"\ncert_file = "c"\ndb_file = "data.db"\n')
    assert run(["db", "init", "--config", str(config)], capsys)[0] == 0
    assert (tmp_path / "conf" / "data.db").exists()
    assert run(["db", "stats", "--config", str(config)], capsys)[0] == 0


def test_db_stats_of_a_missing_database_is_a_runtime_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["db", "stats", "--db", str(tmp_path / "missing.db")], capsys)
    assert status == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("notary: ") and "does not exist" in err
    assert not (tmp_path / "missing.db").exists()


def test_db_stats_of_a_corrupt_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"\x00garbage" * 1000)
    status, _, err = run(["db", "stats", "--db", str(bad)], capsys)
    assert status == 1
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["db", "stats"], "--db"), (["db", "frob", "--db", "x"], "invalid choice"), (["db"], "")],
)
def test_db_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    assert expected in usage_error(argv, capsys)


def test_db_with_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "n.toml"
    config.write_text("[server\n")
    assert "TOML" in usage_error(["db", "init", "--config", str(config)], capsys)


def _file_modes(db: Path) -> dict[str, int]:
    return {suffix or "db": stat.S_IMODE(os.stat(f"{db}{suffix}").st_mode)
            for suffix in ("", "-wal", "-shm") if os.path.exists(f"{db}{suffix}")}


def test_db_init_makes_the_files_owner_only_and_fixes_existing_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 17 item 11: the database was created 0644."""
    previous = os.umask(0o022)
    try:
        db = tmp_path / "n.db"
        status, out, _ = run(["db", "init", "--db", str(db)], capsys)
        assert status == 0 and out.endswith(", mode 0600\n")
        assert _file_modes(db) == {"db": 0o600}
        os.chmod(db, 0o644)
        assert run(["db", "init", "--db", str(db)], capsys)[0] == 0
        assert _file_modes(db) == {"db": 0o600}
        # A service group ([node] group) may read it.
        config = tmp_path / "n.toml"
        config.write_text('[server]\nkey_file = "k"\ncert_file = "c"\ndb_file = "n.db"\n'
                          '[node]\nuser = "notary"\ngroup = "notary"\n')
        status, out, _ = run(["db", "init", "--config", str(config)], capsys)
        assert status == 0 and out.endswith(", mode 0640\n")
        assert _file_modes(db) == {"db": 0o640}
    finally:
        os.umask(previous)


def test_db_compact_applies_the_limits_and_the_retention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 17 item 10: `db compact` removes what the [store] settings do
    not keep, vacuums, and says what went."""
    db = tmp_path / "n.db"
    with Store(db) as store:
        store.record([probe_result(f"h{i % 3}.example.test", cert=f"c{i}.example.test",
                                   at=1_700_000_000 + i) for i in range(12)])
        store.note_asked([("h0.example.test", 443)], int(time.time()))
    config = tmp_path / "n.toml"
    config.write_text('[server]\nkey_file = "k"\ncert_file = "c"\ndb_file = "n.db"\n'
                      "[store]\nmax_certificates_per_target = 2\n")
    status, out, err = run(["db", "compact", "--config", str(config)], capsys)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    # h1 and h2 were last asked about in 2023 (older than the 90-day
    # retention): gone; h0 keeps its newest two certificates.
    assert lines[0] == (f"{db}: 2 targets, 10 observations, 0 runs, 10 certificates removed; "
                        "0 certificates' DER dropped")
    assert re.fullmatch(r"file bytes: \d+ -> \d+", lines[1])
    with Store(db) as store:
        assert store.statistics().observations == 2
        assert [o.last_seen for o in store.load_timeline(
            Target("h0.example.test", 443)).observations] == [1_700_000_009, 1_700_000_006]


def test_db_compact_of_a_missing_database_is_a_runtime_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(["db", "compact", "--db", str(tmp_path / "missing.db")], capsys)
    assert (status, out) == (1, "")
    assert "does not exist" in err and err.count("\n") == 1
    assert not (tmp_path / "missing.db").exists()


# -- serve -----------------------------------------------------------------------


def test_serve_check_config_good(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path, *keypair)
    status, out, err = run(["serve", "--config", str(config), "--check-config"], capsys)
    assert (status, err) == (0, "")
    assert "OK" in out


def test_serve_check_config_from_flags_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    key, cert = keypair
    status, _, err = run(["serve", "--check-config", "--key", str(key), "--cert", str(cert),
                          "--db", str(tmp_path / "n.db"), "--api", "127.0.0.1:0",
                          "--api", "[::1]:0", "--allow-target", "127.0.0.0/8",
                          "--log-level", "debug"], capsys)
    assert (status, err) == (0, "")


def test_serve_relay_flag_replaces_the_relay_listeners(
    tmp_path: Path, keypair: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path, *keypair)
    args = build_parser().parse_args(
        ["serve", "--config", str(config), "--relay", "127.0.0.1:8280", "--relay", "[::1]:0"]
    )
    assert config_from_args(args).relay.listen == (
        Endpoint("127.0.0.1", 8280), Endpoint("::1", 0)
    )
    args = build_parser().parse_args(["serve", "--config", str(config)])
    assert config_from_args(args).relay.listen == (Endpoint("127.0.0.1", 0),)
    assert config_from_args(args).server.plain_api == ()
    args = build_parser().parse_args(
        ["serve", "--config", str(config), "--plain-api", "127.0.0.1:8080"]
    )
    assert config_from_args(args).server.plain_api == (Endpoint("127.0.0.1", 8080),)


def test_serve_check_config_reads_the_trusted_bundles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    (tmp_path / "trusted").mkdir()
    (tmp_path / "trusted" / "broken.notary").write_text("[]")
    config = write_config(tmp_path, *keypair, extra='[relay]\nbundles = ["trusted"]\n')
    message = usage_error(["serve", "--config", str(config), "--check-config"], capsys)
    assert "broken.notary" in message


def test_serve_check_config_mismatched_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    other_key, other_cert = tmp_path / "other.key", tmp_path / "other.crt"
    assert run(["keygen", "--out-key", str(other_key), "--out-cert", str(other_cert),
                "--name", "other.example.test"], capsys)[0] == 0
    config = write_config(tmp_path, other_key, keypair[1])
    message = usage_error(["serve", "--config", str(config), "--check-config"], capsys)
    assert "does not match" in message


def test_serve_check_config_flags_override_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path, tmp_path / "missing.key", keypair[1])
    assert "missing.key" in usage_error(["serve", "--config", str(config), "--check-config"],
                                        capsys)
    status, _, _ = run(["serve", "--config", str(config), "--check-config",
                        "--key", str(keypair[0])], capsys)
    assert status == 0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--check-config", "--bogus"], "unrecognized arguments: --bogus"),
        (["serve", "--check-config"], "--config"),
        (["serve", "--check-config", "--config", "/nonexistent/notary.toml"], "cannot read"),
        (["serve", "--check-config", "--key", "k", "--cert", "c", "--db", "d", "--api", "nope"],
         "--api"),
        (["serve", "--check-config", "--log-level", "loud"], "--log-level"),
        (["serve", "--check-config", "--key", "k", "--cert", "c", "--db", "d",
          "--allow-target", "10.0.0.0/40"], "allow_targets"),
        (["serve", "--check-config", "--key", "/nonexistent.key", "--cert", "c", "--db", "d"],
         "/nonexistent.key"),
    ],
)
def test_serve_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert expected in usage_error(argv, capsys)


def test_serve_check_config_with_a_bad_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path, keypair[1], keypair[1])  # a certificate is not a key
    assert "private key" in usage_error(["serve", "--config", str(config), "--check-config"],
                                        capsys)


def test_serve_start_up_error_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    """An error raised inside the server's nurseries (here: the bundle file
    is missing) is reported on one line, not as an ExceptionGroup traceback."""
    config = write_config(tmp_path, *keypair)
    message = usage_error(["serve", "--config", str(config), "--log-level", "error",
                           "--bundle", str(tmp_path / "missing.notary")], capsys)
    assert "missing.notary" in message


def test_serve_port_in_use_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = write_config(tmp_path, *keypair)
        message = usage_error(["serve", "--config", str(config), "--log-level", "error",
                               "--api", f"127.0.0.1:{port}"], capsys)
    assert f"127.0.0.1:{port}" in message


# -- top level -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [([], "command"), (["frobnicate"], "invalid choice"), (["--bogus"], "")],
)
def test_top_level_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert expected in usage_error(argv, capsys)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("notary ")


# -- dev-init --------------------------------------------------------------------


def test_dev_init_twice_keeps_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "var"
    status, out, err = run(["dev-init", "--dir", str(directory)], capsys)
    assert (status, err) == (0, "")
    key_bytes = (directory / "notary.key").read_bytes()
    cert_bytes = (directory / "notary.crt").read_bytes()
    bundle_bytes = (directory / "local.notary").read_bytes()
    pin = sha1_pin_of_pem(cert_bytes.decode())
    assert pin in out
    assert stat.S_IMODE((directory / "notary.key").stat().st_mode) == 0o600

    status, out, err = run(["dev-init", "--dir", str(directory)], capsys)
    assert (status, err) == (0, "")
    assert "made" not in out
    assert pin in out
    assert (directory / "notary.key").read_bytes() == key_bytes
    assert (directory / "notary.crt").read_bytes() == cert_bytes
    assert (directory / "local.notary").read_bytes() == bundle_bytes

    config = load_config(directory / "notary.toml")
    assert config.server.key_file == directory / "notary.key"
    assert config.server.cert_file == directory / "notary.crt"
    assert config.server.db_file == directory / "notary.db"
    assert config.server.bundle_file == directory / "local.notary"
    assert [e.host for e in config.server.api] == ["127.0.0.1", "127.0.0.1"]
    assert [e.port for e in config.server.api] == [8443, 4242]
    bundle = parse_bundle(bundle_bytes)
    assert bundle.hosts[0].sha1_pin == pin
    assert bundle.hosts[0].ssl_port == 8443
    # The relay is on, on loopback, trusting the local bundle, dialling 4242.
    relay = config.relay
    assert relay.listen == (Endpoint("127.0.0.1", bundle.hosts[0].http_port),)
    assert (relay.destinations, relay.bundles) == ("bundles", (directory / "local.notary",))
    assert relay.dial_port == 4242
    # The v2 statements go to a log named after the notary's address, and
    # the bundle pins it (origin and key: the v2 key under that name).
    assert config.log.enabled and config.log.origin == "127.0.0.1:8443/v2/log"
    assert bundle.log is not None and bundle.log.origin == config.log.origin
    assert bundle.log.public_raw == bundle.hosts[0].v2_key_raw
    with Store(config.server.db_file, create=False) as store:
        assert store.schema_version() == SCHEMA_VERSION
    status, out, _ = run(["serve", "--config", str(directory / "notary.toml"),
                          "--check-config"], capsys)
    assert status == 0


def _run_with_closed_stdout(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """``notary ARGV`` whose stdout is a pipe nobody reads (``| head -0``)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "notary", *argv], stdout=write_end, stderr=subprocess.PIPE,
            timeout=120, check=False,
        )
    finally:
        os.close(write_end)


def test_dev_init_makes_everything_when_its_reader_leaves(tmp_path: Path) -> None:
    """``notary dev-init | head`` died on the broken pipe at its first line
    and left no notary.toml (issue 30, item 19): the report is advisory."""
    directory = tmp_path / "var"
    done = _run_with_closed_stdout(["dev-init", "--dir", str(directory)])
    assert (done.returncode, done.stderr) == (0, b"")
    assert load_config(directory / "notary.toml").v2.key_file is not None
    parse_bundle((directory / "local.notary").read_bytes())


def test_a_command_whose_reader_leaves_stops_without_a_traceback(tmp_path: Path) -> None:
    done = _run_with_closed_stdout(["keygen", "--v2", "--out-key", str(tmp_path / "v2.key")])
    assert done.returncode == 128 + 13  # as a shell reports a SIGPIPE
    assert done.stderr == b""


def test_dev_init_ports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "dev"
    assert run(["dev-init", "--dir", str(directory), "--api-port", "9443",
                "--relay-api-port", "9242"], capsys)[0] == 0
    config = load_config(directory / "notary.toml")
    assert [e.port for e in config.server.api] == [9443, 9242]
    assert config.relay.dial_port == 9242  # clients CONNECT to 4242; it maps there
    assert parse_bundle((directory / "local.notary").read_bytes()).bundle_location == (
        "https://127.0.0.1:9443/local.notary"
    )


def test_dev_init_remakes_a_missing_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "dev"
    assert run(["dev-init", "--dir", str(directory)], capsys)[0] == 0
    (directory / "notary.crt").unlink()
    assert run(["dev-init", "--dir", str(directory)], capsys)[0] == 0
    key = crypto.load_private_key(directory / "notary.key")
    cert = crypto.load_certificate(directory / "notary.crt")
    crypto.check_key_matches_certificate(key, cert)
    bundle = parse_bundle((directory / "local.notary").read_bytes())
    assert bundle.hosts[0].sha1_pin == sha1_pin_of_pem((directory / "notary.crt").read_text())


@pytest.mark.parametrize(
    "argv",
    [["--api-port", "0"], ["--api-port", "99999"], ["--relay-api-port", "-1"],
     ["--api-port", "4242"], ["--api-port", "x"]],
)
def test_dev_init_bad_ports(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            argv: list[str]) -> None:
    directory = tmp_path / "dev"
    assert "port" in usage_error(["dev-init", "--dir", str(directory), *argv], capsys)
    assert not (directory / "notary.key").exists()


def test_dev_init_into_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert str(blocker) in usage_error(["dev-init", "--dir", str(blocker)], capsys)


# -- the real process ------------------------------------------------------------


def test_python_m_notary_keygen_and_usage_errors(tmp_path: Path) -> None:
    result = python_m_notary("keygen", "--out-key", "k.pem", "--out-cert", "c.pem",
                             "--name", "notary.example.test", "--days", "7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert stat.S_IMODE((tmp_path / "k.pem").stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((tmp_path / "c.pem").read_bytes())
    validity = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=6, hours=23) < validity <= datetime.timedelta(days=7)

    for argv in (
        ["keygen", "--out-key", "k.pem", "--out-cert", "c.pem", "--name", "n"],
        ["keygen", "--out-key", "x.pem", "--out-cert", "y.pem", "--name", "n", "--days", "0"],
        ["keygen", "--out-key", "x.pem", "--out-cert", "y.pem", "--name", "n",
         "--days", "99999"],
        ["serve", "--check-config", "--no-such-flag"],
        ["bundle", "--name", "n", "--location", "http://x.example/n.notary",
         "--host", "x.example:443:80:c.pem", "--out", "n.notary"],
        ["bundle", "--name", "n", "--location", LOCATION, "--host", "x.example:443:c.pem",
         "--out", "n.notary"],
        ["dev-init", "--dir", "c.pem"],
        [],
    ):
        result = python_m_notary(*argv, cwd=tmp_path)
        assert result.returncode == 2, (argv, result.stderr)
        assert "Traceback" not in result.stderr
        assert len(result.stderr.splitlines()) == 1, (argv, result.stderr)
        assert result.stderr.startswith("notary: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pem", "k.pem"]


def test_python_m_notary_dev_init_and_check_config(tmp_path: Path) -> None:
    result = python_m_notary("dev-init", "--dir", "var", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    result = python_m_notary("serve", "--config", "var/notary.toml", "--check-config",
                             cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    result = python_m_notary("db", "stats", "--config", "var/notary.toml", cwd=tmp_path)
    assert result.returncode == 0
    assert "observations:   0" in result.stdout


def test_dev_init_rewrites_its_own_config_from_before_the_relay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from notary.node.devsetup import CONFIG_HEADER

    directory = tmp_path / "var"
    assert run(["dev-init", "--dir", str(directory)], capsys)[0] == 0
    config_path = directory / "notary.toml"
    old = config_path.read_text().split("\n[relay]\n")[0]
    config_path.write_text(old)
    assert load_config(config_path).relay.listen == (Endpoint("0.0.0.0", 80),)
    assert run(["dev-init", "--dir", str(directory)], capsys)[0] == 0
    assert load_config(config_path).relay.listen == (Endpoint("127.0.0.1", 8280),)
    # A config the operator wrote is never touched.
    config_path.write_text(old.replace(CONFIG_HEADER, "# mine"))
    assert run(["dev-init", "--dir", str(directory)], capsys)[0] == 0
    assert config_path.read_text().startswith("# mine")


def test_check_config_accepts_dane_and_refuses_an_untrusted_resolver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keypair: tuple[Path, Path]
) -> None:
    config = write_config(tmp_path, *keypair, extra='[verify]\nbackends = ["dane"]\n')
    assert run(["serve", "--config", str(config), "--check-config"], capsys)[0] == 0
    config = write_config(
        tmp_path, *keypair,
        extra='[verify]\nbackends = ["dane", "perspective"]\n[dns]\nresolvers = ["192.0.2.53:53"]\n',
    )
    message = usage_error(["serve", "--config", str(config), "--check-config"], capsys)
    assert "neither loopback nor in [dns] trusted" in message
