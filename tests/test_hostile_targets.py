"""Misbehaving targets probed by a running notary, end to end: each gets a
503 without a signed list (docs/protocols.md "Answers and status codes"), within the
probe deadline, with a bounded number of bytes read from it, and the
notary keeps answering about good sites meanwhile, logging no error.

On Trio's autojump clock: the targets' stalls and drips and the notary's
deadlines run in virtual time, so a one-byte-a-second target costs no real
second.

Already covered by the prober's own tests (tests/test_probe.py) and not
repeated there: a silent target, garbage, a cut after the ServerHello and a
chain over ``max_handshake_bytes``, each against the prober alone; end to end
(tests/test_end_to_end.py): a silent target and a closed port. Here: the same
failures through the whole notary, plus a reset in the middle of the
ServerHello, a one-megabyte certificate message, a target dripping a byte a
second, an alert instead of a ServerHello, and the bound on what is read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
import trio_websocket

from notary.config import Endpoint
from notary.outbound import probe as probe_module
from notary.outbound.probe import DEFAULT_MAX_HANDSHAKE_BYTES
from notary.protocol.convergence import format_fingerprint
from notary.state import crypto
from tests.support import notaries
from tests.support.notaries import (
    NotaryUnderTest,
    client_context,
    legacy_query,
    legacy_request,
    open_notary,
    open_v2_notary,
    send_raw,
)
from tests.support.sites import open_site
from tests.support.tls_targets import (
    LOCALHOST,
    RawTarget,
    TLSTarget,
    open_garbage_target,
    open_raw_target,
    open_tls_target,
    open_truncating_proxy,
    static_resolver,
)

PROBE_TIMEOUT_S = 5.0
GOOD = "good.example.test"
HOSTILE = "hostile.example.test"
_TLS_RECORD_HEADER = 5
_MAX_RECORD = 16 * 1024

_RSA_KEY = crypto.generate_rsa_key()


@asynccontextmanager
async def open_settled_notary(directory: Path, **settings: object) -> AsyncIterator[NotaryUnderTest]:
    """``open_notary``, yielded once its known-targets filter has loaded (in
    a thread). Until then a cache miss reads the store in a thread too, and
    on the autojump clock a query waiting on a thread can see the clock jump
    to the test's own deadline (a flake seen once in a full run)."""
    async with open_notary(directory, **settings) as notary:  # type: ignore[arg-type]
        await notary.running.stored.settled.wait()
        yield notary


@pytest.fixture(autouse=True)
def one_rsa_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notary of this module gets the same RSA key (a fifth of a
    second saved per notary; nothing here depends on the key)."""
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """The bytes each probe connection read from its target (the prober's
    ``_receive`` wrapped), by connection."""
    totals: dict[int, int] = {}
    real_receive = probe_module._receive

    async def counting_receive(stream: trio.SocketStream, max_bytes: int) -> bytes:
        data = await real_receive(stream, max_bytes)
        totals[id(stream)] = totals.get(id(stream), 0) + len(data)
        return data

    monkeypatch.setattr(probe_module, "_receive", counting_receive)
    return totals


# -- hostile targets -------------------------------------------------------------------

HostileTarget = Callable[[TLSTarget], AbstractAsyncContextManager[RawTarget]]


async def _first_records(
    upstream: TLSTarget, client: trio.SocketStream, records: int
) -> tuple[trio.SocketStream, bytes]:
    """Relay the client's ClientHello to ``upstream`` and return the first
    ``records`` TLS records of its answer (and the upstream stream)."""
    server = await trio.open_tcp_stream(LOCALHOST, upstream.port)
    hello = await client.receive_some(65536)
    await server.send_all(hello)
    buffer = b""
    taken = b""
    while records:
        while len(buffer) < _TLS_RECORD_HEADER or len(buffer) < _TLS_RECORD_HEADER + int.from_bytes(
            buffer[3:5], "big"
        ):
            chunk = await server.receive_some(65536)
            if not chunk:
                return server, taken
            buffer += chunk
        end = _TLS_RECORD_HEADER + int.from_bytes(buffer[3:5], "big")
        taken, buffer = taken + buffer[:end], buffer[end:]
        records -= 1
    return server, taken


def _reset(stream: trio.SocketStream) -> None:
    """Make the coming close a TCP reset."""
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def reset_in_server_hello(upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
    """Half a ServerHello, then a TCP reset."""

    async def handle(client: trio.SocketStream) -> None:
        server, hello = await _first_records(upstream, client, 1)
        async with server:
            await client.send_all(hello[: len(hello) // 2])
            await trio.sleep(0.1)
            _reset(client)

    return open_raw_target(handle)


def certificate_flood(announced: int, sent: int) -> HostileTarget:
    """A real ServerHello (TLS 1.2), then a Certificate message announcing
    ``announced`` bytes, and ``sent`` bytes of it in 16 KiB records."""

    def open_flood(upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
        async def handle(client: trio.SocketStream) -> None:
            server, hello = await _first_records(upstream, client, 1)
            async with server:
                await client.send_all(hello)
                # Certificate: type 11, its 3-byte length, the list's 3-byte length.
                message = (
                    b"\x0b" + (announced - 4).to_bytes(3, "big")
                    + (announced - 7).to_bytes(3, "big")
                )
                message += b"\x30" * (sent - len(message))
                try:
                    for offset in range(0, sent, _MAX_RECORD):
                        fragment = message[offset : offset + _MAX_RECORD]
                        await client.send_all(
                            b"\x16\x03\x03" + len(fragment).to_bytes(2, "big") + fragment
                        )
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

        return open_raw_target(handle)

    return open_flood


def dripping(upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
    """The real server's answer, one byte a second."""

    async def handle(client: trio.SocketStream) -> None:
        server, answer = await _first_records(upstream, client, 3)
        async with server:
            try:
                for byte in answer:
                    await client.send_all(bytes([byte]))
                    await trio.sleep(1.0)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    return open_raw_target(handle)


def closed_at_once(_upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
    """Accepts, then closes without reading a byte."""

    async def handle(client: trio.SocketStream) -> None:
        await trio.lowlevel.checkpoint()

    return open_raw_target(handle)


def alert_instead_of_hello(_upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
    """A fatal handshake_failure alert in answer to the ClientHello."""
    return open_garbage_target(b"\x15\x03\x03\x00\x02\x02\x28")


def garbage(_upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
    return open_garbage_target()


def closed_after_server_hello(upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
    return open_truncating_proxy(upstream, records=1)


def reset_after_server_hello(upstream: TLSTarget) -> AbstractAsyncContextManager[RawTarget]:
    return open_truncating_proxy(upstream, records=1, reset=True)


#: (name, target, probe settings, the reason the prober must count)
CASES: list[tuple[str, HostileTarget, dict[str, object], str]] = [
    ("garbage-instead-of-tls", garbage, {}, "handshake"),
    ("alert-instead-of-server-hello", alert_instead_of_hello, {}, "handshake"),
    ("closed-at-once", closed_at_once, {}, "handshake"),
    ("reset-in-server-hello", reset_in_server_hello, {}, "handshake"),
    ("closed-after-server-hello", closed_after_server_hello, {}, "handshake"),
    ("reset-after-server-hello", reset_after_server_hello, {}, "handshake"),
    # OpenSSL refuses a Certificate message over 100 KiB as soon as its
    # header is in...
    ("megabyte-certificate", certificate_flood(1 << 20, 1 << 20), {}, "handshake"),
    # ...so the notary's own bound shows under it: a 90 kB message, 40 kB cap.
    ("certificate-over-the-cap", certificate_flood(90_000, 90_000),
     {"max_handshake_bytes": 40_000}, "handshake"),
    ("one-byte-a-second", dripping, {}, "timeout"),
]


@asynccontextmanager
async def open_world(
    tmp_path: Path, hostile: HostileTarget, probe: dict[str, object]
) -> AsyncIterator[tuple[NotaryUnderTest, RawTarget, TLSTarget]]:
    """A good site, a hostile target relaying (some of) it, and a notary
    that may probe both (named through its resolver)."""
    async with open_tls_target(names=[GOOD], maximum_version=_tls12()) as site:
        async with hostile(site) as target:
            names = {GOOD: [site.host], HOSTILE: [target.host]}
            settings = {"timeout_s": PROBE_TIMEOUT_S, **probe}
            async with open_settled_notary(
                tmp_path, names=names, probe=settings, rescan={"enabled": False},
                admin={"listen": (), "metrics_interval_s": 3600.0},
            ) as notary:
                yield notary, target, site


def _tls12():  # the Certificate message in clear, for the relaying targets
    import ssl

    return ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize(
    ("hostile", "probe", "reason"), [pytest.param(h, p, r, id=n) for n, h, p, r in CASES]
)
async def test_a_misbehaving_target_gets_503_on_time(
    tmp_path: Path,
    hostile: HostileTarget,
    probe: dict[str, object],
    reason: str,
    bytes_read: dict[int, int],
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.WARNING)
    async with open_world(tmp_path, hostile, probe) as (notary, target, site):
        good_fp = format_fingerprint(hashlib.sha1(site.leaf_der(GOOD)).digest())
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            answers: dict[str, object] = {}

            async def ask_hostile() -> None:
                answers["get"] = await legacy_query(notary.port, f"{HOSTILE}+{target.port}", None)

            async def ask_hostile_post() -> None:
                fp = ":".join(["AB"] * 20)
                answers["post"] = await legacy_query(notary.port, f"{HOSTILE}+{target.port}", fp)

            nursery.start_soon(ask_hostile)
            nursery.start_soon(ask_hostile_post)
            # Meanwhile, a good site is answered at once.
            await target.wait_accepted(1)
            good = await legacy_query(notary.port, f"{GOOD}+{site.port}", good_fp)
            assert good.status == 200
            assert trio.current_time() - started < 0.01
        elapsed = trio.current_time() - started
        statistics = notary.running.prober.statistics()
        again = await legacy_query(notary.port, f"{GOOD}+{site.port}", good_fp)
    for answer in (answers["get"], answers["post"]):
        assert answer.status == 503, answer
        assert b"fingerprintList" not in answer.body and b"signature" not in answer.body
        assert answer.headers[b"content-type"].startswith(b"text/plain")
    assert elapsed <= PROBE_TIMEOUT_S + 0.01
    assert statistics.failures.get(reason, 0) >= 1
    assert again.status == 200
    cap = int(probe.get("max_handshake_bytes", DEFAULT_MAX_HANDSHAKE_BYTES))  # type: ignore[call-overload]
    assert bytes_read
    assert max(bytes_read.values()) <= cap + 1
    if "max_handshake_bytes" in probe:  # the notary's own bound stopped it
        assert cap + 1 in bytes_read.values()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == []


async def test_the_handshake_byte_cap_holds_against_a_real_chain(
    tmp_path: Path, bytes_read: dict[int, int], autojump_clock: trio.testing.MockClock
) -> None:
    """A legitimate but long chain (20 intermediates) over a cap of 8 KiB:
    503, and no probe connection read more than the cap allows."""
    async with open_tls_target(names=[HOSTILE], intermediates=20) as site:
        async with open_settled_notary(
            tmp_path, names={HOSTILE: [site.host]},
            probe={"timeout_s": PROBE_TIMEOUT_S, "max_handshake_bytes": 8192},
            rescan={"enabled": False}, admin={"listen": (), "metrics_interval_s": 3600.0},
        ) as notary:
            answer = await legacy_query(notary.port, f"{HOSTILE}+{site.port}", None)
            assert sum(map(len, site.chain_der(HOSTILE))) > 8192
    assert answer.status == 503
    assert max(bytes_read.values()) <= 8192 + 1


async def test_many_hostile_targets_at_once_do_not_block_the_notary(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Thirty slow targets probed at once (a drip each): the good site is
    still answered at once, every hostile query gets its 503 on time."""
    async with open_tls_target(names=[GOOD]) as site:
        async with dripping(site) as target:
            names = {GOOD: [site.host]}
            names.update({f"h{i}.example.test": [target.host] for i in range(30)})
            async with open_settled_notary(
                tmp_path, names=names, probe={"timeout_s": PROBE_TIMEOUT_S},
                rescan={"enabled": False}, admin={"listen": (), "metrics_interval_s": 3600.0},
            ) as notary:
                statuses: list[int] = []
                started = trio.current_time()
                async with trio.open_nursery() as nursery:

                    async def ask(name: str) -> None:
                        answer = await legacy_query(notary.port, f"{name}+{target.port}", None)
                        statuses.append(answer.status)

                    for i in range(30):
                        nursery.start_soon(ask, f"h{i}.example.test")
                    await target.wait_accepted(30)
                    good = await legacy_query(notary.port, f"{GOOD}+{site.port}", None)
                    assert good.status == 200
                    assert trio.current_time() - started < 0.01
                assert trio.current_time() - started <= PROBE_TIMEOUT_S + 0.01
    assert statuses == [503] * 30



@pytest.mark.parametrize(
    ("hostile", "probe", "reason"), [pytest.param(h, p, r, id=n) for n, h, p, r in CASES]
)
async def test_a_misbehaving_address_beside_good_ones_leaves_their_certificates_vouched(
    tmp_path: Path,
    hostile: HostileTarget,
    probe: dict[str, object],
    reason: str,
    bytes_read: dict[int, int],
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 31: a name whose first address misbehaves (every hostile
    target above, on 127.0.0.1) and whose two others serve good
    certificates of their own (127.0.0.2, 127.0.0.3, the same port): the
    good ones are observed and vouched for, on time, the hostile address's
    failure is in the probe's report, and no connection read more than the
    cap."""
    caplog.set_level(logging.WARNING)
    async with open_tls_target(names=[GOOD], maximum_version=_tls12()) as upstream:
        async with hostile(upstream) as target:
            good_addresses = ("127.0.0.2", "127.0.0.3")
            async with open_site(good_addresses, name=HOSTILE, port=target.port) as site:
                names = {HOSTILE: [target.host, *good_addresses]}
                async with open_settled_notary(
                    tmp_path, names=names, probe={"timeout_s": PROBE_TIMEOUT_S, **probe},
                    rescan={"enabled": False},
                    admin={"listen": (), "metrics_interval_s": 3600.0},
                ) as notary:
                    started = trio.current_time()
                    answer = await legacy_query(notary.port, f"{HOSTILE}+{target.port}", None)
                    elapsed = trio.current_time() - started
                    fps = [format_fingerprint(hashlib.sha1(site.leaf_der(a)).digest())
                           for a in good_addresses]
                    posts = [
                        await legacy_query(notary.port, f"{HOSTILE}+{target.port}", fp)
                        for fp in fps
                    ]
                    record = await notary.running.records.lookup(site.target())
                    statistics = notary.running.prober.statistics()
    assert answer.status == 200
    listed = [row["fingerprint"] for row in json.loads(answer.body)["fingerprintList"]]
    assert sorted(listed) == sorted(fps)
    assert [post.status for post in posts] == [200, 200]
    assert elapsed <= PROBE_TIMEOUT_S + 0.01
    assert record is not None and record.last_report is not None
    assert record.last_report.failures == ((LOCALHOST, reason),)
    assert statistics.address_failures.get(reason, 0) >= 1
    cap = int(probe.get("max_handshake_bytes", DEFAULT_MAX_HANDSHAKE_BYTES))  # type: ignore[call-overload]
    assert max(bytes_read.values()) <= cap + 1
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == []


# -- names that are not public DNS names ---------------------------------------------------

#: Special-use and private names (docs/security.md "What it refuses"), each mapped by
#: the notary's resolver to the local site: were one resolved, its query
#: would be answered.
NOT_PUBLIC = (
    "localhost",
    "www.localhost",
    "printer.local",
    "duckduckgogg42xjoc72x3sjasowoarfbgcmvfimaftt6twagswzczad.onion",
    "x.invalid",
    "corp.internal",
    "nas.home.arpa",
    "x.alt",
    "intranet",
)
NOT_PUBLIC_MESSAGE = b"not a public DNS name"


async def _plain_exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` over plain TCP; the status and body of the answer
    (read up to its Content-Length: a relay's tunnel stays open)."""
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(LOCALHOST, port)
        async with stream:
            await stream.send_all(request)
            data = b""
            while True:
                head, found, body = data.partition(b"\r\n\r\n")
                if found:
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    if len(body) >= length:
                        return int(head.split(b" ", 2)[1]), body
                chunk = await stream.receive_some(65536)
                assert chunk, data[:200]
                data += chunk


async def _https_exchange(port: int, request: bytes) -> tuple[int, bytes]:
    answer = await send_raw(port, request)
    return answer.status, answer.body


async def _websocket_exchanges(port: int, host: str, target_port: int) -> list[tuple[int, bytes]]:
    """A v2 query and a watch of ``host`` over one WebSocket: each reply's
    status (200 unless an error) and message."""
    replies = []
    async with trio_websocket.open_websocket(
        LOCALHOST, port, "/v2/ws", use_ssl=client_context()
    ) as ws:
        for message in (
            {"type": "query", "id": 1, "targets": [{"host": host, "port": target_port}]},
            {"type": "watch", "id": 2, "host": host, "port": target_port},
        ):
            await ws.send_message(json.dumps(message))
            reply = json.loads(await ws.get_message())
            status = reply["status"] if reply["type"] == "error" else 200
            replies.append((status, str(reply.get("message", "")).encode()))
    return replies


async def _ask_every_protocol(
    notary: NotaryUnderTest, host: str, port: int
) -> dict[str, tuple[int, bytes]]:
    """Ask about ``host`` port ``port`` every way a client can: what -> (status, body)."""
    api = notary.port
    perspectives = notary.running.perspectives[0].port
    v2_body = json.dumps({"targets": [{"host": host, "port": port}], "nonce": "n"}).encode()
    answers = {
        "convergence GET": await _https_exchange(api, legacy_request(f"{host}+{port}", None)),
        "convergence POST": await _https_exchange(
            api, legacy_request(f"{host}+{port}", ":".join(["AB"] * 20))
        ),
        "v2": await _https_exchange(api, (
            b"POST /v2/query HTTP/1.0\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(v2_body), v2_body)
        )),
        "perspectives port": await _plain_exchange(perspectives, (
            f"GET /?host={host}&port={port}&service_type=2 HTTP/1.0\r\n\r\n".encode()
        )),
        "perspectives on the API": await _https_exchange(
            api, f"GET /?host={host}&port={port} HTTP/1.0\r\n\r\n".encode()
        ),
        "web lookup form": await _https_exchange(
            api, f"GET /site?host={host}&port={port} HTTP/1.0\r\n\r\n".encode()
        ),
        "web site page": await _https_exchange(
            api, f"GET /site/{host}+{port} HTTP/1.0\r\n\r\n".encode()
        ),
        "web check now": await _https_exchange(
            api, f"POST /site/{host}+{port}/check HTTP/1.0\r\nContent-Length: 0\r\n\r\n".encode()
        ),
        "relay CONNECT": await _plain_exchange(
            notary.relay_port, f"CONNECT {host}:4242 HTTP/1.1\r\n\r\n".encode()
        ),
        "relay header": await _plain_exchange(notary.relay_port, (
            f"CONNECT 127.0.0.1:4242 HTTP/1.1\r\nX-Convergence-Notary: {host}+4242\r\n\r\n"
        ).encode()),
    }
    query, watch = await _websocket_exchanges(api, host, port)
    answers["websocket query"], answers["websocket watch"] = query, watch
    return answers


async def test_non_public_names_get_400_from_every_protocol_before_any_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Convergence (GET, POST), v2, the WebSocket (query, watch), Perspectives
    (its port and the API), the web pages (lookup form, site page, check
    now) and the relay (CONNECT line, destination header) answer 400 "not a
    public DNS name", and the resolver is never asked: no oracle for the
    operator's DNS, no .onion name leaked. A name under .test, asked the
    same ways, is resolved and answered."""
    key_path = tmp_path / "perspectives.key"
    crypto.write_new_file(
        key_path, crypto.private_key_pem(crypto.generate_perspectives_key()), mode=0o600
    )
    async with open_tls_target(names=[GOOD, *NOT_PUBLIC]) as site:
        resolver = static_resolver({name: [site.host] for name in (GOOD, *NOT_PUBLIC)})
        monkeypatch.setattr(notaries, "static_resolver", lambda _names: resolver)
        async with open_v2_notary(
            tmp_path, {},
            perspectives={"key_file": key_path, "listen": (Endpoint(LOCALHOST, 0),)},
            relay={"destinations": "public", "dial_port": site.port},
            rescan={"enabled": False}, admin={"listen": (), "metrics_interval_s": 3600.0},
        ) as notary:
            asked = {host: await _ask_every_protocol(notary, host, site.port) for host in NOT_PUBLIC}
            assert resolver.calls == []
            good = await _ask_every_protocol(notary, GOOD, site.port)
            calls = list(resolver.calls)
    for host, answers in asked.items():
        for what, (status, body) in answers.items():
            assert status == 400, (host, what, status, body[:200])
            assert NOT_PUBLIC_MESSAGE in body, (host, what, body[:200])
    # The control: the same requests about GOOD were resolved and answered.
    assert calls and {host for host, _port in calls} == {GOOD}
    assert good["convergence GET"][0] == 200 and good["v2"][0] == 200
    assert good["web site page"][0] == 200 and good["websocket query"][0] == 200
