"""A minimal Trio HTTP/1.1 server: the ceiling of ``bench_http.py`` and ``bench_tls.py``.

Those scripts run it on loopback (``--port P --response FILE [--cert C --key K]``): it
answers every request with the bytes of FILE and does nothing else (bench/README.md).
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

import trio

RECEIVE_BYTES = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024  # a longer head without its end closes the connection
_CONTENT_LENGTH = b"\r\ncontent-length:"


class _ScanParser:
    """Counts the complete requests in a byte stream by byte scanning."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> int:
        """Add ``data``; the number of requests it completed (``ValueError``: bad head, length)."""
        buffer = self._buffer + data if self._buffer else data
        count = 0
        start = 0
        while True:
            head_end = buffer.find(b"\r\n\r\n", start)
            if head_end < 0:
                if len(buffer) - start > MAX_HEAD_BYTES:
                    raise ValueError("request head too large")
                break
            head = buffer[start:head_end].lower()
            length = 0
            at = head.find(_CONTENT_LENGTH)
            if at >= 0:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + len(_CONTENT_LENGTH):line_end if line_end >= 0 else None])
            end = head_end + 4 + length
            if end > len(buffer):
                break
            count += 1
            start = end
        self._buffer = buffer[start:]
        return count


class _HttptoolsParser:
    """Counts the complete requests in a byte stream with httptools."""

    __slots__ = ("_count", "_parser")

    def __init__(self) -> None:
        import httptools

        self._count = 0
        self._parser = httptools.HttpRequestParser(self)

    def on_message_complete(self) -> None:
        self._count += 1

    def feed(self, data: bytes) -> int:
        import httptools

        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise ValueError(str(exc)) from None
        count, self._count = self._count, 0
        return count


def make_connection_handler(
    response: bytes,
    new_parser: Callable[[], _ScanParser | _HttptoolsParser],
    context: ssl.SSLContext | None,
    close: bool = False,
) -> Callable[[trio.SocketStream], object]:
    async def serve_connection(tcp: trio.SocketStream) -> None:
        stream: trio.abc.Stream = tcp
        if context is not None:
            stream = trio.SSLStream(tcp, context, server_side=True, https_compatible=True)
        parser = new_parser()
        try:
            while True:
                data = await stream.receive_some(RECEIVE_BYTES)
                if not data:
                    break
                count = parser.feed(data)
                if count and close:  # one request per connection (HTTP/1.0 clients)
                    await stream.send_all(response)
                    break
                if count == 1:
                    await stream.send_all(response)
                elif count:
                    await stream.send_all(response * count)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    return serve_connection


def make_ssl_context(cert: Path, key: Path, *, resumption: bool = True) -> ssl.SSLContext:
    """The notary's TLS settings (``make_server_ssl_context``); ``resumption=False``: no tickets."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["http/1.1"])
    if not resumption:
        context.options |= ssl.OP_NO_TICKET
        context.num_tickets = 0
    return context


async def serve(args: argparse.Namespace) -> None:
    response = args.response.read_bytes()
    context = (make_ssl_context(args.cert, args.key, resumption=not args.no_resumption)
               if args.cert else None)
    new_parser = _HttptoolsParser if args.parser == "httptools" else _ScanParser
    handler = make_connection_handler(response, new_parser, context, args.close)
    listeners = await trio.open_tcp_listeners(args.port, host=args.host)
    print(f"minimal server ({args.parser}, {'TLS' if context else 'plain'}) on "
          f"{args.host}:{args.port}", flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="loopback address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--response", type=Path, required=True, help="the response bytes (file)")
    parser.add_argument("--parser", choices=["scan", "httptools"], default="scan")
    parser.add_argument("--cert", type=Path, help="serve TLS with this certificate (PEM)")
    parser.add_argument("--key", type=Path, help="private key of --cert (PEM)")
    parser.add_argument("--close", action="store_true", help="close after one answer (HTTP/1.0)")
    parser.add_argument("--no-resumption", action="store_true", help="TLS: no session tickets")
    args = parser.parse_args(argv)
    if not ipaddress.ip_address(args.host).is_loopback:
        parser.error("--host must be a loopback address")
    if bool(args.cert) != bool(args.key):
        parser.error("--cert and --key go together")
    trio.run(serve, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
