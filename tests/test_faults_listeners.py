"""Socket-level faults against every listener of a running notary
(``tests.support.faults``, issue 30 item 3): whatever one peer does to its
own connection, the node keeps answering on every listener and no
connection outlives the notary's deadlines.

Each case is one surface and one fault that applies to it. The surfaces:
the HTTPS API, the plain API, the Perspectives port, the relay, the admin
listener, and paths of the HTTPS port: the WebSocket's upgrade at
``/v2/ws`` (``websocket-upgrade``), the frames after it (``websocket``: a
reset mid-request is a reset mid-frame), the witness endpoint ``POST
/v2/witness/add-checkpoint`` and its view ``GET /v2/witness/view/...``.
The fault is done several times in a row, then a few at once while the
node is asked something; then

* every listener answers a real request: a cache hit on both API ports and
  on the Perspectives port, ``/healthz`` on the admin port, a CONNECT and
  a round trip through a tunnel on the relay (and, for the WebSocket and
  witness surfaces, a query over a WebSocket, a cosignature, a view);
* the open connections the notary counts (the gauges of its ``/metrics``:
  HTTP listeners, relay, WebSocket) return to zero within the notary's
  deadlines, while the faulty clients that never read still hold their
  sockets open;
* nothing is logged at ERROR (a traceback is a bug that one peer could
  repeat at will).

On Trio's autojump clock: drips, stalls and the notary's deadlines cost no
real time (the clock jumps after a millisecond of idleness, not at once:
``WORKER_THREAD_S``). One notary per case (the cases are independent and
a notary starts in a few milliseconds; its keys are made once).

Covered elsewhere and not repeated: the timing of each deadline
(tests/test_hostile_slow.py), malformed requests (test_hostile_http.py),
abuse of the relay's destinations (test_hostile_relay.py), the accept
loop alone (test_accept.py), WebSocket limits over memory streams
(test_websocket.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing
import trio_websocket
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from notary.config import Endpoint
from notary.protocol import tlog
from notary.state import crypto
from tests.support.faults import (  # noqa: F401 (the clock: a fixture)
    ClientFault,
    Injected,
    Surface,
    apply,
    client_faults,
    fault_matrix,
    patient_autojump_clock,
    websocket_frame,
)
from tests.support.notaries import (
    NotaryUnderTest,
    RawResponse,
    client_context,
    load_each_key_once,
    open_notary,
    parse_response,
    send_raw,
)
from tests.support.tls_targets import LOCALHOST, TLSTarget, open_raw_target, open_tls_target

SITE = "www.example.test"
#: Each fault this many times in a row, then this many at once.
TIMES, AT_ONCE = 3, 3
#: The notary's deadlines (virtual seconds); every connection a fault
#: leaves behind must be gone within the longest, plus the watchdog's
#: lateness.
HTTP = {
    "header_timeout_s": 10.0, "keepalive_timeout_s": 30.0, "send_timeout_s": 5.0,
    "tls_handshake_timeout_s": 4.0, "linger_timeout_s": 1.0,
}
RELAY = {"head_timeout_s": 10.0, "idle_timeout_s": 20.0, "linger_timeout_s": 1.0}
WEBSOCKET = {"ping_interval_s": 10.0, "ping_timeout_s": 5.0, "idle_timeout_s": 30.0}
CONNECTIONS_GONE_WITHIN_S = 45.0

ORIGIN = "log.test/faults"
LOG_KEY = Ed25519PrivateKey.generate()
WITNESS = {
    "enabled": True, "name": "witness.test/faults",
    "logs": (tlog.verifier_key(ORIGIN, LOG_KEY.public_key().public_bytes_raw()),),
}
_RSA_KEY = crypto.generate_rsa_key()
_PERSPECTIVES_KEY = crypto.private_key_pem(crypto.generate_perspectives_key())


@pytest.fixture(autouse=True)
def one_rsa_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notary of this module gets the same RSA keys, each parsed once
    (a fifth of a second saved per notary; nothing here depends on them)."""
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)
    load_each_key_once(monkeypatch)


def add_checkpoint(old: int, size: int) -> bytes:
    """An ``add-checkpoint`` body for a log of ``size`` made-up leaves."""
    leaves = [tlog.leaf_hash(b"entry %d" % i) for i in range(size)]

    def mth(start: int, end: int) -> bytes:
        if end - start == 1:
            return leaves[start]
        k = 1
        while k * 2 < end - start:
            k *= 2
        return tlog.node_hash(mth(start, start + k), mth(start + k, end))

    def perfect(level: int, index: int) -> bytes:
        return mth(index << level, (index + 1) << level)

    text = tlog.format_checkpoint(tlog.Checkpoint(ORIGIN, size, tlog.root_hash(size, perfect)))
    note = tlog.sign_note(
        text, ORIGIN, LOG_KEY.sign, LOG_KEY.public_key().public_bytes_raw()
    )
    return tlog.format_add_checkpoint(old, tlog.consistency_proof(old, size, perfect), note)


WITNESSED = add_checkpoint(0, 3)
#: What the witness holds of the log, cosigned (``GET``, after ``WITNESSED``).
VIEW_PATH = "/v2/witness/view/" + hashlib.sha256(ORIGIN.encode()).hexdigest()


def post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: notary\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@dataclass
class World:
    """A notary serving every listener, the site it has in cache, and the
    echo server its relay tunnels to."""

    notary: NotaryUnderTest
    site: TLSTarget

    @property
    def ports(self) -> dict[str, int]:
        running = self.notary.running
        return {
            "https": running.api[0].port, "plain": running.plain_api[0].port,
            "perspectives": running.perspectives[0].port, "relay": running.relay[0].port,
            "admin": running.admin[0].port,
        }

    @property
    def target_path(self) -> str:
        return f"/target/{SITE}+{self.site.port}"

    def surface(self, name: str) -> Surface:
        ports = self.ports
        query = f"GET {self.target_path} HTTP/1.1\r\nHost: notary\r\n\r\n".encode()
        fingerprint = ":".join(["AB"] * 20)
        form = post(self.target_path, f"fingerprint={fingerprint}".encode())
        if name in ("https", "plain"):
            return Surface(name, ports[name], query, tls=name == "https", post=form)
        if name == "perspectives":
            request = (
                f"GET /?host={SITE}&port={self.site.port}&service_type=2 HTTP/1.1\r\n"
                "Host: notary\r\n\r\n"
            ).encode()
            return Surface(name, ports[name], request, post=post("/", b"x=1"))
        if name == "admin":
            return Surface(
                name, ports[name], b"GET /healthz HTTP/1.1\r\nHost: notary\r\n\r\n",
                flood=b"GET /metrics HTTP/1.1\r\nHost: notary\r\n\r\n" * 50,
                post=post("/healthz", b"x=1"),
            )
        if name == "relay":
            connect = b"CONNECT 127.0.0.1:4242 HTTP/1.1\r\nHost: 127.0.0.1:4242\r\n\r\n"
            return Surface(name, ports[name], connect, flood=connect + b"x" * (4 << 20))
        query_frame = websocket_frame(json.dumps({
            "type": "query", "id": 1, "targets": [{"host": SITE, "port": self.site.port}],
            "nonce": "n",
        }).encode())
        if name == "websocket-upgrade":
            # Flooding: frames sent before the 101 came (RFC 6455 says to
            # wait for it).
            return Surface(
                name, ports["https"], WEBSOCKET_HANDSHAKE, tls=True,
                flood=WEBSOCKET_HANDSHAKE + query_frame * 200,
            )
        if name == "websocket":
            # After the upgrade: a reset mid-request is a reset mid-frame.
            return Surface(
                name, ports["https"], query_frame, tls=True, flood=query_frame * 200,
                handshake=WEBSOCKET_HANDSHAKE,
            )
        if name == "witness":
            request = post("/v2/witness/add-checkpoint", WITNESSED)
            return Surface(name, ports["https"], request, tls=True, flood=request * 5)
        if name == "witness-view":
            request = f"GET {VIEW_PATH} HTTP/1.1\r\nHost: notary\r\n\r\n".encode()
            return Surface(name, ports["https"], request, tls=True)
        raise AssertionError(name)


WEBSOCKET_HANDSHAKE = (
    b"GET /v2/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
)


async def echo(stream: trio.SocketStream) -> None:
    """The relay's destination: sends back what it gets, passes on the end."""
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


@asynccontextmanager
async def open_world(tmp_path: Path) -> AsyncIterator[World]:
    key = tmp_path / "perspectives.key"
    crypto.write_new_file(key, _PERSPECTIVES_KEY, mode=0o600)
    v2_key = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    loopback = (Endpoint(LOCALHOST, 0),)
    async with open_tls_target(names=[SITE]) as site, open_raw_target(echo) as destination:
        async with open_notary(
            tmp_path / "notary", names={SITE: [site.host]},
            server={"plain_api": loopback},
            perspectives={"key_file": key, "listen": loopback},
            relay={"destinations": "public", "dial_port": destination.port, **RELAY},
            v2={"key_file": v2_key}, witness=WITNESS,
            http=HTTP, websocket=WEBSOCKET,
            answers={"failures_at_deadline": False},
            rescan={"enabled": False},
            # No background work ticking along with the virtual clock (the
            # change feed reads the store in a worker thread).
            store={"feed_interval_ms": 3_600_000},
            admin={"listen": loopback, "metrics_interval_s": 3600.0},
        ) as notary:
            await notary.running.stored.settled.wait()
            world = World(notary, site)
            # The site in cache: every later query of it is a hit.
            answer = await send_raw(world.ports["https"], http10(world.target_path))
            assert answer.status == 200
            yield world


def http10(path: str) -> bytes:
    return f"GET {path} HTTP/1.0\r\n\r\n".encode()


async def plain_exchange(port: int, request: bytes) -> tuple[int, bytes]:
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(LOCALHOST, port)
        async with stream:
            await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    answer = parse_response(data)
    return answer.status, answer.body


async def relay_round_trip(port: int) -> bytes:
    """A CONNECT through the relay to the echo server: what came back."""
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(LOCALHOST, port)
        async with stream:
            await stream.send_all(b"CONNECT 127.0.0.1:4242 HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                assert chunk, data
                data += chunk
            assert data.split(b" ", 2)[1] == b"200", data
            tunnelled = data.partition(b"\r\n\r\n")[2]
            await stream.send_all(b"ping")
            while len(tunnelled) < 4:
                tunnelled += await stream.receive_some(65536)
    return tunnelled


async def websocket_query(world: World) -> dict:
    with trio.fail_after(20):
        async with trio_websocket.open_websocket(
            LOCALHOST, world.ports["https"], "/v2/ws", use_ssl=client_context()
        ) as ws:
            await ws.send_message(json.dumps({
                "type": "query", "id": 1, "targets": [{"host": SITE, "port": world.site.port}],
                "nonce": "n",
            }))
            return json.loads(await ws.get_message())


async def assert_node_answers(world: World, surface: str) -> None:
    """A real request on every listener, answered."""
    ports, path = world.ports, world.target_path
    assert (await send_raw(ports["https"], http10(path))).status == 200
    assert (await plain_exchange(ports["plain"], http10(path)))[0] == 200
    perspectives = f"/?host={SITE}&port={world.site.port}&service_type=2"
    assert (await plain_exchange(ports["perspectives"], http10(perspectives)))[0] == 200
    assert await plain_exchange(ports["admin"], http10("/healthz")) == (200, b"ok\n")
    assert await relay_round_trip(ports["relay"]) == b"ping"
    if surface.startswith("websocket"):
        assert (await websocket_query(world))["type"] == "answer"
    if surface == "witness":
        # A first cosignature, unless a faulty request got one (then the
        # size held), then the same tree head again: cosigned again.
        first = await witness_add(world, add_checkpoint(0, 3))
        assert first.status == 200 or (first.status, first.body) == (409, b"3\n"), first
        assert (await witness_add(world, add_checkpoint(3, 3))).status == 200
    if surface == "witness-view":
        view = await send_raw(world.ports["https"], http10(VIEW_PATH))
        assert view.status == 200 and view.body.startswith(b"log.test/faults\n3\n"), view


async def witness_add(world: World, body: bytes) -> RawResponse:
    request = post("/v2/witness/add-checkpoint", body)
    return await send_raw(world.ports["https"], request.replace(b"HTTP/1.1", b"HTTP/1.0", 1))


def open_connections(world: World) -> dict[str, float]:
    """The connections the notary counts as open, by listener: the gauges
    of its own metrics, folded and exposed here, in the Trio thread
    (``/metrics`` renders in a worker thread, during which the autojump
    clock would run on)."""
    metrics = world.notary.running.metrics
    assert metrics is not None
    metrics.fold()
    wanted = {
        f'notary_http_connections{{listener="{listener}"}}': listener
        for listener in ("api", "plain_api", "perspectives", "admin")
    }
    wanted |= {"notary_relay_connections": "relay", "notary_websocket_connections": "websocket"}
    counts = dict.fromkeys(wanted.values(), -1.0)
    for line in metrics.exposition().decode().splitlines():
        sample, _, number = line.rpartition(" ")
        if sample in wanted:
            counts[wanted[sample]] = float(number)
    return counts


async def assert_connections_return_to_zero(world: World) -> None:
    """Every connection the faults opened is gone within the notary's
    deadlines (checked once a virtual second)."""
    idle = dict.fromkeys(("api", "plain_api", "perspectives", "admin", "relay", "websocket"), 0)
    with trio.move_on_after(CONNECTIONS_GONE_WITHIN_S):
        while open_connections(world) != idle:  # noqa: ASYNC110 (counters, no event)
            await trio.sleep(1.0)
    assert open_connections(world) == idle


#: Each surface and the faults that apply to it.
SURFACES: dict[str, tuple[ClientFault, ...]] = {
    "https": client_faults(tls=True, http=True),
    "plain": client_faults(http=True),
    "perspectives": client_faults(http=True),
    "admin": client_faults(http=True),
    "relay": client_faults(),
    # Paths on the HTTPS port: its port's faults are the "https" cases.
    "websocket-upgrade": client_faults(listener=False),
    "websocket": client_faults(listener=False),
    "witness": client_faults(listener=False, http=True),
    # A GET: no body to expect, nothing to upgrade.
    "witness-view": client_faults(listener=False),
}
MATRIX = fault_matrix(SURFACES)


@pytest.mark.parametrize(("surface", "fault"), MATRIX)
async def test_a_fault_ends_only_its_own_connection(
    tmp_path: Path, surface: str, fault: ClientFault, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.ERROR)
    held: list[Injected] = []
    try:
        async with open_world(tmp_path) as world:
            target = world.surface(surface)
            if surface == "witness-view":  # something held: each view made reads and signs
                assert (await witness_add(world, WITNESSED)).status == 200
            for _ in range(TIMES):
                held.append(await apply(fault, target))
            async with trio.open_nursery() as nursery:

                async def inject() -> None:
                    held.append(await apply(fault, target))

                for _ in range(AT_ONCE):
                    nursery.start_soon(inject)
                await assert_node_answers(world, surface)  # meanwhile
            await assert_node_answers(world, surface)
            await assert_connections_return_to_zero(world)
    finally:
        for injected in held:
            injected.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
