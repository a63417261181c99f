"""DANE served end to end (issue 20): a notary whose ``[verify] backends``
include DANE, its names resolved and its TLSA records validated by a real
``unbound`` in front of a real ``nsd`` serving a zone signed in the test
(``tests.support.dnssec``, loopback only), probing TLS sites on 127.0.0.1.
Each DANE outcome as Convergence, v2 and the web page answer it, under
DANE alone and under "DANE, then perspective"."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from notary.config import Endpoint
from notary.protocol.convergence import format_fingerprint
from notary.state import crypto
from tests.support.chains import ee_record
from tests.support.dane_notaries import dane_notary, dane_sections
from tests.support.dnssec import INSECURE_ZONE, DnssecStack, dnssec_stack
from tests.support.metrics import value
from tests.support.notaries import NotaryUnderTest, legacy_query, open_notary, send_raw
from tests.support.tls_targets import TLSTarget, open_tls_target
from tests.support.v2_queries import ask_v2

MATCH, TA, MISMATCH, PLAIN = "match.test", "ta.test", "mismatch.test", "plain.test"
UNSIGNED = f"www.{INSECURE_ZONE.rstrip('.')}"
OUTSIDE = "outside.test"  # its A record is outside allow_targets: never connected to
SITES = (MATCH, TA, MISMATCH, PLAIN, UNSIGNED)


def zone_for(site: TLSTarget) -> tuple[list, list]:
    """The signed root's records and the unsigned zone's, for ``site``'s
    names on its port."""
    port = site.port
    other = hashlib.sha256(b"another key").hexdigest()
    intermediate = site.chain_der(TA)[1]
    signed = [
        *((f"{name}.", "A", site.host) for name in (MATCH, TA, MISMATCH, PLAIN)),
        (f"{OUTSIDE}.", "A", "192.0.2.1"),
        (f"_{port}._tcp.{MATCH}.", "TLSA", ee_record(site.leaf_der(MATCH))),
        (f"_{port}._tcp.{TA}.", "TLSA", f"2 0 1 {hashlib.sha256(intermediate).hexdigest()}"),
        (f"_{port}._tcp.{MISMATCH}.", "TLSA", f"3 1 1 {other}"),
        (f"_{port}._tcp.{OUTSIDE}.", "TLSA", ee_record(site.leaf_der(MATCH))),
    ]
    unsigned = [
        (f"{UNSIGNED}.", "A", site.host),
        (f"_{port}._tcp.{UNSIGNED}.", "TLSA", ee_record(site.leaf_der(UNSIGNED))),
    ]
    return signed, unsigned


@contextmanager
def sites_stack(site: TLSTarget, **options: Any) -> Iterator[DnssecStack]:
    signed, unsigned = zone_for(site)
    with dnssec_stack(signed, unsigned=unsigned, **options) as stack:
        yield stack


async def ask(notary: NotaryUnderTest, site: TLSTarget, name: str, der: bytes | None):
    fingerprint = format_fingerprint(hashlib.sha1(der).digest()) if der is not None else None
    return await legacy_query(notary.port, f"{name}+{site.port}", fingerprint)


async def test_dane_alone_answers_each_outcome(tmp_path: Path) -> None:
    async with open_tls_target(names=SITES) as site:
        with sites_stack(site) as stack:
            async with dane_notary(tmp_path, stack.resolver, ("dane",)) as notary:
                leaf = site.leaf_der
                # A DANE-EE match: the certificate DANE vouches for is 200,
                # another one is 409 (the body is still the signed list).
                assert (await ask(notary, site, MATCH, leaf(MATCH))).status == 200
                assert (await ask(notary, site, MATCH, leaf(PLAIN))).status == 409
                assert (await ask(notary, site, MATCH, None)).status == 200
                # A DANE-TA (2 0 1) record on the intermediate the site sends.
                assert (await ask(notary, site, TA, leaf(TA))).status == 200
                # Secure records that vouch for nothing the site sends.
                mismatch = await ask(notary, site, MISMATCH, leaf(MISMATCH))
                assert mismatch.status == 409 and b"fingerprintList" in mismatch.body
                # No TLSA (proven absent) and an unsigned zone: inconclusive.
                for name in (PLAIN, UNSIGNED):
                    answer = await ask(notary, site, name, leaf(name))
                    assert answer.status == 303, name
                    assert b"inconclusive" in answer.body
                # A name whose address the policy refuses is refused as
                # before DANE: no connection, whatever its TLSA records say.
                assert (await ask(notary, site, OUTSIDE, leaf(MATCH))).status == 403

                # v2: the verdict, and the evidence signed in the statement.
                found = await ask_v2(notary, site, MATCH, leaf(MATCH))
                assert found["verdict"] == "match"
                evidence = found["statement"]["verification"]
                assert evidence["backend"] == "dane"
                dane = evidence["dane"]
                assert dane["outcome"] == "match" and dane["dnssec"] == "secure"
                assert dane["tlsa"] == [ee_record(leaf(MATCH))] and dane["matched"] == 0
                assert dane["sha256"] == hashlib.sha256(leaf(MATCH)).hexdigest()
                assert "judged" not in dane  # one certificate: as before issue 31
                assert abs(dane["checked_at"] - notary.clock()) < 60
                assert (await ask_v2(notary, site, MISMATCH, leaf(MISMATCH)))["verdict"] == (
                    "mismatch")
                plain = await ask_v2(notary, site, PLAIN, leaf(PLAIN))
                assert plain["verdict"] == "unknown"
                assert plain["statement"]["verification"]["dane"]["dnssec"] == "secure-denial"
                unsigned = await ask_v2(notary, site, UNSIGNED, leaf(UNSIGNED))
                assert unsigned["statement"]["verification"]["dane"]["outcome"] == "insecure"

                # Each check is counted by outcome on the admin listener.
                metrics = notary.running.metrics
                assert metrics is not None
                text = (await metrics.render()).decode()
    for outcome in ("match", "mismatch", "no-tlsa", "insecure"):
        assert value(text, "notary_dane_checks_total", outcome=outcome) >= 1, outcome
    assert value(text, "notary_dane_checks_total", outcome="bogus") == 0


async def test_dane_then_perspective_lets_the_perspective_decide_without_tlsa(
    tmp_path: Path,
) -> None:
    async with open_tls_target(names=SITES) as site:
        with sites_stack(site) as stack:
            async with dane_notary(tmp_path, stack.resolver, ("dane", "perspective")) as notary:
                leaf = site.leaf_der
                assert (await ask(notary, site, MATCH, leaf(MATCH))).status == 200
                assert (await ask(notary, site, MISMATCH, leaf(MISMATCH))).status == 409
                # No TLSA, unsigned zone: the network perspective vouches for
                # what the notary sees, and says so in its statement.
                for name in (PLAIN, UNSIGNED):
                    assert (await ask(notary, site, name, leaf(name))).status == 200, name
                found = await ask_v2(notary, site, PLAIN, leaf(PLAIN))
                assert found["verdict"] == "match"
                assert found["statement"]["verification"]["backend"] == "perspective"
                assert found["statement"]["verification"]["dane"]["outcome"] == "no-tlsa"
                # The web page shows the evidence.
                page = await send_raw(
                    notary.port, f"GET /site/{MATCH}+{site.port} HTTP/1.0\r\n\r\n".encode())
                assert page.status == 200 and b"DANE" in page.body


async def test_bogus_dnssec_is_never_a_match_in_either_mode(tmp_path: Path) -> None:
    async with open_tls_target(names=SITES) as site:
        with sites_stack(site, expired=True) as stack:
            for number, backends in enumerate((("dane",), ("dane", "perspective"))):
                async with dane_notary(tmp_path, stack.resolver, backends,
                                       name=f"n{number}") as notary:
                    # The names do not resolve either (the same zone is bogus):
                    # the probe fails, and nothing is vouched for. The failure
                    # is counted and the answers say why (issue 30, item 13).
                    answer = await ask(notary, site, MATCH, site.leaf_der(MATCH))
                    assert answer.status == 503, backends
                    assert b"failed DNSSEC validation" in answer.body, backends
                    found = await ask_v2(notary, site, MATCH, site.leaf_der(MATCH))
                    assert found["verdict"] == "unreachable"
                    dane = found["statement"]["verification"]["dane"]
                    assert (dane["outcome"], dane["dnssec"]) == ("bogus", "bogus")
                    metrics = notary.running.metrics
                    assert metrics is not None
                    text = (await metrics.render()).decode()
                    assert value(text, "notary_dane_checks_total", outcome="bogus") == 1


async def test_a_silent_resolver_is_a_503_within_the_deadline(tmp_path: Path) -> None:
    """The names resolve (a static map), the TLSA lookup meets a resolver
    that never answers: 503 once ``[dns] timeout_s`` passed, not a hang."""
    from tests.support.tls_targets import static_resolver

    async with open_tls_target(names=SITES) as site:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
            silent.bind(("127.0.0.1", 0))
            settings = dane_sections(silent.getsockname(), ("dane", "perspective"))
            async with open_notary(
                tmp_path / "n", resolver=static_resolver({MATCH: [site.host]}), **settings,
            ) as notary:
                started = trio.current_time()
                answer = await ask(notary, site, MATCH, site.leaf_der(MATCH))
                elapsed = trio.current_time() - started
                assert answer.status == 503 and b"TLSA" in answer.body
                assert elapsed < 20  # 1 s asked; generous for a loaded machine
                # Cached for [verify] dane_failure_reuse_s: asked again, the
                # same answer at once, without another lookup.
                assert (await ask(notary, site, MATCH, site.leaf_der(MATCH))).status == 503


async def test_the_tlsa_ttl_bounds_how_long_a_verdict_is_reused(tmp_path: Path) -> None:
    """A verdict is reused until the records' TTL (300 s in the zone) runs
    out, then the TLSA records are checked again with a new probe."""
    async with open_tls_target(names=SITES) as site:
        with sites_stack(site) as stack:
            async with dane_notary(tmp_path, stack.resolver, ("dane",)) as notary:
                leaf = site.leaf_der(MATCH)
                assert (await ask(notary, site, MATCH, leaf)).status == 200
                first = site.accepted
                notary.clock.advance(100)
                assert (await ask(notary, site, MATCH, leaf)).status == 200
                assert site.accepted == first  # reused: no probe
                notary.clock.advance(250)  # past the TTL
                assert (await ask(notary, site, MATCH, leaf)).status == 200
                assert site.accepted > first  # probed and checked again
                found = await ask_v2(notary, site, MATCH, leaf)
                dane = found["statement"]["verification"]["dane"]
                assert dane["checked_at"] >= int(notary.clock()) - 60


@pytest.mark.parametrize("backends", [("perspective",)])
async def test_a_perspective_notary_signs_no_verification(
    tmp_path: Path, backends: tuple[str, ...]
) -> None:
    """Statements of a notary without DANE are byte for byte as before."""
    async with open_tls_target(names=[MATCH]) as site:
        key_path = tmp_path / "v2.key"
        crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
        async with open_notary(tmp_path / "n", names={MATCH: [site.host]},
                               v2={"key_file": key_path}) as notary:
            found = await ask_v2(notary, site, MATCH, site.leaf_der(MATCH))
            assert found["verdict"] == "match" and "verification" not in found["statement"]


async def test_check_v2_shows_that_dane_vouched(tmp_path: Path) -> None:
    """``notary check --v2`` against a real DANE notary: the signed evidence
    verifies, the report names the backend per notary (table and JSON), and a
    DANE-only notary's "no TLSA" stands aside instead of voting."""
    from notary.cli.report import report_json
    from notary.client import check as client
    from notary.model.targets import Target
    from notary.protocol.voting import Verdict
    from tests.support.client_world import bundle_of
    from tests.support.tls_targets import static_resolver

    async with open_tls_target(names=SITES) as site:
        with sites_stack(site) as stack:
            async with (
                dane_notary(tmp_path, stack.resolver, ("dane",), name="alone") as alone,
                dane_notary(tmp_path, stack.resolver, ("dane", "perspective"),
                            name="both") as both,
            ):
                bundles = [bundle_of(alone, "Alone"), bundle_of(both, "Both")]

                async def check(name: str) -> client.CheckReport:
                    return await client.check(
                        Target(name, site.port), bundles, relay=None, timeout_s=10.0,
                        use_v2=True, quorum=2, resolver=static_resolver({name: [site.host]}),
                    )

                matched, plain = await check(MATCH), await check(PLAIN)
    rows = {a.notary: a for a in matched.answers}
    assert {n: (a.verdict, a.backend) for n, a in rows.items()} == {
        "Alone": (Verdict.SUCCESS, "dane"), "Both": (Verdict.SUCCESS, "dane")}
    assert rows["Alone"].detail.startswith("DANE: match, TLSA 3 1 1 ")
    assert [n["backend"] for n in json.loads(report_json(matched))["notaries"]] == [
        "dane", "dane"]
    rows = {a.notary: a for a in plain.answers}
    assert rows["Alone"].verdict is Verdict.INCONCLUSIVE
    assert rows["Alone"].detail.startswith("unknown; DANE: no TLSA")
    assert (rows["Both"].verdict, rows["Both"].backend) == (Verdict.SUCCESS, "perspective")
    assert rows["Both"].detail == "DANE: no TLSA; network perspective decided"


async def start_error(tmp_path: Path, resolver: tuple[str, int], **sections: Any) -> str:
    """The one-line error a DANE notary on ``resolver`` refuses to start
    with (the test fails if it starts)."""
    from notary.errors import UsageError

    try:
        async with dane_notary(tmp_path, resolver, ("dane", "perspective"), **sections):
            pass
    except BaseException as raised:  # an exception group around it, from the nurseries
        error: BaseException = raised
        while isinstance(error, BaseExceptionGroup):
            (error,) = error.exceptions
        assert isinstance(error, UsageError), raised
        return str(error)
    raise AssertionError("the notary started")


async def test_a_resolver_that_does_not_validate_is_refused_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """nsd answers the zone without the AD bit, as a resolver that does not
    validate would: ``notary serve`` refuses to start, naming it, unless
    ``[dns] require_validation = false`` (then a warning in the log and in
    ``/readyz``'s body, which stays 200). The validating unbound passes."""
    from tests.support.http_client import http_get

    with dnssec_stack([]) as stack:
        where = f"{stack.authority[0]}:{stack.authority[1]}"
        message = await start_error(tmp_path, stack.authority)
        assert message.startswith(f"[dns] resolver {where} does not validate DNSSEC")
        assert "require_validation = false" in message
        async with dane_notary(
            tmp_path, stack.authority, ("dane", "perspective"), name="lax",
            dns={"resolvers": (Endpoint(*stack.authority),), "timeout_s": 1.0,
                 "require_validation": False},
        ) as notary:
            status, _, body = await http_get(notary.running.admin[0].port, "/readyz")
        assert status == 200 and body.startswith(b"ready\nwarning: DNS resolver ")
        assert b"does not validate DNSSEC" in body
        assert any("does not validate DNSSEC" in r.getMessage() for r in caplog.records)
        async with dane_notary(tmp_path, stack.resolver, ("dane",), name="good") as notary:
            status, _, body = await http_get(notary.running.admin[0].port, "/readyz")
        assert (status, body) == (200, b"ready\n")


def test_notary_serve_refuses_a_resolver_that_does_not_validate(tmp_path: Path) -> None:
    """The same from the command line, one process and a node of workers
    (checked once by the supervisor before any worker starts): status 2 and
    one line naming the resolver, no traceback."""
    from notary.cli import main
    from tests.support.command_line import python_m_notary
    from tests.support.config_files import write_config

    key, cert = tmp_path / "notary.key", tmp_path / "notary.crt"
    assert main(["keygen", "--out-key", str(key), "--out-cert", str(cert),
                 "--name", "notary.example.test"]) == 0
    with dnssec_stack([]) as stack:
        where = f"{stack.authority[0]}:{stack.authority[1]}"
        config = write_config(tmp_path, key, cert, extra=(
            '[admin]\nlisten = ["127.0.0.1:0"]\n[verify]\nbackends = ["dane"]\n'
            f'[dns]\nresolvers = ["{where}"]\ntimeout_s = 2\n'))
        for workers in ("1", "2"):
            done = python_m_notary("serve", "--config", str(config), "--workers", workers,
                                   cwd=tmp_path)
            assert done.returncode == 2, (workers, done.stderr)
            assert "Traceback" not in done.stderr
            assert done.stderr.splitlines()[-1].startswith(
                f"notary: error: [dns] resolver {where} does not validate DNSSEC"), done.stderr
