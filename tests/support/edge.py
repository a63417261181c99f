"""TLS at the edge, for tests: PROXY protocol headers as an edge writes them,
a raw client that connects from a chosen loopback address, and real edges
(nginx's ``stream`` module, HAProxy) run as throwaway processes on loopback.

``open_nginx_edge`` / ``open_haproxy_edge`` start the edge in the foreground
as a child of the test, in a directory of its own (configuration, PID file,
error log), listening with TLS on a free loopback port with the notary's
certificate and key and passing every connection to ``upstream`` (the
notary's plain API listener) with a PROXY header (nginx: version 1, the only
one its stream module writes; HAProxy: ``send-proxy-v2``); they are stopped
by PID when the block exits. Both skip the test when the program is not
installed (``.ci/install-tools tests`` installs ``nginx``,
``libnginx-mod-stream`` and ``haproxy``).
"""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from notary.protocol.proxyheader import V2_SIGNATURE

LOCALHOST = "127.0.0.1"
#: How long an edge may take to listen.
START_TIMEOUT_S = 10.0


def proxy_v1(source: str, port: int = 40000, *, destination: str = "192.0.2.80") -> bytes:
    """A version 1 header naming ``source``:``port`` (IPv4 or IPv6)."""
    family = "TCP6" if ":" in source else "TCP4"
    if ":" in source and ":" not in destination:
        destination = "2001:db8::80"
    return f"PROXY {family} {source} {destination} {port} 443\r\n".encode()


def proxy_v2(
    source: str | None, port: int = 40000, *, command: int = 1, tlvs: bytes = b"",
) -> bytes:
    """A version 2 header: ``PROXY`` over TCP naming ``source``:``port``,
    or, with ``source`` None, an ``UNSPEC`` block (what a ``LOCAL``
    health check sends, ``command`` 0)."""
    if source is None:
        family, block = 0x00, b""
    elif ":" in source:
        family = 0x21
        block = (socket.inet_pton(socket.AF_INET6, source)
                 + socket.inet_pton(socket.AF_INET6, "2001:db8::80"))
    else:
        family = 0x11
        block = socket.inet_pton(socket.AF_INET, source) + socket.inet_pton(
            socket.AF_INET, "192.0.2.80"
        )
    if source is not None:
        block += struct.pack("!HH", port, 443)
    block += tlvs
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(block)) + block


async def exchange(
    port: int, data: bytes, *, source: str = LOCALHOST, timeout_s: float = 60.0
) -> bytes:
    """Connect to ``port`` on loopback from ``source``, send ``data``, read
    until the server closes (a reset is a close): what it answered, b""
    for a connection closed without an answer."""
    with trio.fail_after(timeout_s):
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        await sock.bind((source, 0))
        await sock.connect((LOCALHOST, port))
        stream = trio.SocketStream(sock)
        answer = b""
        async with stream:
            try:
                await stream.send_all(data)
                while chunk := await stream.receive_some(65536):
                    answer += chunk
            except trio.BrokenResourceError:
                pass
    return answer


def free_port() -> int:
    """A TCP port free on loopback now (an edge binds it next)."""
    with socket.socket() as probe:
        probe.bind((LOCALHOST, 0))
        return int(probe.getsockname()[1])


def nginx_stream_module() -> str | None:
    """The ``load_module`` line nginx needs for its ``stream`` module: ""
    when built in, None when nginx or the module is missing."""
    nginx = _program("nginx")
    if nginx is None:
        return None
    built = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=False).stderr
    if "--with-stream " in built + " " and "--with-stream=dynamic" not in built:
        return ""
    found = re.search(r"--modules-path=(\S+)", built)
    module = Path(found.group(1) if found else "/usr/lib/nginx/modules") / "ngx_stream_module.so"
    return f"load_module {module};" if module.exists() else None


def nginx_config(directory: Path, *, port: int, upstream: int, cert: Path, key: Path,
                 load_module: str, workers: int = 1) -> str:
    """A throwaway nginx: TLS on ``port`` with the notary's certificate,
    each connection passed to ``upstream`` after a PROXY header (v1)."""
    return f"""{load_module}
daemon off;
worker_processes {workers};
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 4096; }}
stream {{
    server {{
        listen {LOCALHOST}:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        proxy_pass {LOCALHOST}:{upstream};
        proxy_protocol on;
    }}
}}
"""


def haproxy_config(directory: Path, *, port: int, upstream: int, pem: Path) -> str:
    """A throwaway HAProxy: TLS on ``port`` with the notary's certificate
    and key (one PEM file), each connection passed to ``upstream`` after a
    PROXY v2 header."""
    return f"""global
    pidfile {directory}/haproxy.pid
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend edge
    bind {LOCALHOST}:{port} ssl crt {pem}
    default_backend notary
backend notary
    server notary {LOCALHOST}:{upstream} send-proxy-v2
"""


@contextmanager
def _running(command: list[str], port: int, log: Path) -> Iterator[int]:
    """Run ``command`` until the block exits (stopped by PID); yields
    ``port`` once something listens there (a blocking wait of a few
    milliseconds: nothing in the test's Trio run needs to answer meanwhile)."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise AssertionError(f"{command[0]} exited: {log.read_text()[-2000:]}")
            try:
                socket.create_connection((LOCALHOST, port), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{command[0]} does not listen on {port}") from None
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _program(name: str) -> str | None:
    found = shutil.which(name)
    if found is None and Path(f"/usr/sbin/{name}").exists():
        found = f"/usr/sbin/{name}"
    return found


@contextmanager
def open_nginx_edge(directory: Path, *, upstream: int, cert: Path, key: Path) -> Iterator[int]:
    """nginx in front of ``upstream``; yields its TLS port."""
    load_module = nginx_stream_module()
    nginx = _program("nginx")
    if load_module is None or nginx is None:
        pytest.skip("nginx with its stream module is not installed "
                    "(.ci/install-tools tests installs nginx and libnginx-mod-stream)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "nginx.conf"
    config.write_text(nginx_config(
        directory, port=port, upstream=upstream, cert=cert, key=key, load_module=load_module,
    ))
    with _running([nginx, "-p", str(directory), "-c", str(config)], port,
                  directory / "output.log") as listening:
        yield listening


@contextmanager
def open_haproxy_edge(directory: Path, *, upstream: int, cert: Path, key: Path) -> Iterator[int]:
    """HAProxy in front of ``upstream``; yields its TLS port."""
    haproxy = _program("haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed (.ci/install-tools tests installs it)")
    directory.mkdir(parents=True, exist_ok=True)
    pem = directory / "notary.pem"
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    pem.chmod(0o600)
    port = free_port()
    config = directory / "haproxy.cfg"
    config.write_text(haproxy_config(directory, port=port, upstream=upstream, pem=pem))
    with _running([haproxy, "-db", "-f", str(config)], port, directory / "output.log") as listening:
        yield listening
