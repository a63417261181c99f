"""Hostile notaries for the client's tests: small Trio TLS servers on
loopback port 0, each presenting ``LEAF`` (a trustme certificate) and pinned
by its bundle (``Hostile.bundle``), answering whatever bytes the test gives,
whole (``sends``), split (``in_pieces``), dripped (``drips``) or never
(``stalls``); or handing the TLS stream to the test's own handler.
``open_hostile_notary`` stops the server (every connection closed) when its
block exits; ``read_request`` and ``http`` read and write one HTTP message."""

from __future__ import annotations

import itertools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import trio
import trustme

from notary.protocol.bundle import Bundle, BundleHost, make_bundle
from tests.support.tls_targets import LOCALHOST

_CA = trustme.CA()
LEAF = _CA.issue_cert(LOCALHOST, "::1", "xn--bcher-kva.example")
PEM = LEAF.cert_chain_pems[0].bytes().decode("ascii")

Handler = Callable[[trio.SSLStream[trio.SocketStream]], Awaitable[None]]
Answer = Callable[[trio.SSLStream[trio.SocketStream], bytes], Awaitable[None]]


async def read_request(stream: trio.abc.ReceiveStream) -> bytes:
    """A request head and its Content-Length body (what the client sends)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length and (chunk := await stream.receive_some(65536)):
        body += chunk
    return data


def http(body: bytes, status: int = 200, **headers: str) -> bytes:
    head = f"HTTP/1.1 {status} Whatever\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    head += "".join(f"{name.replace('_', '-')}: {value}\r\n" for name, value in headers.items())
    return (head + "\r\n").encode("ascii") + body


def sends(data: bytes) -> Answer:
    async def answer(stream: trio.abc.SendStream, _request: bytes) -> None:
        await stream.send_all(data)

    return answer


def drips(data: bytes, every_s: float) -> Answer:
    """Send ``data`` one byte every ``every_s`` seconds."""

    async def answer(stream: trio.abc.SendStream, _request: bytes) -> None:
        for index in range(len(data)):
            await stream.send_all(data[index:index + 1])
            await trio.sleep(every_s)

    return answer


def in_pieces(data: bytes, cuts: list[int], pauses_s: list[float]) -> Answer:
    """Send ``data`` split at ``cuts``, pausing between the pieces."""

    async def answer(stream: trio.abc.SendStream, _request: bytes) -> None:
        edges = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
        for index, (start, end) in enumerate(itertools.pairwise(edges)):
            await stream.send_all(data[start:end])
            if pauses_s:
                await trio.sleep(pauses_s[index % len(pauses_s)])

    return answer


async def stalls(_stream: trio.abc.Stream, _request: bytes) -> None:
    await trio.sleep_forever()


def answering(answer: Answer, requests: list[bytes]) -> Handler:
    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        request = await read_request(stream)
        requests.append(request)
        await answer(stream, request)

    return handle


@dataclass
class Hostile:
    bundle: Bundle
    port: int
    requests: list[bytes] = field(default_factory=list)


def bundle_for(
    port: int, *, name: str = "Hostile", host: str = LOCALHOST, v2_key: str | None = None
) -> Bundle:
    return make_bundle(
        name=name, location="https://127.0.0.1/hostile.notary",
        hosts=[BundleHost(host, port, 80, PEM, v2_key)],
    )


@asynccontextmanager
async def open_hostile_notary(
    behaviour: Answer | None = None,
    *,
    handler: Callable[[list[bytes]], Handler] | None = None,
    name: str = "Hostile",
    host: str = LOCALHOST,
    bundle_host: str | None = None,
) -> AsyncIterator[Hostile]:
    """A TLS server on ``host`` port 0 presenting ``LEAF``: each connection
    reads the request and runs ``behaviour`` (or ``handler(requests)`` gets
    the stream as soon as TLS is up). Yields its pinning bundle."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    LEAF.configure_cert(context)
    requests: list[bytes] = []
    handle = handler(requests) if handler else answering(behaviour or stalls, requests)

    async def serve(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, context, server_side=True)
        try:
            await stream.do_handshake()
            await handle(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host=host))
        port = listeners[0].socket.getsockname()[1]
        yield Hostile(bundle_for(port, name=name, host=bundle_host or host), port, requests)
        nursery.cancel_scope.cancel()
