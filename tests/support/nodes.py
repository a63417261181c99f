"""A node as an operator runs it, for tests: ``notary serve`` with workers
in a subprocess (``run_node``: loopback only, its log lines collected), its
plain-HTTP port once every worker is ready (``plain_port``), one request to
it that tells a refused connection from a broken answer (``get``), and TLS
probe targets on 127.0.0.1 (``tls_targets``). ``run_node`` sends the node
SIGTERM when its block exits, and SIGKILL if it has not stopped 20 s later."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trustme

from tests.support.notaries import LOCALHOST, make_notary_files

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Node:
    process: trio.Process
    log: list[str] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    async def wait_for(self, pattern: str, *, after: int = 0, timeout_s: float = 30.0) -> re.Match:
        """The first log line (from index ``after``) matching ``pattern``."""
        with trio.fail_after(timeout_s):
            while True:
                for line in self.log[after:]:
                    match = re.search(pattern, line)
                    if match:
                        return match
                self.changed = trio.Event()
                await self.changed.wait()


@asynccontextmanager
async def run_node(
    directory: Path, *, workers: int = 2, extra: Sequence[str] = (), more_config: str = ""
) -> AsyncIterator[Node]:
    """``notary serve`` with ``workers`` in a subprocess (``more_config``:
    TOML sections appended to the configuration)."""
    key, cert, _ = make_notary_files(directory)
    for path in (key, cert):
        path.chmod(0o644)  # readable after a privilege drop
    config = directory / "notary.toml"
    config.write_text(
        f'[server]\nkey_file = "{key}"\ncert_file = "{cert}"\ndb_file = "notary.db"\n'
        f'api = ["{LOCALHOST}:0"]\nplain_api = ["{LOCALHOST}:0"]\n'
        f'allow_targets = ["127.0.0.0/8"]\n'
        f'[relay]\nlisten = []\n[admin]\nlisten = []\n'
        f'[probe]\ntimeout_s = 5.0\n'
        f'[node]\nworkers = {workers}\ngraceful_timeout_s = 10.0\nrestart_delay_s = 0.2\n'
        + more_config
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "notary", "serve", "--config", str(config), *extra],
        stderr=subprocess.PIPE, env=env, cwd=directory,
    )
    node = Node(process)

    async def collect() -> None:
        buffer = b""
        async for chunk in process.stderr:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            node.log += [line.decode() for line in lines]
            node.changed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect)
        try:
            yield node
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with trio.move_on_after(20):
                await process.wait()
            if process.returncode is None:
                process.kill()
            nursery.cancel_scope.cancel()


async def plain_port(node: Node, workers: int = 2) -> int:
    match = await node.wait_for(r"plain-HTTP API .* on 127\.0\.0\.1:(\d+)")
    await node.wait_for(rf"node ready: {workers} workers serving")
    return int(match.group(1))


async def get(port: int, path: str) -> tuple[str, int]:
    """One HTTP/1.0 request on a new connection: ("answered", status),
    ("refused", 0) when the node did not take it (connection refused, or
    closed before any byte of an answer), ("broken", 0) otherwise."""
    try:
        stream = await trio.open_tcp_stream(LOCALHOST, port)
    except OSError:
        return "refused", 0
    data = b""
    try:
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            while chunk := await stream.receive_some(65536):
                data += chunk
    except (trio.BrokenResourceError, OSError):
        if not data:
            return "refused", 0
        return "broken", 0
    if not data:
        return "refused", 0
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
    length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    if not match or not length or int(length.group(1)) != len(body):
        return "broken", 0
    return "answered", int(match.group(1))


@asynccontextmanager
async def tls_targets(count: int) -> AsyncIterator[list[int]]:
    """``count`` TLS servers on 127.0.0.1 (one per port): probe targets."""
    authority = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert(LOCALHOST).configure_cert(context)

    async def serve(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, context, server_side=True)
        with trio.move_on_after(10):
            try:
                await stream.do_handshake()
                await stream.receive_some(1)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    listeners = [(await trio.open_tcp_listeners(0, host=LOCALHOST))[0] for _ in range(count)]
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(trio.serve_listeners, serve, [listener])
        yield [listener.socket.getsockname()[1] for listener in listeners]
        nursery.cancel_scope.cancel()
