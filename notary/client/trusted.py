"""The client's directory of notaries it trusts: ``.notary`` bundles fetched
from a file or an HTTPS URL, listed and removed by name.

An I/O edge. The user's trust must not be swappable by someone on the path
of a fetch, nor by a notary with a similar name:

1. A URL is fetched over HTTPS, the server authenticated by the system's
   CA store; or, with ``pin``, by exactly the certificate whose SHA-1 is
   ``pin`` (a notary serving its bundle from its own self-signed host; the
   user has the pin from its operator), the CA store then not consulted.
   A server no CA vouches for is refused without ``pin``, even when the
   bundle it serves pins its certificate: anyone on the path could serve
   such a bundle. A local file is trusted as it is (``pin`` is refused).
2. A bundle replaces a stored bundle of the same name only when their pins
   (:func:`bundle_pins`: each host's certificate SHA-1 and v2 key, the
   log's origin and key) are the same, or with ``replace``; :class:`PinsChanged` says which pins would
   change, and :class:`StoreResult` which did.
3. A file that holds another notary is never overwritten: a bundle whose
   file name (the slug of its name) is taken gets the first free
   ``slug-N.notary`` (:attr:`StoreResult.name_taken_by`). New files are
   made complete under a temporary name and linked into place, which fails
   if the name exists, so neither a crash nor a concurrent fetch leaves half
   a file or replaces one.

Error handling: ``UsageError`` for a bad path, URL or bundle, and
:class:`PinsChanged` (a ``UsageError``), each one line for the CLI;
``BundleFetchFailed`` when the URL cannot be fetched or its server is not
the one expected.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import trio

from notary.errors import NotaryError, PeerError, ProbeError, UsageError
from notary.model.policy import ANY_ADDRESS
from notary.model.targets import normalise_host
from notary.outbound.dialer import Resolver, dial, system_resolver
from notary.protocol import convergence
from notary.protocol.bundle import BUNDLE_SUFFIX, MAX_BUNDLE_BYTES, Bundle, parse_bundle
from notary.protocol.http import parse_response
from notary.state import crypto

__all__ = [
    "BundleFetchFailed",
    "PinsChanged",
    "StoreResult",
    "StoredBundle",
    "bundle_pins",
    "fetch_bundle",
    "list_bundles",
    "remove_bundle",
    "store_bundle",
]

#: At most this many files share one slug (``slug.notary``, ``slug-2.notary``, ...).
MAX_FILES_PER_SLUG = 100


class BundleFetchFailed(NotaryError):
    """A bundle URL could not be fetched (network, TLS, HTTP status), or its
    server is neither trusted by a CA nor the one ``pin`` names."""


@dataclass(frozen=True, slots=True)
class StoredBundle:
    path: Path
    bundle: Bundle


def bundle_pins(bundle: Bundle) -> frozenset[str]:
    """What ``bundle`` makes the client trust: each host's certificate pin
    (SHA-1, ``AA:BB:...``), v2 key (``v2 key <base64>``) and the log's
    verifier key (``log <vkey>``, which names its origin)."""
    pins = {host.sha1_pin for host in bundle.hosts}
    pins |= {f"v2 key {host.v2_key}" for host in bundle.hosts if host.v2_key is not None}
    if bundle.log is not None:
        pins.add(f"log {bundle.log.key}")
    return frozenset(pins)


def format_pins(pins: frozenset[str]) -> str:
    return ", ".join(sorted(pins))


class PinsChanged(UsageError):
    """A bundle would change the pins of a stored notary of the same name
    (rule 2); nothing was written."""

    def __init__(self, stored: StoredBundle, new: Bundle) -> None:
        self.stored = stored
        self.new = new
        super().__init__(
            f"{new.name!r} is stored in {stored.path} with other pins; nothing was changed. "
            f"Old pins: {format_pins(bundle_pins(stored.bundle))}; "
            f"new pins: {format_pins(bundle_pins(new))}. "
            "Pass --replace if the notary's operator confirms the new pins"
        )


@dataclass(frozen=True, slots=True)
class StoreResult:
    """What :func:`store_bundle` did. ``previous``: the stored bundle of the
    same name it replaced; ``name_taken_by``: the other notary whose file
    has the name this bundle's slug gives (so it got another)."""

    stored: StoredBundle
    previous: StoredBundle | None = None
    name_taken_by: StoredBundle | None = None

    @property
    def pins_changed(self) -> bool:
        return self.previous is not None and (
            bundle_pins(self.previous.bundle) != bundle_pins(self.stored.bundle)
        )


def file_name_for(bundle: Bundle) -> str:
    """``Thoughtcrime Labs`` -> ``thoughtcrime-labs.notary`` (its first
    choice: rule 3)."""
    return _slug(bundle) + BUNDLE_SUFFIX


def _slug(bundle: Bundle) -> str:
    return (re.sub(r"[^a-z0-9]+", "-", bundle.name.lower()).strip("-") or "notary")[:80]


async def fetch_bundle(
    source: str,
    *,
    timeout_s: float,
    resolver: Resolver = system_resolver,
    pin: bytes | None = None,
    ca_context: ssl.SSLContext | None = None,
) -> bytes:
    """The bytes of the bundle at ``source``: an ``https://`` URL or a file
    path. They are validated (``UsageError`` if not a valid bundle).

    ``pin``: the SHA-1 (20 bytes) of the certificate the URL's server must
    present (rule 1); ``ca_context``: a client context holding the CAs to
    trust instead of the system's (tests).
    """
    if source.startswith("https://"):
        data = await _fetch_url(
            source, timeout_s=timeout_s, resolver=resolver, pin=pin, ca_context=ca_context
        )
    elif "://" in source:
        raise UsageError(f"{source}: bundles are fetched over https:// only")
    else:
        if pin is not None:
            raise UsageError(
                f"--pin checks the certificate of an https:// server; {source} is a local "
                "file, trusted as it is"
            )
        try:
            data = await trio.Path(source).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror}") from None
    try:
        parse_bundle(data)
    except NotaryError as exc:
        raise UsageError(f"{source}: {exc}") from None
    return data


def store_bundle(directory: Path, data: bytes, *, replace: bool = False) -> StoreResult:
    """Write the bundle ``data`` into ``directory`` (created if needed): over
    the stored bundle of the same name (rule 2: only with the same pins,
    unless ``replace``), else in a new file (rule 3).

    Error handling: ``PinsChanged``; ``UsageError`` for an invalid bundle or
    stored file, or a directory that cannot be written.
    """
    bundle = parse_bundle(data)
    stored = list_bundles(directory)
    same_name = [s for s in stored if s.bundle.name == bundle.name]
    if same_name:
        pins = bundle_pins(bundle)
        changed = next((s for s in same_name if bundle_pins(s.bundle) != pins), None)
        if changed is not None and not replace:
            raise PinsChanged(changed, bundle)
        previous, *duplicates = same_name
        crypto.write_new_file(previous.path, data, mode=0o644, force=True)
        for duplicate in duplicates:  # the same notary stored twice (by hand)
            duplicate.path.unlink(missing_ok=True)
        return StoreResult(StoredBundle(previous.path, bundle), previous=changed or previous)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {directory}: {exc.strerror}") from None
    path = _create_unique(directory, _slug(bundle), data)
    first_choice = file_name_for(bundle)
    taken = None
    if path.name != first_choice:
        taken = next((s for s in stored if s.path.name == first_choice), None)
    return StoreResult(StoredBundle(path, bundle), name_taken_by=taken)


def _create_unique(directory: Path, slug: str, data: bytes) -> Path:
    """A new file ``slug.notary`` (or ``slug-N.notary``, the first free
    name) in ``directory`` holding ``data``, mode 0644 (rule 3)."""
    try:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".fetching-", suffix=".tmp")
    except OSError as exc:
        raise UsageError(f"cannot write in {directory}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.chmod(temporary, 0o644)
        for number in range(1, MAX_FILES_PER_SLUG + 1):
            name = slug if number == 1 else f"{slug}-{number}"
            path = directory / (name + BUNDLE_SUFFIX)
            try:
                os.link(temporary, path)  # never replaces an existing file
            except FileExistsError:
                continue
            return path
    except OSError as exc:
        raise UsageError(f"cannot write in {directory}: {exc.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    raise UsageError(f"{directory} has {MAX_FILES_PER_SLUG} files named {slug}*{BUNDLE_SUFFIX}")


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
    return sorted(stored, key=lambda s: (s.bundle.name.lower(), s.bundle.name))


def remove_bundle(directory: Path, name: str) -> StoredBundle:
    """Remove the bundle called ``name`` (or stored as ``name``.notary)."""
    for stored in list_bundles(directory):
        if name in (stored.bundle.name, stored.path.name, stored.path.stem):
            stored.path.unlink()
            return stored
    raise UsageError(f"no bundle called {name!r} in {directory}")


async def _fetch_url(
    url: str,
    *,
    timeout_s: float,
    resolver: Resolver,
    pin: bytes | None,
    ca_context: ssl.SSLContext | None,
) -> bytes:
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
            if pin is not None:
                context = crypto.unverified_client_context()
                return await _request(url, host, port, path, resolver, context, pin=pin)
            try:
                return await _request(url, host, port, path, resolver, ca_context or _ca_context())
            except trio.BrokenResourceError as exc:
                # Trio wraps the ssl error.
                if not isinstance(exc.__cause__, ssl.SSLCertVerificationError):
                    raise
                reason = exc.__cause__.verify_message or "certificate verify failed"
            presented = await _presented_pin(host, port, resolver)
    except trio.TooSlowError:
        raise BundleFetchFailed(f"{url}: no answer within {timeout_s:g} s") from None
    except ProbeError as exc:
        raise BundleFetchFailed(f"{url}: {exc}") from None
    except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
        raise BundleFetchFailed(f"{url}: connection failed ({exc})") from None
    hint = (
        f"; it presents the certificate with SHA-1 {presented}. If the notary's operator "
        f"confirms that pin, fetch again with --pin {presented}"
        if presented else ""
    )
    raise BundleFetchFailed(
        f"{url}: the server's certificate is not trusted by a CA ({reason}){hint}"
    )


def _ca_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def _presented_pin(host: str, port: int, resolver: Resolver) -> str | None:
    """The SHA-1 of the certificate ``host`` presents, for a message (None
    if it cannot be had)."""
    try:
        stream = await _tls(host, port, resolver, crypto.unverified_client_context())
    except (ProbeError, trio.BrokenResourceError, ssl.SSLError, OSError):
        return None
    try:
        der = stream.getpeercert(binary_form=True) or b""
    finally:
        await trio.aclose_forcefully(stream)
    return convergence.format_fingerprint(hashlib.sha1(der).digest())


async def _tls(
    host: str, port: int, resolver: Resolver, context: ssl.SSLContext
) -> trio.SSLStream[trio.SocketStream]:
    """A TLS connection to ``host`` (SNI for a name), handshake done."""
    tcp, _address = await dial(host, port, policy=ANY_ADDRESS, resolver=resolver)
    literal = ":" in host or host.replace(".", "").isdigit()
    stream = trio.SSLStream(
        tcp, context, server_hostname=None if literal and not context.check_hostname else host,
        https_compatible=True,  # the body is framed by Content-Length, not close_notify
    )
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


async def _request(
    url: str,
    host: str,
    port: int,
    path: str,
    resolver: Resolver,
    context: ssl.SSLContext,
    *,
    pin: bytes | None = None,
) -> bytes:
    """GET ``path`` from ``host`` over TLS with ``context``; with ``pin``,
    from a server presenting that certificate only (checked before the
    request is sent). Returns the body of a 200."""
    stream = await _tls(host, port, resolver, context)
    try:
        der = stream.getpeercert(binary_form=True) or b""
        if pin is not None and hashlib.sha1(der).digest() != pin:
            presented = convergence.format_fingerprint(hashlib.sha1(der).digest())
            raise BundleFetchFailed(
                f"{url}: the server presents the certificate with SHA-1 {presented}, not the "
                f"--pin {convergence.format_fingerprint(pin)}"
            )
        authority = f"[{host}]" if ":" in host else host
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode()
        )
        data = bytearray()
        while chunk := await stream.receive_some(64 * 1024):
            data += chunk
            if len(data) > MAX_BUNDLE_BYTES + 16 * 1024:
                raise BundleFetchFailed(f"{url}: answer too large")
    finally:
        await trio.aclose_forcefully(stream)
    try:
        response = parse_response(bytes(data))
    except PeerError as exc:
        raise BundleFetchFailed(f"{url}: {exc}") from None
    if response.status != 200:
        raise BundleFetchFailed(f"{url}: HTTP {response.status}")
    return response.body
