"""The HTTP connection loop's own cost, in one process, without the network's
noise: the notary's accept loop and ``serve_http_connection`` against the
plainest Trio code doing the same work, same run, same socket pairs.

    .venv/bin/python bench/bench_connection.py          # about a minute
    .venv/bin/python bench/bench_connection.py --quick  # a smoke run

Measurements, each the minimum over rounds of microseconds per unit:

1. a connection (HTTP/1.0, the server closes): ``serve_http_connection`` on
   the notary's ``SocketStream`` with a watchdog and a synchronous answer,
   against a task reading the request from a ``trio.SocketStream``, sending
   the same answer and closing;
2. a keep-alive request on one connection: the same loop against a
   receive-then-send loop;
3. accepting connections queued on a listening socket, a task each that
   closes its stream at once: ``notary.server.accept.serve_socket`` making
   the HTTP listeners' ``SocketStream`` (and, a fourth row, Trio's own
   stream, as for the relay) against ``trio.SocketListener.accept`` in a
   loop (both include making the clients' connections).

What it leaves out: TLS (``bench_tls.py``), parsing cost beyond one small
request, the kernel's share of a real client. Compare the same script at two
commits, or the ratios, not rates across machines. Loopback only (socket
pairs and one listener on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from notary.config import HttpConfig
from notary.server.accept import serve_socket, trio_stream
from notary.server.connection import Watchdog, serve_http_connection
from notary.server.sockstream import SocketStream

REQUEST = b"GET /target/example.com+443 HTTP/1.0\r\nHost: notary\r\n\r\n"
KEEP_ALIVE_REQUEST = b"GET /target/example.com+443 HTTP/1.1\r\nHost: notary\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
KEEP_ALIVE_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run, not a measurement")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each (minimum kept)")
    parser.add_argument("--cpu", type=int, default=0,
                        help="the core to run on (default 0; -1: not pinned)")
    return parser.parse_args(argv)


async def timed(rounds: int, count: int, body: Callable[[], Awaitable[None]]) -> float:
    """The least microseconds per unit over ``rounds`` runs of ``body``
    (``count`` units each)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        await body()
        best = min(best, (time.perf_counter() - started) / count * 1e6)
    return best


async def connections(count: int, *, notary: bool, watchdog: Watchdog) -> None:
    limits = HttpConfig()
    for _ in range(count):
        client, server = socket.socketpair()
        with client:
            client.sendall(REQUEST)
            if notary:
                await serve_http_connection(
                    SocketStream(server), answer, limits, None, answer_at_once, watchdog)
            else:
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(server))
                await stream.receive_some(65536)
                await stream.send_all(ANSWER)
                await stream.aclose()
            client.recv(4096)


async def answer(request: object) -> tuple[bytes, bool]:
    return ANSWER, False


def answer_at_once(request: object, client: object) -> tuple[bytes, bool]:
    return (KEEP_ALIVE_ANSWER, True) if getattr(request, "keep_alive", False) else (ANSWER, False)


async def keep_alive(count: int, *, notary: bool, watchdog: Watchdog) -> None:
    client_socket, server = socket.socketpair()
    client = trio.SocketStream(trio.socket.from_stdlib_socket(client_socket))

    async def minimal() -> None:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(server))
        while await stream.receive_some(65536):
            await stream.send_all(KEEP_ALIVE_ANSWER)
        await stream.aclose()

    limits = HttpConfig(max_requests_per_connection=count + 1)
    async with trio.open_nursery() as nursery:
        if notary:
            nursery.start_soon(serve_http_connection, SocketStream(server), answer, limits, None,
                               answer_at_once, watchdog)
        else:
            nursery.start_soon(minimal)
        for _ in range(count):
            await client.send_all(KEEP_ALIVE_REQUEST)
            await client.receive_some(4096)
        await client.aclose()


async def accepting(count: int, *, notary: bool, trio_streams: bool = False) -> None:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(count)
    clients = [socket.create_connection(listening.getsockname()) for _ in range(count)]
    done = trio.Event()
    closed = 0

    async def handler(stream: trio.abc.Stream) -> None:
        nonlocal closed
        await stream.aclose()
        closed += 1
        if closed == count:
            done.set()

    async with trio.open_nursery() as nursery:
        if notary:
            # The HTTP listeners' stream, or Trio's (the relay's, the admin listener's).
            make_stream = trio_stream if trio_streams else SocketStream
            nursery.start_soon(serve_socket, listening, handler, nursery, make_stream)
        else:
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(listening))

            async def accept_loop() -> None:
                while True:
                    nursery.start_soon(handler, await listener.accept())

            nursery.start_soon(accept_loop)
        await done.wait()
        nursery.cancel_scope.cancel()
    for client in clients:
        client.close()


async def measure(args: argparse.Namespace) -> list[tuple[str, str, float, float]]:
    rounds = 1 if args.quick else args.rounds
    count = 200 if args.quick else 20_000
    queued = 200 if args.quick else 2_000
    rows = []
    async with trio.open_nursery() as nursery:
        watchdog = Watchdog()
        await nursery.start(watchdog.run)
        cases = (
            ("a connection (HTTP/1.0, closed after the answer)", "connection", count,
             partial(connections, count, watchdog=watchdog)),
            ("a keep-alive request", "request", count,
             partial(keep_alive, count, watchdog=watchdog)),
            ("accepting a queued connection (task, close)", "connection", queued,
             partial(accepting, queued)),
            ("accepting a queued connection on Trio's stream (the relay's)", "connection", queued,
             partial(accepting, queued, trio_streams=True)),
        )
        for name, unit, units, body in cases:
            ours = await timed(rounds, units, partial(body, notary=True))
            baseline = await timed(rounds, units, partial(body, notary=False))
            rows.append((name, unit, ours, baseline))
        nursery.cancel_scope.cancel()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with_cpu = ""
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity") and args.cpu in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {args.cpu})
        with_cpu = f", pinned to CPU {args.cpu}"
    print("# The HTTP connection loop in one process: the notary against plain Trio")
    print(f"command: python {' '.join(sys.argv)}")
    print(f"CPython {sys.version.split()[0]}, trio {trio.__version__}{with_cpu}; "
          f"minimum of {1 if args.quick else args.rounds} round(s)"
          + (" (--quick: not a measurement)" if args.quick else ""))
    print()
    print("| what | notary us per unit | plain Trio us per unit | notary / plain Trio |")
    print("| --- | --- | --- | --- |")
    for name, unit, ours, baseline in trio.run(measure, args):
        print(f"| {name}, per {unit} | {ours:.1f} | {baseline:.1f} | {ours / baseline:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
