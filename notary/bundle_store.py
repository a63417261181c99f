"""The client's directory of notaries it trusts: ``.notary`` bundles fetched
from a file or an HTTPS URL, listed and removed by name.

An I/O edge. A bundle is fetched over HTTPS with the system's CA store; a
notary that serves its bundle from its own self-signed host is accepted too
when the certificate it presents is one the bundle itself pins (the bundle
vouches for the connection that delivered it; an attacker in the middle
would have to forge a bundle pinning their own certificate, which the user
sees as a new notary).

Error handling: ``UsageError`` for a bad path, URL or bundle (one line for
the CLI); ``BundleFetchFailed`` when the URL cannot be fetched.
"""

from __future__ import annotations

import hashlib
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import trio

from notary import crypto
from notary.dialer import Resolver, dial, system_resolver
from notary.errors import NotaryError, PeerError, ProbeError, UsageError
from notary.policy import ANY_ADDRESS
from notary.protocol import convergence
from notary.protocol.bundle import BUNDLE_SUFFIX, MAX_BUNDLE_BYTES, Bundle, parse_bundle
from notary.protocol.http import parse_response
from notary.protocol.targets import normalise_host

__all__ = [
    "BundleFetchFailed",
    "StoredBundle",
    "fetch_bundle",
    "list_bundles",
    "remove_bundle",
    "store_bundle",
]



class BundleFetchFailed(NotaryError):
    """A bundle URL could not be fetched (network, TLS, HTTP status)."""


@dataclass(frozen=True, slots=True)
class StoredBundle:
    path: Path
    bundle: Bundle


def file_name_for(bundle: Bundle) -> str:
    """``Thoughtcrime Labs`` -> ``thoughtcrime-labs.notary``."""
    slug = re.sub(r"[^a-z0-9]+", "-", bundle.name.lower()).strip("-") or "notary"
    return slug[:80] + BUNDLE_SUFFIX


async def fetch_bundle(
    source: str, *, timeout_s: float, resolver: Resolver = system_resolver
) -> bytes:
    """The bytes of the bundle at ``source``: an ``https://`` URL or a file
    path. They are validated (``UsageError`` if not a valid bundle)."""
    if source.startswith("https://"):
        data = await _fetch_url(source, timeout_s=timeout_s, resolver=resolver)
    elif "://" in source:
        raise UsageError(f"{source}: bundles are fetched over https:// only")
    else:
        try:
            data = await trio.Path(source).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror}") from None
    try:
        parse_bundle(data)
    except NotaryError as exc:
        raise UsageError(f"{source}: {exc}") from None
    return data


def store_bundle(directory: Path, data: bytes) -> tuple[StoredBundle, bool]:
    """Write the bundle ``data`` into ``directory`` (created if needed),
    replacing a stored bundle of the same name. Returns it and whether one
    was replaced."""
    bundle = parse_bundle(data)
    replaced = [s for s in list_bundles(directory) if s.bundle.name == bundle.name]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name_for(bundle)
    crypto.write_new_file(path, data, mode=0o644, force=True)
    for old in replaced:
        if old.path != path:
            old.path.unlink(missing_ok=True)
    return StoredBundle(path, bundle), bool(replaced)


def list_bundles(directory: Path) -> list[StoredBundle]:
    """Every valid bundle in ``directory``, by name (an invalid file raises
    ``UsageError`` naming it)."""
    if not directory.is_dir():
        return []
    stored = []
    for path in sorted(directory.iterdir()):
        if path.name.endswith(BUNDLE_SUFFIX):
            try:
                stored.append(StoredBundle(path, parse_bundle(path.read_bytes())))
            except (OSError, NotaryError) as exc:
                raise UsageError(f"bundle {path}: {exc}") from None
    return sorted(stored, key=lambda s: s.bundle.name.lower())


def remove_bundle(directory: Path, name: str) -> StoredBundle:
    """Remove the bundle called ``name`` (or stored as ``name``.notary)."""
    for stored in list_bundles(directory):
        if name in (stored.bundle.name, stored.path.name, stored.path.stem):
            stored.path.unlink()
            return stored
    raise UsageError(f"no bundle called {name!r} in {directory}")


async def _fetch_url(url: str, *, timeout_s: float, resolver: Resolver) -> bytes:
    parts = urlsplit(url)
    try:
        host = normalise_host(parts.hostname or "")
        port = parts.port or 443
    except (NotaryError, ValueError):
        raise UsageError(f"{url}: not a valid https URL") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        with trio.fail_after(timeout_s):
            try:
                data, _der = await _request(host, port, path, resolver, verify=True)
                return data
            except trio.BrokenResourceError as exc:
                # Trio wraps the ssl error. A self-signed notary host: fetch
                # again and accept only what the bundle itself pins.
                if not isinstance(exc.__cause__, ssl.SSLCertVerificationError):
                    raise
                data, der = await _request(host, port, path, resolver, verify=False)
        return _check_self_pinned(url, data, der)
    except trio.TooSlowError:
        raise BundleFetchFailed(f"{url}: no answer within {timeout_s:g} s") from None
    except ProbeError as exc:
        raise BundleFetchFailed(f"{url}: {exc}") from None
    except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
        raise BundleFetchFailed(f"{url}: connection failed ({exc})") from None


def _check_self_pinned(url: str, data: bytes, der: bytes) -> bytes:
    try:
        bundle = parse_bundle(data)
    except NotaryError as exc:
        raise UsageError(f"{url}: {exc}") from None
    presented = convergence.format_fingerprint(hashlib.sha1(der).digest())
    if presented not in {h.sha1_pin for h in bundle.hosts}:
        raise BundleFetchFailed(
            f"{url}: the server's certificate is neither trusted by a CA nor pinned by "
            "the bundle it serves"
        )
    return data


async def _request(
    host: str, port: int, path: str, resolver: Resolver, *, verify: bool
) -> tuple[bytes, bytes]:
    if verify:
        context = ssl.create_default_context()
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    else:
        context = crypto.unverified_client_context()
    tcp, _address = await dial(host, port, policy=ANY_ADDRESS, resolver=resolver)
    literal = ":" in host or host.replace(".", "").isdigit()
    stream = trio.SSLStream(
        tcp, context, server_hostname=host if verify or not literal else None,
        https_compatible=True,  # the body is framed by Content-Length, not close_notify
    )
    try:
        await stream.do_handshake()
        der = stream.getpeercert(binary_form=True) or b""
        authority = f"[{host}]" if ":" in host else host
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode()
        )
        data = bytearray()
        while chunk := await stream.receive_some(64 * 1024):
            data += chunk
            if len(data) > MAX_BUNDLE_BYTES + 16 * 1024:
                raise BundleFetchFailed(f"https://{authority}{path}: answer too large")
    finally:
        await trio.aclose_forcefully(stream)
    try:
        response = parse_response(bytes(data))
    except PeerError as exc:
        raise BundleFetchFailed(f"https://{host}{path}: {exc}") from None
    if response.status != 200:
        raise BundleFetchFailed(f"https://{host}{path}: HTTP {response.status}")
    return response.body, der
