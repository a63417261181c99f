"""Socket-level faults of the servers the notary's own clients talk to
(``tests.support.faults``, issue 30 item 3): the test is the server, and
does each fault of ``ServerFault`` that applies to every connection.

* The prober, end to end: a target that resets, half-closes, drips,
  stalls, never reads or answers an HTTP 1xx instead of TLS. Its queries
  get their 503 within ``[probe] timeout_s``, for the reason the fault
  calls for; a cached site is answered meanwhile; a healthy target never
  probed before is probed and answered afterwards.
* The witnessing client: a witness (HTTPS, pinned) doing each fault,
  1xx, drip and stall included. The task logs a warning and asks again
  (it connects again), the log keeps appending and serving its
  checkpoint (without a cosignature), cache hits are answered.
* DANE lookups: a resolver silent over UDP, or truncating its UDP answer
  (the TC bit) so the lookup falls back to TCP, to a TCP server doing
  each fault. Every lookup is a resolver failure within ``[dns]
  timeout_s`` (a healthy TCP answer after the TC bit is read, to show the
  fallback is taken); the same through a running notary, which keeps
  answering.
* The relay's connections to its destinations: a destination doing each
  fault ends its tunnel within the relay's idle and lifetime bounds, and
  a healthy destination is tunnelled to meanwhile and after.

Nothing is logged at ERROR in any of them. On Trio's autojump clock:
stalls, drips and deadlines cost no real time (the notary works in worker
threads too: the clock jumps only after it has idled a moment in real
time, ``WORKER_THREAD_S``).

PostgreSQL, the fourth client, runs in worker threads on real time:
tests/test_faults_postgres.py.

Covered elsewhere and not repeated: the prober alone against a silent,
garbage or truncating target (tests/test_probe.py); more misbehaving
targets end to end (test_hostile_targets.py); a witness that is
unreachable or answers 1xx after a complete exchange
(test_log_witnesses.py); DANE outcomes against a real unbound
(test_dane_dns.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import dns.flags
import dns.message
import dns.rcode
import pytest
import trio
import trio.testing
import trustme

from notary.config import Endpoint
from notary.errors import ProbeResolveFailed
from notary.model.dane import DnssecStatus
from notary.model.targets import Target
from notary.outbound.tlsa import lookup_tlsa, resolver_through
from notary.protocol import tlog
from notary.protocol.convergence import format_fingerprint
from notary.state import crypto
from tests.support.faults import (  # noqa: F401 (the clock: a fixture)
    Respond,
    ServerFault,
    http_respond,
    open_faulty_server,
    patient_autojump_clock,
)
from tests.support.log_notaries import get, logged_statement
from tests.support.notaries import (
    NotaryUnderTest,
    legacy_query,
    load_each_key_once,
    open_notary,
)
from tests.support.tls_targets import LOCALHOST, open_tls_target
from tests.support.witnessed_log import OTHER, SITE, WITNESS_NAME, open_log_notary

FRESH = "fresh.example.test"
PROBE_TIMEOUT_S = 5.0
_RSA_KEY = crypto.generate_rsa_key()


@pytest.fixture(autouse=True)
def one_rsa_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notary of this module gets the same RSA key, parsed once
    (nothing here depends on it; generating one costs a fifth of a second)."""
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)
    load_each_key_once(monkeypatch)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def server_context(name: str = LOCALHOST) -> tuple[ssl.SSLContext, bytes]:
    """A TLS server context for ``name`` and its certificate's DER."""
    issued = trustme.CA().issue_cert(name)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    issued.configure_cert(context)
    return context, ssl.PEM_cert_to_DER_cert(issued.cert_chain_pems[0].bytes().decode())


def tls_flight(context: ssl.SSLContext) -> Respond:
    """A TLS server's first flight (ServerHello to its certificates) for
    the ClientHello received so far: what a prober target answers."""

    def respond(hello: bytes) -> bytes | None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        server = context.wrap_bio(incoming, outgoing, server_side=True)
        incoming.write(hello)
        with contextlib.suppress(ssl.SSLWantReadError):
            server.do_handshake()
        return outgoing.read() or None

    return respond


@asynccontextmanager
async def open_settled_notary(directory: Path, **settings: object) -> AsyncIterator[NotaryUnderTest]:
    """``open_notary`` once its known-targets filter has loaded (until then
    a cache miss reads the store in a worker thread), its change feed (read
    in a worker thread too) not ticking along with the virtual clock."""
    settings.setdefault("store", {"feed_interval_ms": 3_600_000})
    async with open_notary(directory, **settings) as notary:  # type: ignore[arg-type]
        await notary.running.stored.settled.wait()
        yield notary


# -- the prober ----------------------------------------------------------------------

#: Why the probe of a target doing each fault fails (``ProbeError.reason``).
PROBE_FAILURES = {
    ServerFault.RESET_ON_ACCEPT: "handshake",
    ServerFault.RESET_MID_HANDSHAKE: "handshake",
    ServerFault.RESET_MID_ANSWER: "handshake",
    ServerFault.HALF_CLOSE_BEFORE_ANSWER: "handshake",
    ServerFault.NEVER_READS: "timeout",
    ServerFault.ANSWER_100: "handshake",  # not TLS
    ServerFault.ANSWER_101: "handshake",
    ServerFault.ANSWER_103: "handshake",
    ServerFault.DRIP: "timeout",
    ServerFault.STALL: "timeout",
}
HOSTILE = [f"h{i}.example.test" for i in range(3)]


@pytest.mark.parametrize("fault", list(ServerFault), ids=lambda fault: fault.value)
async def test_a_faulty_target_fails_its_probe_in_time(
    tmp_path: Path, fault: ServerFault, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    context, _ = server_context("hostile.example.test")
    async with open_tls_target(names=[SITE, FRESH]) as site, open_faulty_server(
        fault, tls_flight(context)
    ) as target:
        names = {SITE: [site.host], FRESH: [site.host], **{h: [target.host] for h in HOSTILE}}
        async with open_settled_notary(
            tmp_path, names=names, probe={"timeout_s": PROBE_TIMEOUT_S},
            answers={"failures_at_deadline": False}, rescan={"enabled": False},
            admin={"listen": (), "metrics_interval_s": 3600.0},
        ) as notary:
            assert (await legacy_query(notary.port, f"{SITE}+{site.port}", None)).status == 200
            answers = {}
            started = trio.current_time()
            async with trio.open_nursery() as nursery:

                async def ask(host: str) -> None:
                    answers[host] = await legacy_query(notary.port, f"{host}+{target.port}", None)

                for host in HOSTILE:
                    nursery.start_soon(ask, host)
                await target.wait_accepted(1)
                cached = await legacy_query(notary.port, f"{SITE}+{site.port}", None)
                assert cached.status == 200
            elapsed = trio.current_time() - started
            failures = notary.running.prober.statistics().failures
            fresh = await legacy_query(notary.port, f"{FRESH}+{site.port}", None)
    assert {host: answer.status for host, answer in answers.items()} == dict.fromkeys(HOSTILE, 503)
    assert elapsed <= PROBE_TIMEOUT_S + 0.01
    assert failures == {PROBE_FAILURES[fault]: len(HOSTILE)}
    assert fresh.status == 200
    assert errors(caplog) == []


# -- the witnessing client -----------------------------------------------------------

#: What the faulty witness would answer whole: a 200 without a cosignature.
WITNESS_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnothing.\n"


@pytest.mark.parametrize("fault", list(ServerFault), ids=lambda fault: fault.value)
async def test_a_faulty_witness_is_asked_again_and_holds_nothing_back(
    tmp_path: Path, fault: ServerFault, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.WARNING)
    key_path = tmp_path / "a.v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
    context, der = server_context()
    async with open_faulty_server(
        fault, http_respond(WITNESS_ANSWER), tls=context
    ) as witness, open_tls_target(names=[SITE, OTHER]) as site:
        entry = {"url": f"https://127.0.0.1:{witness.port}/v2/witness",
                 "key": tlog.cosigner_key(WITNESS_NAME, public),
                 "pin": hashlib.sha1(der).hexdigest()}
        async with open_log_notary(
            tmp_path / "a", key_path, site.host, [entry], tmp_path / "a.db"
        ) as notary:
            await logged_statement(notary, (SITE, site.port))
            with trio.fail_after(60):
                await witness.wait_accepted(3)  # asked, failed, asked again (twice)
            await logged_statement(notary, (OTHER, site.port))  # the log goes on
            status, body = await get(notary, "/v2/log/checkpoint")
            cached = await legacy_query(notary.port, f"{SITE}+{site.port}", None)
    assert status == 200 and body.decode().count("\u2014") == 1  # no cosignature
    assert cached.status == 200
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("log: witness")]
    assert len(warned) >= 2
    assert errors(caplog) == []


# -- DANE lookups --------------------------------------------------------------------

DNS_TIMEOUT_S = 2.0
TLSA_TARGET = Target("www.example.test", 443)


def dns_answer(query_wire: bytes) -> bytes:
    """A validating resolver's answer: NOERROR, no records, AD set."""
    query = dns.message.from_wire(query_wire)
    answer = dns.message.make_response(query)
    answer.flags |= dns.flags.AD
    return answer.to_wire()


def dns_over_tcp(request: bytes) -> bytes | None:
    """``Respond`` for DNS over TCP (two-byte length before each message)."""
    if len(request) < 2 or len(request) < 2 + int.from_bytes(request[:2], "big"):
        return None
    wire = dns_answer(request[2:2 + int.from_bytes(request[:2], "big")])
    return len(wire).to_bytes(2, "big") + wire


async def serve_udp(sock: trio.socket.SocketType, *, truncate: bool) -> None:
    """A resolver's UDP side: silent, or every answer truncated (TC)."""
    while True:
        query, peer = await sock.recvfrom(4096)
        if truncate:
            answer = dns.message.make_response(dns.message.from_wire(query))
            answer.flags |= dns.flags.TC
            await sock.sendto(answer.to_wire(), peer)


@asynccontextmanager
async def open_resolver(fault: ServerFault | None, *, truncate: bool) -> AsyncIterator[int]:
    """A resolver on 127.0.0.1: UDP silent (``truncate`` False) or
    truncating, its TCP side doing ``fault`` (None: answering); its port."""
    async with open_faulty_server(fault, dns_over_tcp) as tcp:
        udp = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        with udp:
            await udp.bind((LOCALHOST, tcp.port))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: serve_udp(udp, truncate=truncate))
                yield tcp.port
                nursery.cancel_scope.cancel()


#: The TCP faults of a resolver (a DNS answer has no 1xx).
DNS_FAULTS = [fault for fault in ServerFault if not fault.value.startswith("answer-")]
DNS_CASES = [pytest.param(None, False, id="udp-silence")] + [
    pytest.param(fault, True, id=f"tc-then-tcp-{fault.value}") for fault in DNS_FAULTS
]


@pytest.mark.parametrize(("fault", "truncate"), DNS_CASES)
async def test_a_faulty_resolver_is_a_resolver_failure_in_time(
    fault: ServerFault | None, truncate: bool, autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_resolver(fault, truncate=truncate) as port:
        started = trio.current_time()
        lookups = []
        async with trio.open_nursery() as nursery:

            async def look_up() -> None:
                lookups.append(await lookup_tlsa(TLSA_TARGET, (LOCALHOST, port), DNS_TIMEOUT_S))

            for _ in range(3):
                nursery.start_soon(look_up)
        elapsed = trio.current_time() - started
        resolve = resolver_through([(LOCALHOST, port)], DNS_TIMEOUT_S)
        with pytest.raises(ProbeResolveFailed):
            await resolve("www.example.test", 443)
    assert [lookup.status for lookup in lookups] == [DnssecStatus.RESOLVER_FAILURE] * 3
    assert elapsed <= DNS_TIMEOUT_S + 0.01


async def test_a_truncated_answer_is_asked_again_over_tcp(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The control of the cases above: the TC bit does take the lookup to
    the TCP side."""
    async with open_resolver(None, truncate=True) as port:
        lookup = await lookup_tlsa(TLSA_TARGET, (LOCALHOST, port), DNS_TIMEOUT_S)
    assert lookup.status is DnssecStatus.SECURE_DENIAL


@pytest.mark.parametrize(("fault", "truncate"), [
    pytest.param(None, False, id="udp-silence"),
    pytest.param(ServerFault.DRIP, True, id="tc-then-tcp-drip"),
    pytest.param(ServerFault.RESET_MID_ANSWER, True, id="tc-then-tcp-reset-mid-answer"),
])
async def test_a_notary_whose_resolver_fails_keeps_answering(
    tmp_path: Path, fault: ServerFault | None, truncate: bool,
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock,
) -> None:
    """Under ``["dane", "perspective"]`` with the faulty resolver as ``[dns]
    resolvers`` (names resolved statically): every query is answered, and
    a cached one at once."""
    async with open_resolver(fault, truncate=truncate) as port, open_tls_target(
        names=[SITE, OTHER, FRESH]
    ) as site:
        names = {name: [site.host] for name in (SITE, OTHER, FRESH)}
        async with open_settled_notary(
            tmp_path, names=names, verify={"backends": ("dane", "perspective")},
            dns={"resolvers": (Endpoint(LOCALHOST, port),), "timeout_s": DNS_TIMEOUT_S},
            answers={"failures_at_deadline": False, "query_timeout_s": 10.0},
            rescan={"enabled": False}, admin={"listen": (), "metrics_interval_s": 3600.0},
        ) as notary:
            leaf = format_fingerprint(hashlib.sha1(site.leaf_der(SITE)).digest())
            first = await legacy_query(notary.port, f"{SITE}+{site.port}", leaf)
            answers = []
            async with trio.open_nursery() as nursery:

                async def ask(name: str) -> None:
                    answers.append(await legacy_query(notary.port, f"{name}+{site.port}", None))

                for name in (OTHER, FRESH):
                    nursery.start_soon(ask, name)
                started = trio.current_time()
                again = await legacy_query(notary.port, f"{SITE}+{site.port}", leaf)
                cached_in = trio.current_time() - started
            after = await legacy_query(notary.port, f"{SITE}+{site.port}", leaf)
    assert first.status == again.status == after.status
    assert cached_in < 0.01
    assert len(answers) == 2
    assert errors(caplog) == []


# -- the relay's destinations --------------------------------------------------------

RELAY_IDLE_S, RELAY_LIFETIME_S = 20.0, 60.0
#: What the faulty destination would answer to the tunnelled bytes.
DESTINATION_ANSWER = b"a notary's answer, " * 8
#: The faults of a destination (the bytes of a tunnel have no 1xx).
DESTINATION_FAULTS = [fault for fault in ServerFault if not fault.value.startswith("answer-")]


async def echo(stream: trio.SocketStream) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while data := await stream.receive_some(65536):
            await stream.send_all(data)


async def tunnel(relay_port: int, destination: str, data: bytes) -> tuple[bytes, bytes]:
    """CONNECT through the relay, send ``data`` and the end of it, read
    until the end: (the relay's answer head, what came through the tunnel)."""
    stream = await trio.open_tcp_stream(LOCALHOST, relay_port)
    async with stream:
        await stream.send_all(f"CONNECT {destination}:4242 HTTP/1.1\r\n\r\n".encode())
        received = b""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            with trio.move_on_after(1.0):  # a destination that never reads blocks it
                await stream.send_all(data)
            await stream.send_eof()
            while chunk := await stream.receive_some(65536):
                received += chunk
    head, _, through = received.partition(b"\r\n\r\n")
    return head, through


@pytest.mark.parametrize("fault", DESTINATION_FAULTS, ids=lambda fault: fault.value)
async def test_a_faulty_destination_ends_only_its_tunnel(
    tmp_path: Path, fault: ServerFault, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The relay's own outbound connections: a destination doing each fault
    (127.0.0.1) ends its tunnel within the relay's bounds, while a healthy
    one (127.0.0.2, the same port) is tunnelled to meanwhile and after."""
    async with open_faulty_server(
        fault, lambda request: DESTINATION_ANSWER if request else None
    ) as destination:
        healthy = await trio.open_tcp_listeners(destination.port, host="127.0.0.2")
        async with trio.open_nursery() as servers:
            servers.start_soon(trio.serve_listeners, echo, healthy)
            async with open_settled_notary(
                tmp_path, relay={
                    "destinations": "public", "dial_port": destination.port,
                    "idle_timeout_s": RELAY_IDLE_S, "max_lifetime_s": RELAY_LIFETIME_S,
                }, rescan={"enabled": False}, admin={"listen": (), "metrics_interval_s": 3600.0},
            ) as notary:
                relay = notary.running.relay_handler
                started = trio.current_time()
                ended: list[float] = []
                async with trio.open_nursery() as nursery:

                    async def faulty() -> None:
                        if fault is ServerFault.NEVER_READS:
                            # More than the buffers between: the relay's
                            # send blocks. It ends the tunnel with the
                            # client's bytes unread: a reset, which may
                            # destroy its 200 before it is read.
                            await tunnel(notary.relay_port, "127.0.0.1", b"x" * (4 << 20))
                        else:
                            head, _ = await tunnel(notary.relay_port, "127.0.0.1", b"hello")
                            assert head.split(b" ")[1] == b"200", head
                        ended.append(trio.current_time() - started)

                    for _ in range(3):
                        nursery.start_soon(faulty)
                    await destination.wait_accepted(3)
                    assert (await tunnel(notary.relay_port, "127.0.0.2", b"ping"))[1] == b"ping"
                assert (await tunnel(notary.relay_port, "127.0.0.2", b"ping"))[1] == b"ping"
                with trio.move_on_after(RELAY_IDLE_S):  # each ends on its own after its client
                    while relay.statistics().connections:  # noqa: ASYNC110 (a counter)
                        await trio.sleep(0.1)
                connections = relay.statistics().connections
            servers.cancel_scope.cancel()
    assert len(ended) == 3 and max(ended) <= RELAY_LIFETIME_S + 1.0
    assert connections == 0
    assert errors(caplog) == []
