"""A real notary in-process for end-to-end tests, and a legacy-style client.

``open_notary`` runs ``serve_notary`` on 127.0.0.1 port 0 with a fresh key,
certificate and database under a temporary directory, an injected resolver and
a controllable clock. ``legacy_query`` speaks exactly like the 2011 browser
add-on: HTTP/1.0, no Host header, TLS without SNI, reads until the server
closes, and pins the notary's certificate by SHA-1.
"""

from __future__ import annotations

import hashlib
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from notary.config import Config, Endpoint, load_config
from notary.outbound.dialer import Resolver
from notary.protocol.bundle import BundleHost, make_bundle
from notary.server.app import RunningNotary, serve_notary
from notary.server.sockets import Sockets
from notary.state import crypto
from tests.support.tls_targets import static_resolver

LOCALHOST = "127.0.0.1"


class FakeClock:
    """Wall-clock seconds that tests can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def load_each_key_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``crypto.load_private_key`` parse each PEM once per process: a
    notary loads its RSA keys four times at start (the TLS context, the
    signers), each parse checking the key at a few tens of milliseconds,
    which adds up in modules starting a notary per case with one key."""
    real = crypto.load_private_key
    loaded: dict[bytes, object] = _LOADED_KEYS

    def load(path: Path) -> object:
        data = Path(path).read_bytes()
        if data not in loaded:
            loaded[data] = real(path)
        return loaded[data]

    monkeypatch.setattr(crypto, "load_private_key", load)


_LOADED_KEYS: dict[bytes, object] = {}


@dataclass
class NotaryUnderTest:
    running: RunningNotary
    config: Config
    certificate: x509.Certificate
    clock: FakeClock

    @property
    def port(self) -> int:
        return self.running.api[0].port

    @property
    def relay_port(self) -> int:
        return self.running.relay[0].port

    @property
    def sha1_pin(self) -> bytes:
        return hashlib.sha1(self.certificate.public_bytes(Encoding.DER)).digest()


def admin_port(notary: NotaryUnderTest) -> int:
    """The port of the notary's first admin listener."""
    return notary.running.admin[0].port


def make_notary_files(
    directory: Path, name: str = LOCALHOST
) -> tuple[Path, Path, x509.Certificate]:
    directory.mkdir(parents=True, exist_ok=True)
    key = crypto.generate_rsa_key()
    cert = crypto.make_self_signed_certificate(key, name)
    key_path, cert_path = directory / "notary.key", directory / "notary.crt"
    crypto.write_new_file(key_path, crypto.private_key_pem(key), mode=0o600)
    crypto.write_new_file(cert_path, crypto.certificate_pem(cert), mode=0o644)
    return key_path, cert_path, cert


@asynccontextmanager
async def open_notary(
    directory: Path,
    *,
    names: Mapping[str, Sequence[str]] | None = None,
    allow_targets: Sequence[str] = ("127.0.0.0/8",),
    host: str = LOCALHOST,
    relay: Mapping[str, object] | None = None,
    server: Mapping[str, object] | None = None,
    serve_bundle: bool = False,
    sockets: Sockets | None = None,
    shared_store: bool = False,
    resolver: Resolver | None = None,
    **sections: dict,
) -> AsyncIterator[NotaryUnderTest]:
    """Serve a notary on ``host`` (API and relay on port 0) until the block
    exits, then stop it and wait until it has drained its write queue.
    ``server`` and ``relay`` override keys of those sections (``relay`` by default:
    bundles mode, no trusted bundle, loopback destinations allowed); ``sections``
    override other config sections, e.g. ``probe={"timeout_s": 0.5}``.
    ``serve_bundle``: serve ``/test.notary``, a bundle pinning this notary.
    ``sockets``: listening sockets to serve on instead of binding the config's.
    ``shared_store``: as ``serve_notary``'s (a worker of a node).
    ``resolver``: the prober's (default: ``names`` mapped statically; pass
    ``system_resolver`` to let the notary choose, as it does in production)."""
    key_path, cert_path, cert = make_notary_files(directory, host)
    if serve_bundle:
        bundle = make_bundle(
            name=f"Test notary {host}",
            location=f"https://{host}/test.notary",
            hosts=[BundleHost(host, 443, 80, crypto.certificate_pem(cert).decode("ascii"))],
        )
        crypto.write_new_file(directory / "test.notary", bundle.to_json(), mode=0o644)
        server = {"bundle_file": directory / "test.notary", **(server or {})}
    overrides = {
        "server": {
            "key_file": key_path,
            "cert_file": cert_path,
            "db_file": directory / "notary.db",
            "api": (Endpoint(host, 0),),
            "allow_targets": tuple(allow_targets),
            **(server or {}),
        },
        "relay": {
            "listen": (Endpoint(host, 0),),
            "allow_addresses": ("127.0.0.0/8",),
            **(relay or {}),
        },
        **sections,
    }
    overrides.setdefault("admin", {"listen": (Endpoint(host, 0),)})
    # Perspectives' default is 0.0.0.0:8080: every interface, a fixed port
    # (two test runs at once collided on it).
    perspectives = overrides.get("perspectives")
    if isinstance(perspectives, dict) and "listen" not in perspectives:
        overrides["perspectives"] = {**perspectives, "listen": (Endpoint(host, 0),)}
    config = load_config(None, overrides)
    if sockets is None:
        _check_loopback_only(config)
    clock = FakeClock()
    async with trio.open_nursery() as nursery:
        running = await nursery.start(
            lambda task_status: serve_notary(
                config,
                resolver=resolver or static_resolver(names or {}),
                clock=clock,
                sockets=sockets,
                shared_store=shared_store,
                task_status=task_status,
            )
        )
        try:
            yield NotaryUnderTest(running, config, cert, clock)
        finally:
            running.stop()


def _check_loopback_only(config: Config) -> None:
    """Refuse a test notary that would listen beyond loopback (a section
    left at its production default: every interface, a fixed port)."""
    listening = {
        "server.api": config.server.api, "server.plain_api": config.server.plain_api,
        "relay.listen": config.relay.listen, "admin.listen": config.admin.listen,
    }
    if config.perspectives.key_file is not None:
        listening["perspectives.listen"] = config.perspectives.listen
    for where, endpoints in listening.items():
        for endpoint in endpoints:
            assert ipaddress.ip_address(endpoint.host).is_loopback, (
                f"a test notary listens on {endpoint} ({where}): tests stay on loopback"
            )


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    peer_sha1: bytes


def parse_response(data: bytes, peer_sha1: bytes = b"") -> RawResponse:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(status, headers, body, peer_sha1)


def client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # authenticated by the SHA-1 pin instead
    return context


@asynccontextmanager
async def open_v2_notary(
    tmp_path: Path, names: Mapping[str, Sequence[str]], *,
    v2: Mapping[str, object] | None = None, **sections: object,
) -> AsyncIterator[NotaryUnderTest]:
    """``open_notary`` in ``tmp_path / "n"`` serving v2 with a fresh Ed25519
    key (``v2``: more ``[v2]`` settings), failures answered at once: for
    tests about answers, not timing (tests/test_abuse.py covers
    ``failures_at_deadline``); ``sections`` as ``open_notary``'s."""
    key_path = tmp_path / "v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    async with open_notary(
        tmp_path / "n", names=names, v2={"key_file": key_path, **(v2 or {})},
        answers={"failures_at_deadline": False}, **sections,  # type: ignore[arg-type]
    ) as notary:
        yield notary


async def send_raw(port: int, request: bytes, *, timeout_s: float = 20.0) -> RawResponse:
    """Send ``request`` over TLS without SNI and read until the server closes."""
    with trio.fail_after(timeout_s):
        tcp = await trio.open_tcp_stream(LOCALHOST, port)
        return await exchange_over_tls(tcp, request)


async def exchange_over_tls(tcp: trio.abc.Stream, request: bytes) -> RawResponse:
    """Run TLS (no SNI) over ``tcp`` (closed afterwards), send ``request``,
    read until the server closes."""
    stream = trio.SSLStream(tcp, client_context(), server_hostname=None, https_compatible=True)
    async with stream:
        await stream.do_handshake()
        peer = stream.getpeercert(binary_form=True)
        await stream.send_all(request)
        chunks = []
        while chunk := await stream.receive_some(65536):
            chunks.append(chunk)
    return parse_response(b"".join(chunks), hashlib.sha1(peer).digest())


def legacy_request(target: str, fingerprint: str | None) -> bytes:
    """The 2011 add-on's request: POST with a form body, or GET."""
    if fingerprint is None:
        request = f"GET /target/{target} HTTP/1.0\r\n\r\n".encode()
    else:
        body = f"fingerprint={fingerprint}".encode()
        request = (
            f"POST /target/{target} HTTP/1.0\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
    return request


def sha1_fp(der: bytes) -> str:
    """The certificate ``der``'s fingerprint as a Convergence query sends it:
    its SHA-1 in upper-case hex pairs joined by ``:``."""
    return ":".join(f"{b:02X}" for b in hashlib.sha1(der).digest())


async def legacy_query(port: int, target: str, fingerprint: str | None) -> RawResponse:
    """Ask the notary on ``port`` as the 2011 add-on did."""
    return await send_raw(port, legacy_request(target, fingerprint))


__all__ = [
    "FakeClock",
    "NotaryUnderTest",
    "admin_port",
    "client_context",
    "exchange_over_tls",
    "legacy_query",
    "legacy_request",
    "load_each_key_once",
    "open_notary",
    "open_v2_notary",
    "send_raw",
    "sha1_fp",
]
