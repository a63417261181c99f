"""The client (notary.client.check, `notary check`, `notary bundle fetch|list|remove`)
against real local notaries. Loopback only: names reach local servers through
injected resolvers; the CLI runs as a subprocess against IP literals.
"""

from __future__ import annotations

import hashlib
import json
import random
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from notary.cli.report import report_json, report_table
from notary.client import check as client
from notary.client.trusted import (
    BundleFetchFailed,
    PinsChanged,
    bundle_pins,
    fetch_bundle,
    list_bundles,
    remove_bundle,
    store_bundle,
)
from notary.errors import UsageError
from notary.model.targets import Target
from notary.protocol.bundle import Bundle, BundleHost, make_bundle, parse_bundle
from notary.protocol.convergence import format_fingerprint
from notary.protocol.voting import Outcome, Threshold, Verdict
from notary.state import crypto
from tests.support.client_world import NOTARY_HOSTS, SITE, bundle_of, open_world, run_check
from tests.support.notaries import NotaryUnderTest, open_notary
from tests.support.tls_targets import closed_port, open_tls_target


def dead_bundle(name: str, certificate_pem: str) -> Bundle:
    return make_bundle(
        name=name,
        location="https://127.0.0.1/dead.notary",
        hosts=[BundleHost("127.0.0.1", closed_port(), closed_port(), certificate_pem)],
    )


# -- voting with a man in the middle on one notary's route --------------------------------


async def test_thresholds_with_one_notary_fooled(tmp_path: Path) -> None:
    async with open_world(tmp_path) as (site, notaries):
        bundles = [bundle_of(n, f"Notary {i}") for i, n in enumerate(notaries)]
        majority = await run_check(site, bundles, threshold=Threshold.MAJORITY)
        consensus = await run_check(site, bundles, threshold=Threshold.CONSENSUS)
        minority = await run_check(site, bundles, threshold=Threshold.MINORITY)
    assert majority.fingerprint == hashlib.sha1(site.leaf_der(SITE)).digest()
    verdicts = {a.notary: a.verdict for a in majority.answers}
    assert verdicts == {"Notary 0": Verdict.SUCCESS, "Notary 1": Verdict.SUCCESS,
                        "Notary 2": Verdict.FAILURE}
    assert (majority.tally.outcome, majority.tally.successes, majority.tally.counted) == (
        Outcome.VERIFIED, 2, 3)
    assert consensus.tally.outcome is Outcome.REJECTED
    assert minority.tally.outcome is Outcome.VERIFIED
    fooled = next(a for a in majority.answers if a.notary == "Notary 2")
    assert fooled.detail == "sees another certificate" and fooled.status == 409
    honest = next(a for a in majority.answers if a.notary == "Notary 0")
    assert honest.host == "127.0.0.1" and honest.status == 200
    assert honest.seen_since is not None and honest.newest_seen is not None


async def test_v2_check_verifies_signed_answers(tmp_path: Path) -> None:
    async with open_world(tmp_path, with_v2=True) as (site, notaries):
        bundles = [bundle_of(n, f"Notary {i}") for i, n in enumerate(notaries)]
        report = await run_check(site, bundles, use_v2=True)
        legacy = await run_check(site, bundles)
    verdicts = {a.notary: a.verdict for a in report.answers}
    assert verdicts == {"Notary 0": Verdict.SUCCESS, "Notary 1": Verdict.SUCCESS,
                        "Notary 2": Verdict.FAILURE}
    assert report.tally.outcome is Outcome.VERIFIED
    assert verdicts == {a.notary: a.verdict for a in legacy.answers}
    honest = next(a for a in report.answers if a.notary == "Notary 0")
    assert honest.seen_since is not None and honest.newest_seen is not None


async def test_v2_check_trusts_only_the_key_the_bundle_pins(tmp_path: Path) -> None:
    import base64
    from dataclasses import replace

    async with open_world(tmp_path, with_v2=True) as (site, notaries):
        bundle = bundle_of(notaries[0], "Pinned v2")
        own = crypto.ed25519_public_raw(
            crypto.load_ed25519_private_key(tmp_path / "v2-0.key")
        )
        right = replace(bundle, hosts=(replace(bundle.hosts[0],
                                               v2_key=base64.b64encode(own).decode()),))
        wrong = replace(bundle, hosts=(replace(bundle.hosts[0],
                                               v2_key=base64.b64encode(b"\1" * 32).decode()),))
        good = await run_check(site, [right], use_v2=True)
        bad = await run_check(site, [wrong], use_v2=True)
    assert good.answers[0].verdict is Verdict.SUCCESS
    assert bad.answers[0].verdict is Verdict.CONNECTIVITY_FAILURE
    assert "v2_key" in bad.answers[0].detail


async def test_v2_check_against_a_notary_without_v2(tmp_path: Path) -> None:
    async with open_world(tmp_path) as (site, notaries):
        report = await run_check(site, [bundle_of(notaries[0], "Old")], use_v2=True)
    (answer,) = report.answers
    assert answer.verdict is Verdict.CONNECTIVITY_FAILURE
    assert "no v2 API" in answer.detail


async def test_quorum_limits_the_notaries_asked(tmp_path: Path) -> None:
    async with open_world(tmp_path) as (site, notaries):
        bundles = [bundle_of(n, f"Notary {i}") for i, n in enumerate(notaries)]
        report = await run_check(site, bundles, quorum=2, rng=random.Random(1))
    assert len(report.answers) == 2
    assert len({a.notary for a in report.answers}) == 2


async def test_tampered_signature_counts_as_failure(tmp_path: Path) -> None:
    """An impostor notary that replays a real notary's answer under its own
    (pinned) certificate: the answer does not verify with its key."""
    async with open_world(tmp_path) as (site, notaries):
        honest = await run_check(site, [bundle_of(notaries[0], "Honest")])
        assert honest.tally.outcome is Outcome.VERIFIED
        replayed = await _answer_bytes(notaries[0], site)
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.4")
        async with open_fixed_answer_server(cert, replayed) as port:
            pem = cert.cert_chain_pems[0].bytes().decode("ascii")
            impostor = make_bundle(
                name="Impostor", location="https://127.0.0.4/i.notary",
                hosts=[BundleHost("127.0.0.4", port, 80, pem)],
            )
            report = await run_check(site, [impostor])
    (answer,) = report.answers
    assert (answer.verdict, answer.detail, answer.status) == (Verdict.FAILURE, "bad signature", 200)
    assert report.tally.outcome is Outcome.REJECTED


async def _answer_bytes(notary: NotaryUnderTest, site) -> bytes:
    from tests.support.notaries import send_raw

    fp = format_fingerprint(hashlib.sha1(site.leaf_der(SITE)).digest())
    body = f"fingerprint={fp}".encode()
    request = (
        f"POST /target/{SITE}+{site.port} HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    answer = await send_raw(notary.port, request)
    assert answer.status == 200
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(answer.body)).encode() + b"\r\nConnection: close\r\n\r\n" + answer.body
    )


@asynccontextmanager
async def open_fixed_answer_server(cert: trustme.LeafCert, answer: bytes) -> AsyncIterator[int]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(context)

    async def serve(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, context, server_side=True)
        try:
            await stream.do_handshake()
            await stream.receive_some(65536)
            await stream.send_all(answer)
        except trio.BrokenResourceError:
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.4"))
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def test_wrong_pin_is_a_connectivity_failure(tmp_path: Path) -> None:
    async with open_world(tmp_path) as (site, notaries):
        good = bundle_of(notaries[0], "Pinned elsewhere")
        other_pem = crypto.certificate_pem(notaries[1].certificate).decode("ascii")
        host = good.hosts[0]
        wrong = make_bundle(name=good.name, location=good.bundle_location,
                            hosts=[BundleHost(host.host, host.ssl_port, 80, other_pem)])
        report = await run_check(site, [wrong])
    (answer,) = report.answers
    assert answer.verdict is Verdict.CONNECTIVITY_FAILURE
    assert "pin" in answer.detail
    assert report.tally.outcome is Outcome.INCONCLUSIVE


async def test_dead_notary_stands_aside_unless_strict(tmp_path: Path) -> None:
    async with open_world(tmp_path) as (site, notaries):
        pem = crypto.certificate_pem(notaries[0].certificate).decode("ascii")
        bundles = [bundle_of(notaries[0], "Alive"), dead_bundle("Dead", pem)]
        relaxed = await run_check(site, bundles, threshold=Threshold.CONSENSUS)
        strict = await run_check(site, bundles, threshold=Threshold.CONSENSUS, strict=True)
    assert relaxed.tally.outcome is Outcome.VERIFIED
    assert (relaxed.tally.counted, relaxed.tally.stood_aside) == (1, 1)
    assert strict.tally.outcome is Outcome.REJECTED
    assert (strict.tally.counted, strict.tally.stood_aside) == (2, 0)
    dead = next(a for a in relaxed.answers if a.notary == "Dead")
    assert dead.verdict is Verdict.CONNECTIVITY_FAILURE and dead.host is None


async def test_site_unreachable_is_its_own_error() -> None:
    with pytest.raises(client.SiteUnreachable):
        await client.check(Target("127.0.0.1", closed_port()), [dead_bundle("x", _some_pem())],
                           relay=None, timeout_s=5)


def _some_pem() -> str:
    return trustme.CA().issue_cert("x.test").cert_chain_pems[0].bytes().decode("ascii")


async def test_no_notaries_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no notaries"):
        await client.check(Target("127.0.0.1", 443), [], fingerprint=b"\0" * 20)


# -- bouncing ---------------------------------------------------------------------------------


@asynccontextmanager
async def open_relay_world(tmp_path: Path) -> AsyncIterator[tuple[object, NotaryUnderTest, Bundle, NotaryUnderTest]]:
    """Notary B (asked) on 127.0.0.2 and relay notary A on 127.0.0.1 that
    trusts B's bundle and dials B's port."""
    async with open_tls_target(names=[SITE]) as site:
        async with open_notary(tmp_path / "b", host="127.0.0.2", names={SITE: [site.host]}) as b:
            b_bundle = bundle_of(b, "Notary B")
            trusted = tmp_path / "trusted" / "b.notary"
            trusted.parent.mkdir()
            trusted.write_bytes(b_bundle.to_json())
            relay = {"bundles": (trusted,), "dial_port": b.port}
            async with open_notary(tmp_path / "a", host="127.0.0.1", relay=relay) as a:
                yield site, a, b_bundle, b


async def test_bouncing_through_a_relay_reaches_the_asked_notary(tmp_path: Path) -> None:
    async with open_relay_world(tmp_path) as (site, a, b_bundle, _b):
        report = await run_check(site, [b_bundle], relay=bundle_of(a, "Notary A"))
        statistics = a.running.relay_handler.statistics()
    (answer,) = report.answers
    assert (answer.notary, answer.verdict, answer.via) == ("Notary B", Verdict.SUCCESS, "Notary A")
    assert answer.host == "127.0.0.2"
    assert report.relays == ("Notary A",)
    assert statistics.tunnels_opened == 1  # the question went through A


async def test_a_failed_relay_is_replaced_by_another(tmp_path: Path) -> None:
    async with open_relay_world(tmp_path) as (site, a, b_bundle, _b):
        dead = dead_bundle("Dead relay", _some_pem())
        good = bundle_of(a, "Notary A")
        bundles = [b_bundle, dead, good]
        # A seed for which the client asks B and tries the dead relay first.
        seed = next(
            s for s in range(1000)
            if client._pick(bundles, 1, "auto", random.Random(s)) == ([b_bundle], [dead, good])
        )
        report = await run_check(site, bundles, quorum=1, relay="auto", rng=random.Random(seed))
    (answer,) = report.answers
    assert (answer.verdict, answer.via) == (Verdict.SUCCESS, "Notary A")
    assert report.relays == ("Dead relay", "Notary A")


async def test_when_every_relay_fails_the_notary_is_not_asked_directly(tmp_path: Path) -> None:
    async with open_relay_world(tmp_path) as (site, _a, b_bundle, b):
        report = await run_check(site, [b_bundle], relay=dead_bundle("Dead relay", _some_pem()))
        probes = b.running.prober.statistics().started
    (answer,) = report.answers
    assert answer.verdict is Verdict.CONNECTIVITY_FAILURE
    assert answer.detail == "no relay could reach it"
    assert probes == 0  # B never heard the question


def test_pick_excludes_the_relay_and_keeps_names_distinct() -> None:
    pem = _some_pem()
    bundles = [dead_bundle(f"N{i}", pem) for i in range(5)]
    for seed in range(50):
        asked, relays = client._pick(bundles, 3, "auto", random.Random(seed))
        assert len(asked) == 3 and relays
        assert not {b.name for b in asked} & {b.name for b in relays}
        assert len({b.name for b in asked + relays}) == 5
    asked, relays = client._pick(bundles[:1], 3, "auto", random.Random(0))
    assert (len(asked), relays) == (1, [])  # nothing to spare: direct
    asked, relays = client._pick(bundles, 9, None, random.Random(0))
    assert (len(asked), relays) == (5, [])
    with pytest.raises(UsageError):
        client._pick(bundles, 0, None, random.Random(0))


# -- output ------------------------------------------------------------------------------------


async def test_table_and_json_output(tmp_path: Path) -> None:
    async with open_world(tmp_path) as (site, notaries):
        pem = crypto.certificate_pem(notaries[0].certificate).decode("ascii")
        bundles = [bundle_of(n, f"Notary {i}") for i, n in enumerate(notaries)]
        report = await run_check(site, [*bundles, dead_bundle("Dead", pem)], quorum=4)
    table = report_table(report, now=report.answers[0].newest_seen or 0)
    lines = table.splitlines()
    assert lines[0] == (f"{SITE}:{site.port} {format_fingerprint(report.fingerprint)} (majority)")
    assert lines[1].split() == ["NOTARY", "ANSWERED", "BY", "VERDICT", "NEWEST", "OBSERVATION",
                                "SEEN", "FOR", "DETAIL"]
    rows = {line.split("  ")[0]: line for line in lines[2:-1]}
    assert "success" in rows["Notary 0"] and "127.0.0.1" in rows["Notary 0"]
    assert "failure" in rows["Notary 2"] and "sees another certificate" in rows["Notary 2"]
    assert "connectivity-failure" in rows["Dead"]
    assert lines[-1] == (
        "verified: 2 of 3 counted notaries vouch for this certificate (majority); 1 stood aside"
    )
    document = json.loads(report_json(report))
    assert document["outcome"] == "verified"
    assert (document["successes"], document["counted"], document["stood_aside"]) == (2, 3, 1)
    assert document["target"] == f"{SITE}:{site.port}"
    by_name = {n["name"]: n for n in document["notaries"]}
    assert by_name["Notary 2"]["verdict"] == "failure" and by_name["Notary 2"]["status"] == 409
    assert by_name["Dead"]["host"] is None
    # A Convergence answer says nothing of the backend that decided.
    assert {n["backend"] for n in document["notaries"]} == {None}


# -- the CLI, as a subprocess ---------------------------------------------------------------


async def notary_cli(*argv: str, cwd: Path) -> tuple[int, str, str]:
    done = await trio.run_process(
        [sys.executable, "-m", "notary", *argv], cwd=cwd, capture_stdout=True,
        capture_stderr=True, check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_cli_exit_codes(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site, AsyncExitStack() as stack:
        notaries = [
            await stack.enter_async_context(open_notary(tmp_path / f"n{i}", host=host))
            for i, host in enumerate(NOTARY_HOSTS)
        ]
        directory = tmp_path / "notaries"
        for index, notary in enumerate(notaries):
            store_bundle(directory, bundle_of(notary, f"Notary {index}").to_json())
        ip_site = f"127.0.0.1:{site.port}"  # the CLI resolves nothing: an IP literal
        common = ("--notaries", str(directory), "--bounce", "off", "--timeout", "10")

        status, out, err = await notary_cli("check", ip_site, *common, cwd=tmp_path)
        assert (status, err) == (0, ""), out
        assert out.splitlines()[-1].startswith("verified: 3 of 3")

        other = format_fingerprint(b"\x01" * 20)
        status, out, _ = await notary_cli("check", ip_site, "--fingerprint", other, *common,
                                          cwd=tmp_path)
        assert status == 1 and out.splitlines()[-1].startswith("rejected: 0 of 3")

        status, out, _ = await notary_cli("check", ip_site, "--json", *common, cwd=tmp_path)
        assert status == 0 and json.loads(out)["outcome"] == "verified"

        dead_dir = tmp_path / "dead"
        store_bundle(dead_dir, dead_bundle("Dead", _some_pem()).to_json())
        status, out, _ = await notary_cli("check", ip_site, "--notaries", str(dead_dir),
                                          "--bounce", "off", cwd=tmp_path)
        assert status == 3 and out.splitlines()[-1].startswith("inconclusive: 0 of 0")

        status, _, err = await notary_cli("check", f"127.0.0.1:{closed_port()}", *common,
                                          cwd=tmp_path)
        assert status == 4 and "cannot fetch the site's certificate" in err

        for bad in (["check", "bad_host"], ["check", ip_site, "--threshold", "most"],
                    ["check", ip_site, "--fingerprint", "zz"],
                    ["check", ip_site, "--notaries", str(tmp_path / "missing")],
                    ["check", ip_site, "--timeout", "0"]):
            status, _, err = await notary_cli(*bad, cwd=tmp_path)
            assert status == 2 and len(err.splitlines()) == 1, (bad, err)


# -- the bundle directory -------------------------------------------------------------------


async def test_a_self_signed_bundle_server_needs_the_users_pin(tmp_path: Path) -> None:
    """Issue 17 item 1: a server no CA vouches for is refused even when the
    bundle it serves pins its certificate; the message names the pin it
    presents. With --pin it is fetched from that certificate only."""
    async with open_notary(tmp_path / "n", serve_bundle=True) as notary:
        url = f"https://127.0.0.1:{notary.port}/test.notary"
        presented = format_fingerprint(notary.sha1_pin)
        with pytest.raises(BundleFetchFailed, match="not trusted by a CA") as refused:
            await fetch_bundle(url, timeout_s=10)
        assert f"--pin {presented}" in str(refused.value)
        data = await fetch_bundle(url, timeout_s=10, pin=notary.sha1_pin)
        assert parse_bundle(data).hosts[0].sha1_pin == presented
        with pytest.raises(BundleFetchFailed, match=f"presents the certificate with SHA-1 {presented}, not the --pin"):
            await fetch_bundle(url, timeout_s=10, pin=b"\1" * 20)
        with pytest.raises(BundleFetchFailed, match="HTTP 404"):
            await fetch_bundle(f"https://127.0.0.1:{notary.port}/other.notary", timeout_s=10,
                               pin=notary.sha1_pin)


async def test_someone_on_the_path_cannot_serve_a_bundle_pinning_themselves(
    tmp_path: Path,
) -> None:
    """The attack of item 1: whoever answers for the bundle's URL serves a
    bundle of the same name pinning their own certificate. Before, this was
    accepted (and replaced the stored bundle)."""
    async with open_notary(tmp_path / "mitm", host="127.0.0.2", serve_bundle=True) as mitm:
        with pytest.raises(BundleFetchFailed, match="not trusted by a CA"):
            await fetch_bundle(f"https://127.0.0.2:{mitm.port}/test.notary", timeout_s=10)


async def test_a_ca_trusted_bundle_server_and_a_pin_that_overrides_the_ca(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.4")
    bundle = dead_bundle("CA served", _some_pem())
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(bundle.to_json())).encode()
        + b"\r\nConnection: close\r\n\r\n" + bundle.to_json()
    )
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    leaf_sha1 = hashlib.sha1(ssl.PEM_cert_to_DER_cert(
        leaf.cert_chain_pems[0].bytes().decode("ascii"))).digest()
    async with open_fixed_answer_server(leaf, answer) as port:
        url = f"https://127.0.0.4:{port}/ca.notary"
        assert await fetch_bundle(url, timeout_s=10, ca_context=trusting) == bundle.to_json()
        with pytest.raises(BundleFetchFailed, match="not trusted by a CA"):
            await fetch_bundle(url, timeout_s=10)  # the system's CAs do not know trustme's
        with pytest.raises(BundleFetchFailed, match="not the --pin"):
            await fetch_bundle(url, timeout_s=10, ca_context=trusting, pin=b"\2" * 20)
        assert await fetch_bundle(url, timeout_s=10, pin=leaf_sha1) == bundle.to_json()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
])
async def test_bundle_fetch_of_a_1xx_answer_is_a_fetch_failure(answer: bytes) -> None:
    """A 101 escaped as httptools' HttpParserUpgrade and ``notary bundle
    fetch`` printed a traceback (issue 30, item 2)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.4")
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    async with open_fixed_answer_server(leaf, answer) as port:
        url = f"https://127.0.0.4:{port}/x.notary"
        with pytest.raises(BundleFetchFailed, match=r"101 Switching|truncated"):
            await fetch_bundle(url, timeout_s=10, ca_context=trusting)


async def test_bundle_fetch_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="https:// only"):
        await fetch_bundle("http://127.0.0.1/x.notary", timeout_s=1)
    (tmp_path / "good.notary").write_bytes(dead_bundle("Good", _some_pem()).to_json())
    with pytest.raises(UsageError, match="local file, trusted as it is"):
        await fetch_bundle(str(tmp_path / "good.notary"), timeout_s=1, pin=b"\0" * 20)
    with pytest.raises(UsageError, match="cannot read"):
        await fetch_bundle(str(tmp_path / "missing.notary"), timeout_s=1)
    (tmp_path / "bad.notary").write_text("{}")
    with pytest.raises(UsageError, match=r"bad\.notary"):
        await fetch_bundle(str(tmp_path / "bad.notary"), timeout_s=1)
    with pytest.raises(BundleFetchFailed):
        await fetch_bundle(f"https://127.0.0.1:{closed_port()}/x.notary", timeout_s=5)


def test_store_list_update_remove(tmp_path: Path) -> None:
    pem = _some_pem()
    directory = tmp_path / "notaries"
    first = dead_bundle("Thoughtcrime Labs", pem)
    result = store_bundle(directory, first.to_json())
    assert result.stored.path.name == "thoughtcrime-labs.notary"
    assert (result.previous, result.name_taken_by) == (None, None)
    result = store_bundle(directory, dead_bundle("Thoughtcrime Labs", pem).to_json())
    assert result.previous is not None and not result.pins_changed  # same pins: an update
    assert result.stored.path.name == "thoughtcrime-labs.notary"
    store_bundle(directory, dead_bundle("Another", pem).to_json())
    assert [s.bundle.name for s in list_bundles(directory)] == ["Another", "Thoughtcrime Labs"]
    assert client.load_bundles([], directory)[0].name in ("Another", "Thoughtcrime Labs")
    remove_bundle(directory, "Thoughtcrime Labs")
    assert [s.bundle.name for s in list_bundles(directory)] == ["Another"]
    with pytest.raises(UsageError, match="no bundle called"):
        remove_bundle(directory, "Thoughtcrime Labs")
    assert list_bundles(tmp_path / "none") == []
    assert not [p for p in directory.iterdir() if not p.name.endswith(".notary")]


def _with_pins(name: str, *pems: str, v2_key: str | None = None) -> Bundle:
    return make_bundle(
        name=name, location="https://127.0.0.1/x.notary",
        hosts=[BundleHost(f"127.0.0.{i + 1}", 443, 80, pem, v2_key) for i, pem in enumerate(pems)],
    )


def test_a_bundle_with_other_pins_does_not_replace_a_stored_one(tmp_path: Path) -> None:
    """Issue 17 item 1: before, any bundle of the same name replaced the
    stored one."""
    directory = tmp_path / "notaries"
    old_pem, new_pem = _some_pem(), _some_pem()
    stored = store_bundle(directory, _with_pins("Lab", old_pem).to_json()).stored
    kept = stored.path.read_bytes()
    swapped = _with_pins("Lab", new_pem)
    with pytest.raises(PinsChanged) as refused:
        store_bundle(directory, swapped.to_json())
    message = str(refused.value)
    assert sha1_of_pem(old_pem) in message and sha1_of_pem(new_pem) in message
    assert "--replace" in message and "\n" not in message
    assert stored.path.read_bytes() == kept
    result = store_bundle(directory, swapped.to_json(), replace=True)
    assert result.pins_changed and result.stored.path == stored.path
    assert result.previous is not None
    assert bundle_pins(result.previous.bundle) == {sha1_of_pem(old_pem)}
    assert bundle_pins(parse_bundle(stored.path.read_bytes())) == {sha1_of_pem(new_pem)}
    # A pin more or less, or another v2 key, is another set of pins too.
    with pytest.raises(PinsChanged):
        store_bundle(directory, _with_pins("Lab", new_pem, old_pem).to_json())
    with pytest.raises(PinsChanged):
        store_bundle(directory, _with_pins("Lab", new_pem, v2_key="AQ" * 21 + "E=").to_json())
    # The same pins on other ports: an update, no --replace needed.
    moved = make_bundle(name="Lab", location="https://127.0.0.1/x.notary",
                        hosts=[BundleHost("127.0.0.9", 8443, 8080, new_pem)])
    result = store_bundle(directory, moved.to_json())
    assert result.previous is not None and not result.pins_changed
    # The log a bundle pins (issue 30, item 11) is a pin too: another
    # origin or key needs --replace.
    from notary.protocol.bundle import BundleLog

    def logged(origin: str) -> bytes:
        return make_bundle(name="Lab", location="https://127.0.0.1/x.notary",
                           hosts=[BundleHost("127.0.0.9", 8443, 8080, new_pem)],
                           log=BundleLog.of(origin, bytes(range(32)))).to_json()

    assert store_bundle(directory, logged("lab/log"), replace=True).pins_changed
    with pytest.raises(PinsChanged, match="log lab/log"):
        store_bundle(directory, logged("another/log"))
    assert not store_bundle(directory, logged("lab/log")).pins_changed


def test_names_with_one_file_name_keep_their_own_files(tmp_path: Path) -> None:
    """Issue 17 item 2: before, ``Lab notary`` overwrote ``LAB NOTARY``."""
    directory = tmp_path / "notaries"
    pems = {name: _some_pem() for name in ("LAB NOTARY", "Lab notary", "lab-notary")}
    results = {name: store_bundle(directory, _with_pins(name, pem).to_json())
               for name, pem in pems.items()}
    assert [r.stored.path.name for r in results.values()] == [
        "lab-notary.notary", "lab-notary-2.notary", "lab-notary-3.notary"]
    assert results["LAB NOTARY"].name_taken_by is None
    assert results["Lab notary"].name_taken_by.bundle.name == "LAB NOTARY"
    assert results["lab-notary"].previous is None
    listed = {s.bundle.name: s for s in list_bundles(directory)}
    assert set(listed) == set(pems)
    for name, pem in pems.items():
        assert bundle_pins(listed[name].bundle) == {sha1_of_pem(pem)}
    # Fetched again, each goes back to its own file.
    again = store_bundle(directory, _with_pins("Lab notary", pems["Lab notary"]).to_json())
    assert again.stored.path.name == "lab-notary-2.notary" and again.previous is not None
    remove_bundle(directory, "LAB NOTARY")
    assert {s.bundle.name for s in list_bundles(directory)} == {"Lab notary", "lab-notary"}
    # The slug's own file is free again: a new name with that slug takes it.
    assert store_bundle(directory, _with_pins("Lab  Notary", _some_pem()).to_json()
                        ).stored.path.name == "lab-notary.notary"


def sha1_of_pem(pem: str) -> str:
    return format_fingerprint(hashlib.sha1(ssl.PEM_cert_to_DER_cert(pem)).digest())


async def test_the_relay_alone_is_a_usage_error() -> None:
    only = dead_bundle("Only", _some_pem())
    with pytest.raises(UsageError, match="only notary given is the relay"):
        await client.check(Target("127.0.0.1", 443), [only], fingerprint=b"\0" * 20, relay=only)


async def test_a_watch_ends_when_the_notary_stops_answering_pings(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keep-alive of `notary watch`: no pong in time ends the watch."""
    class Silent:
        async def ping(self) -> None:
            await trio.sleep_forever()

    watching = trio.CancelScope()
    lost: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._keep_alive, Silent(), 10.0, watching, lost)
        with watching:
            await trio.sleep_forever()
    assert lost == ["no pong"]
    assert trio.current_time() == pytest.approx(client.WATCH_PING_INTERVAL_S + 10.0)
