"""One HTTP/1.0 request to a notary on loopback, for tests: ``http_get``
over plain TCP (the admin, Perspectives and plain-HTTP API ports), ``get``
and ``post_json`` over TLS without SNI (the API port, by
``tests.support.notaries.send_raw``). Each opens its own connection, reads
until the server closes it and closes it; each fails the test after 20 s
(``trio.TooSlowError``) and lets a refused or reset connection raise."""

from __future__ import annotations

import json

import trio

from tests.support.notaries import LOCALHOST, RawResponse, parse_response, send_raw


async def http_get(port: int, path: str, method: str = "GET") -> tuple[int, bytes, bytes]:
    """Status, head and body of one plain HTTP/1.0 request."""
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream(LOCALHOST, port)
        async with stream:
            await stream.send_all(f"{method} {path} HTTP/1.0\r\n\r\n".encode())
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


def header(head: bytes, name: bytes) -> bytes:
    """The value of the header ``name`` (lower case) in an answer's ``head``,
    b"" when it has none."""
    return parse_response(head).headers.get(name, b"")


async def get(port: int, path: str) -> RawResponse:
    """One GET over TLS."""
    return await send_raw(port, f"GET {path} HTTP/1.0\r\n\r\n".encode())


async def post_json(port: int, path: str, document: object) -> tuple[int, bytes]:
    """Status and body of one POST of ``document`` as JSON over TLS."""
    body = json.dumps(document).encode()
    answer = await send_raw(port, (
        f"POST {path} HTTP/1.0\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body)
    return answer.status, answer.body
