"""The benchmarks' own client, on loopback only (``LOOPBACK``, ports from
``free_ports``): a connection, one request and its whole response, the parts
of a response, a server's metrics. For set-up checks, not measurements.
``connect``'s socket is its caller's to close (``with``); ``exchange`` and
``get_metrics`` close theirs before returning. An answer cut short, without
``Content-Length`` or not 200 where one is needed is a ``BenchError``."""

from __future__ import annotations

import contextlib
import re
import socket
import ssl

import trio

from .project import BenchError

LOOPBACK = "127.0.0.1"
CONTENT_TYPE = "application/x-www-form-urlencoded"


def free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def client_tls_context() -> ssl.SSLContext:
    """Loopback only, and the pin is checked by comparing hashes, not by a CA."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def resumed_reconnections(port: int, request: bytes, count: int,
                          context: ssl.SSLContext | None = None) -> int:
    """A first TLS connection to ``port`` (``context``: the client's, by default
    ``client_tls_context()``), then ``count`` more, each offering its session
    (or ticket): how many resumed. Each sends ``request`` and reads to the
    server's close (a TLS 1.3 ticket arrives while the answer is read)."""
    context = context or client_tls_context()
    session, resumed = None, 0
    for _ in range(count + 1):
        with socket.create_connection((LOOPBACK, port), timeout=10.0) as raw, \
                context.wrap_socket(raw, session=session) as sock:
            sock.sendall(request)
            while sock.recv(65536):
                pass
            resumed += sock.session_reused
            session = session or sock.session
    return resumed


def connect(port: int, *, tls: bool, timeout_s: float) -> socket.socket:
    """A connection to ``port``, to use in ``with`` (a failed TLS handshake closes it)."""
    sock = socket.create_connection((LOOPBACK, port), timeout=timeout_s)
    return client_tls_context().wrap_socket(sock) if tls else sock


def _take_response(buffer: bytearray) -> bytes | None:
    """The first whole response (head + Content-Length body) in ``buffer``,
    taken out of it; None while it is not all there."""
    head_end = buffer.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    match = re.search(rb"\r\ncontent-length:\s*(\d+)", bytes(buffer[:head_end]).lower())
    if match is None:
        raise BenchError(f"response without Content-Length: {bytes(buffer[:200])!r}")
    end = head_end + 4 + int(match.group(1))
    if len(buffer) < end:
        return None
    response = bytes(buffer[:end])
    del buffer[:end]
    return response


def read_response(sock: socket.socket, buffer: bytearray) -> bytes:
    """One whole response (head + Content-Length body) from ``sock``."""
    while (response := _take_response(buffer)) is None:
        data = sock.recv(65536)
        if not data:
            raise BenchError(f"connection closed mid-response: {bytes(buffer[:200])!r}")
        buffer += data
    return response


async def receive_response(stream: trio.abc.ReceiveStream, buffer: bytearray) -> bytes:
    """``read_response`` on a Trio stream: one whole response from a
    keep-alive connection, the bytes after it left in ``buffer``."""
    while (response := _take_response(buffer)) is None:
        data = await stream.receive_some(65536)
        if not data:
            raise BenchError(f"connection closed mid-response: {bytes(buffer[:200])!r}")
        buffer += data
    return response


def exchange(port: int, request: bytes, *, tls: bool, count: int = 1,
             timeout_s: float = 10.0) -> list[bytes]:
    """Send ``request`` ``count`` times on one keep-alive connection, one at a time."""
    responses = []
    with connect(port, tls=tls, timeout_s=timeout_s) as sock:
        buffer = bytearray()
        for _ in range(count):
            sock.sendall(request)
            responses.append(read_response(sock, buffer))
    return responses


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


def header_of(response: bytes, name: str) -> str | None:
    head = response.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    match = re.search(rf"\r\n[ \t]*{re.escape(name)}[ \t]*:([^\r]*)", head, re.IGNORECASE)
    return match.group(1).strip() if match else None


def post_request(port: int, path: str, body: str, *, version: str = "1.1") -> bytes:
    """The request wrk sends with ``wrk_script`` (same headers, same order);
    ``version="1.0"``: the legacy client's (no Host needed, closes)."""
    return (
        f"POST {path} HTTP/{version}\r\nHost: {LOOPBACK}:{port}\r\n"
        f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode("ascii")


def get_metrics(port: int) -> list[tuple[str, float]]:
    """(name with labels, value) of every sample of ``GET /metrics`` on ``port``."""
    request = f"GET /metrics HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n\r\n".encode()
    response = exchange(port, request, tls=False)[0]
    if status_of(response) != 200:
        raise BenchError(f"GET /metrics answered {response[:200]!r}")
    samples = []
    for line in body_of(response).decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name and not name.startswith("#"):
            with contextlib.suppress(ValueError):
                samples.append((name, float(value)))
    return samples
