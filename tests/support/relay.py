"""The bounce relay's lab for tests, on loopback only: notary B on
127.0.0.2 (``B_HOST``, its own key and bundle) and notary A on 127.0.0.1
(``A_HOST``) whose relay trusts B's bundle and dials B's API port
(``open_pair``); a client's connection to A's relay (``open_client``: the
caller closes it) and the reads of its answers; a plain TCP destination on
127.0.0.4 that records who connects (``open_recording_destination``). Names
reach loopback addresses through the notaries' injected resolver. Each
context manager stops what it started when its block exits."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio

from notary.protocol.bundle import BundleHost, make_bundle
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, RawResponse, open_notary, parse_response

A_HOST, B_HOST = "127.0.0.1", "127.0.0.2"
B_NAME = "notary-b.example.test"
TIMEOUT_S = 20


def write_bundle(path: Path, notary: NotaryUnderTest, hosts: list[str]) -> Path:
    pem = crypto.certificate_pem(notary.certificate).decode("ascii")
    bundle = make_bundle(
        name=f"Bundle of {path.stem}",
        location=f"https://{hosts[0]}/{path.name}",
        hosts=[BundleHost(host, 443, 80, pem) for host in hosts],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bundle.to_json())
    return path


@asynccontextmanager
async def open_pair(
    tmp_path: Path, *, b_hosts: list[str] | None = None, **relay: object
) -> AsyncIterator[tuple[NotaryUnderTest, NotaryUnderTest]]:
    """Notary B on 127.0.0.2, then notary A on 127.0.0.1 whose relay trusts
    B's bundle (listing ``b_hosts``) and dials B's API port."""
    async with open_notary(tmp_path / "b", host=B_HOST) as b:
        bundle = write_bundle(tmp_path / "trusted" / "b.notary", b, b_hosts or [B_HOST])
        settings = {"bundles": (bundle.parent,), "dial_port": b.port, **relay}
        names = {B_NAME: [B_HOST]}
        async with open_notary(tmp_path / "a", host=A_HOST, names=names, relay=settings) as a:
            yield a, b


async def open_client(relay_port: int, *, source: str | None = None) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source is not None:
        await sock.bind((source, 0))
    await sock.connect((A_HOST, relay_port))
    return trio.SocketStream(sock)


async def read_head(stream: trio.abc.ReceiveStream) -> tuple[bytes, bytes]:
    """The relay's answer head, and any bytes after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


async def read_all(stream: trio.abc.ReceiveStream) -> bytes:
    chunks = []
    while chunk := await stream.receive_some(65536):
        chunks.append(chunk)
    return b"".join(chunks)


async def refused(relay_port: int, request: bytes) -> RawResponse:
    """Send ``request``; the relay must answer and close."""
    with trio.fail_after(TIMEOUT_S):
        stream = await open_client(relay_port)
        async with stream:
            await stream.send_all(request)
            return parse_response(await read_all(stream))


def connect_request(host: str, *extra_hosts: str) -> bytes:
    """Exactly what the 2011 add-on's NotaryProxyConnector sends."""
    request = f"CONNECT {host}:4242 HTTP/1.1\r\nHost: {host}\r\n"
    for other in extra_hosts:
        request += f"X-Convergence-Notary: {other}+4242\r\n"
    return (request + "\r\n").encode()


@asynccontextmanager
async def open_recording_destination(
    handler: Callable[[trio.SocketStream], Awaitable[None]] | None = None,
) -> AsyncIterator[tuple[int, list[str]]]:
    """A plain TCP server on 127.0.0.4 that records its peers' addresses."""
    peers: list[str] = []

    async def serve(stream: trio.SocketStream) -> None:
        peers.append(stream.socket.getpeername()[0])
        async with stream:
            if handler is not None:
                await handler(stream)
            else:
                await stream.send_all(b"hello from the destination")

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.4"))
        yield listeners[0].socket.getsockname()[1], peers
        nursery.cancel_scope.cancel()
