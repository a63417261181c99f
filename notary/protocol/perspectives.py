"""Perspectives (PROTOCOLS.md section 2): queries, key histories, the signed
blob, the ``notary_reply`` XML, the client's notary list and the index page.

Sans-IO: no sockets, no clock. Times are parameters (whole Unix seconds).

Invariants
1. A service id is ``host:port,2`` in ASCII: the normalised host of
   :class:`~notary.model.targets.Target`, IPv6 literals in brackets
   (``[::1]:443,2``; a bare ``::1:443`` would be ambiguous). It is the
   target's ``key`` plus ``,2``, so the signed id and the cache/store key
   never disagree.
2. The signed blob (:func:`signed_blob`) is: the service id, one NUL byte,
   then every key **in reverse order of the XML**, each as ``>H`` timespan
   count, ``>H`` key length (16), ``B`` key type (3 = SSL), the 16 MD5 bytes,
   then each timespan in XML order as ``>I`` start, ``>I`` end. It is signed
   with RSA PKCS1-v1_5 over MD5 (:mod:`notary.state.crypto`).
3. The order of keys and of timespans is part of what is signed, so the XML
   and the blob are always written from the same sequence, and a parsed reply
   keeps document order. The notary's own histories list timespans by start
   (runs never overlap, :func:`notary.model.observations.add_sighting`) and keys by MD5 ascending, as
   the original notaries did (:func:`canonical_key_order`).
4. :func:`reply_xml` writes one fixed layout, the one of the captured
   replies (``tests/vectors/perspectives/response.1``), so our serialiser
   rebuilds them byte for byte::

       <notary_reply sig="B64" sig_type="rsa-md5" version="1">\\n
       \\t<key fp="aa:bb:..." type="ssl">\\n
       \\t\\t<timestamp end="E" start="S"/>\\n
       \\t</key>\\n
       </notary_reply>\\n

   Attributes in alphabetical order, one tab per level, ``\\n`` line ends,
   a final newline, no XML declaration. Every value is digits, lower-case
   hex and colons, or base64, checked before writing: nothing needs escaping.
5. A run (timespan) is ``[first observed, last observed]`` of a chain of
   observations of one key whose consecutive gaps are at most the merge
   window; runs never include unobserved time before or after.
6. Hostile replies are bounded (:data:`MAX_REPLY_BYTES`), must be ASCII,
   and may not contain a DOCTYPE (hence no entity declarations); any defect is
   a :class:`~notary.errors.ProtocolError` with status 502 (the notary asked
   misbehaved) and a short message.
7. Queries: only ``host``, ``port`` and ``service_type`` (each at most once);
   defaults port 443 and service type 2; anything else is a 400.
"""

from __future__ import annotations

import html
import re
import struct
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import parse_qsl

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from notary.errors import BadTarget, ProtocolError, UsageError
from notary.model.observations import Timeline
from notary.model.targets import Target, make_target, normalise_host, parse_port
from notary.protocol.http import response

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_PORT",
    "KEY_TYPE_SSL",
    "MAX_QUERY_BYTES",
    "MAX_REPLY_BYTES",
    "MAX_TIMESPANS_PER_KEY",
    "MD5_BYTES",
    "REPLY_VERSION",
    "SERVICE_TYPE_SSL",
    "SIG_TYPE",
    "KeyHistory",
    "NotaryListEntry",
    "NotaryListError",
    "ParsedReply",
    "canonical_key_order",
    "format_md5_fingerprint",
    "format_notary_list_entry",
    "index_page",
    "keys_of",
    "parse_md5_fingerprint",
    "parse_notary_list",
    "parse_query",
    "parse_reply",
    "reply_xml",
    "service_id",
    "signed_blob",
]

#: ``service_type`` of TLS services, the only kind this notary observes.
SERVICE_TYPE_SSL = 2
#: Port of a query without ``port``.
DEFAULT_PORT = 443
#: Key type byte of an SSL key in the signed blob.
KEY_TYPE_SSL = 3
#: ``type`` attribute of an SSL key in the XML.
KEY_TYPE_NAME = "ssl"
MD5_BYTES = 16
MD5_FINGERPRINT_CHARS = MD5_BYTES * 3 - 1  # 47: "aa:" * 15 + "aa"
REPLY_VERSION = "1"
SIG_TYPE = "rsa-md5"
CONTENT_TYPE = b"text/xml"
#: The blob writes a key's timespan count in two bytes.
MAX_TIMESPANS_PER_KEY = 0xFFFF
#: Timestamps are written in four unsigned bytes (until 2106).
MAX_TIMESTAMP = 0xFFFFFFFF
#: Largest reply body :func:`parse_reply` looks at. The 11-key captured
#: replies are under 7 KiB.
MAX_REPLY_BYTES = 1024 * 1024
#: Longest query string :func:`parse_query` looks at (a host is at most
#: 1024 characters before normalisation, percent-encoded three times that).
MAX_QUERY_BYTES = 4096
#: Parsed queries remembered (each at most MAX_QUERY_BYTES: 4 MiB in all).
PARSED_QUERIES = 1024
#: Most ``&``-separated fields of a query looked at.
MAX_QUERY_FIELDS = 8
#: Longest comment line of a notary-list entry.
MAX_COMMENT_CHARS = 200

_MD5_FP_RE = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){15}")
_DECIMAL_RE = re.compile(r"[0-9]{1,10}")
_BASE64_RE = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_DOCTYPE_RE = re.compile(r"<!\s*DOCTYPE", re.IGNORECASE)
_QUERY_PARAMETERS = frozenset({"host", "port", "service_type"})
_PEM_BEGIN = "-----BEGIN PUBLIC KEY-----"
_PEM_END = "-----END PUBLIC KEY-----"


# -- service ids and fingerprints -------------------------------------------------


def service_id(target: Target) -> str:
    """``host:port,2`` for ``target`` (invariant 1)."""
    return f"{target.key},{SERVICE_TYPE_SSL}"


def format_md5_fingerprint(md5: bytes) -> str:
    """``md5`` as lower-case hex pairs joined by ``:`` (the ``fp`` attribute)."""
    if len(md5) != MD5_BYTES:
        raise ValueError("an MD5 fingerprint is 16 bytes")
    return md5.hex(":")


def parse_md5_fingerprint(text: str) -> bytes:
    """Parse ``aa:bb:...`` (16 pairs, either case) into 16 bytes.

    Raises ``ProtocolError`` (400) for anything else; :func:`parse_reply`
    turns it into a 502.
    """
    if len(text) != MD5_FINGERPRINT_CHARS or not _MD5_FP_RE.fullmatch(text):
        raise ProtocolError("fp must be 16 hex pairs separated by colons")
    return bytes.fromhex(text.replace(":", ""))


# -- key histories and runs -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyHistory:
    """Every run of observations of one key (certificate) of a service.

    ``md5`` is the MD5 of the leaf certificate's DER; ``timespans`` are
    ``(start, end)`` pairs of whole Unix seconds. The notary's own histories
    are ordered by start and never overlap (:func:`notary.model.observations.add_sighting`); a
    parsed reply keeps the order of the document, because that order is
    signed (invariant 3).

    Raises ``ValueError`` when ``md5`` is not 16 bytes, a timespan is not two
    ints with ``0 <= start <= end < 2**32``, or there are more than
    :data:`MAX_TIMESPANS_PER_KEY` timespans.
    """

    md5: bytes
    timespans: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.md5, bytes) or len(self.md5) != MD5_BYTES:
            raise ValueError("md5 must be 16 bytes")
        try:
            timespans = tuple(tuple(span) for span in self.timespans)
        except TypeError:
            raise ValueError("timespans must be (start, end) pairs") from None
        if len(timespans) > MAX_TIMESPANS_PER_KEY:
            raise ValueError(f"more than {MAX_TIMESPANS_PER_KEY} timespans")
        for span in timespans:
            if len(span) != 2 or not all(_is_timestamp(value) for value in span):
                raise ValueError("a timespan is two timestamps from 0 to 2**32 - 1")
            if span[0] > span[1]:
                raise ValueError("a timespan must not end before it starts")
        object.__setattr__(self, "timespans", timespans)

    @property
    def newest(self) -> int | None:
        """The latest ``end`` of any timespan (None without timespans)."""
        return max((end for _, end in self.timespans), default=None)


def _is_timestamp(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TIMESTAMP


def canonical_key_order(keys: Iterable[KeyHistory]) -> tuple[KeyHistory, ...]:
    """``keys`` by MD5 ascending: the order the original notaries wrote (and
    the captured replies show), one order per set of keys, hence one blob."""
    return tuple(sorted(keys, key=lambda key: key.md5))


def keys_of(timeline: Timeline) -> tuple[KeyHistory, ...]:
    """The key histories of a notary's own ``timeline``, in canonical order
    (invariant 3); a key with more runs than the blob can count keeps its
    newest :data:`MAX_TIMESPANS_PER_KEY`."""
    return canonical_key_order(
        KeyHistory(o.certificate.md5, o.timespans[-MAX_TIMESPANS_PER_KEY:])
        for o in timeline.observations
    )


# -- signed blob and reply XML ---------------------------------------------------------


def signed_blob(service_id: str, keys: Sequence[KeyHistory]) -> bytes:
    """The bytes a Perspectives notary signs (invariant 2); ``keys`` in the
    order of the XML.

    Raises ``ValueError`` when ``service_id`` is not ASCII or contains NUL.
    """
    if not service_id.isascii() or "\0" in service_id:
        raise ValueError("a service id is ASCII without NUL")
    parts = [service_id.encode("ascii"), b"\0"]
    for key in reversed(keys):
        parts.append(struct.pack(">HHB", len(key.timespans), MD5_BYTES, KEY_TYPE_SSL))
        parts.append(key.md5)
        parts.extend(struct.pack(">II", start, end) for start, end in key.timespans)
    return b"".join(parts)


def reply_xml(keys: Sequence[KeyHistory], signature_b64: str) -> bytes:
    """The ``notary_reply`` document for ``keys`` (in that order) and their
    signature, in the layout of invariant 4.

    Raises ``ValueError`` when ``signature_b64`` is not base64 text (so it
    cannot break out of its attribute).
    """
    if not isinstance(signature_b64, str) or not _BASE64_RE.fullmatch(signature_b64):
        raise ValueError("signature must be base64 text")
    lines = [
        f'<notary_reply sig="{signature_b64}" sig_type="{SIG_TYPE}" version="{REPLY_VERSION}">'
    ]
    for key in keys:
        # KeyHistory guarantees 16 bytes and int timestamps: hex, colons and
        # digits only, nothing to escape.
        lines.append(f'\t<key fp="{format_md5_fingerprint(key.md5)}" type="{KEY_TYPE_NAME}">')
        lines.extend(
            f'\t\t<timestamp end="{end:d}" start="{start:d}"/>' for start, end in key.timespans
        )
        lines.append("\t</key>")
    lines.append("</notary_reply>")
    return ("\n".join(lines) + "\n").encode("ascii")


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """A ``notary_reply`` taken apart for verification: ``keys`` in document
    order (rebuild the signed bytes with :func:`signed_blob`)."""

    keys: tuple[KeyHistory, ...]
    signature_b64: str
    version: str
    sig_type: str


def parse_reply(xml: bytes) -> ParsedReply:
    """Parse a reply from any Perspectives notary (invariant 6).

    The document must be ASCII, at most :data:`MAX_REPLY_BYTES`, without
    DOCTYPE; its root is ``notary_reply`` with ``sig``, ``sig_type`` and
    ``version``; its children are ``key`` elements (``type="ssl"``, a valid
    ``fp``) whose children are ``timestamp`` elements with decimal ``start``
    and ``end`` (``start <= end < 2**32``). Whitespace between elements is
    ignored; any other text or element is refused. ``version`` and
    ``sig_type`` are returned, not judged: that is the caller's policy.

    Error handling: raises ``ProtocolError`` with status 502 and a short
    message for any defect; never another exception.
    """
    if not isinstance(xml, bytes | bytearray):
        raise _bad_reply("reply must be bytes")
    if len(xml) > MAX_REPLY_BYTES:
        raise _bad_reply("reply too large")
    try:
        text = bytes(xml).decode("ascii")
    except UnicodeDecodeError:
        raise _bad_reply("reply is not ASCII") from None
    # ElementTree (expat) expands internal entities and a DOCTYPE can declare
    # them: refuse any DOCTYPE before parsing. A str is parsed as UTF-8 whatever
    # the XML declaration says, so no other encoding can hide one.
    if _DOCTYPE_RE.search(text):
        raise _bad_reply("reply must not contain a DOCTYPE")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        raise _bad_reply("reply is not well-formed XML") from None
    if root.tag != "notary_reply":
        raise _bad_reply("root element is not notary_reply")
    signature = _attribute(root, "sig")
    if not _BASE64_RE.fullmatch(signature):
        raise _bad_reply("sig is not base64")
    version = _attribute(root, "version")
    sig_type = _attribute(root, "sig_type")
    _check_no_text(root)
    return ParsedReply(tuple(_parse_key(element) for element in root), signature, version, sig_type)


def _parse_key(element: ElementTree.Element) -> KeyHistory:
    if element.tag != "key":
        raise _bad_reply("unexpected element in notary_reply")
    if _attribute(element, "type") != KEY_TYPE_NAME:
        raise _bad_reply("key type is not ssl")
    try:
        md5 = parse_md5_fingerprint(_attribute(element, "fp"))
    except ProtocolError:
        raise _bad_reply("bad key fp") from None
    _check_no_text(element)
    timespans = []
    for child in element:
        if child.tag != "timestamp":
            raise _bad_reply("unexpected element in key")
        if len(child) or (child.text or "").strip():
            raise _bad_reply("timestamp must be empty")
        timespans.append((_timestamp(child, "start"), _timestamp(child, "end")))
    if len(timespans) > MAX_TIMESPANS_PER_KEY:
        raise _bad_reply("too many timestamps in a key")
    try:
        return KeyHistory(md5, tuple(timespans))
    except ValueError:
        raise _bad_reply("timestamp ends before it starts") from None


def _attribute(element: ElementTree.Element, name: str) -> str:
    value = element.get(name)
    if value is None:
        raise _bad_reply(f"{element.tag} without {name}")
    return value


def _timestamp(element: ElementTree.Element, name: str) -> int:
    text = _attribute(element, name)
    if not _DECIMAL_RE.fullmatch(text) or int(text) > MAX_TIMESTAMP:
        raise _bad_reply(f"timestamp {name} is not a Unix time")
    return int(text)


def _check_no_text(element: ElementTree.Element) -> None:
    """Only whitespace between ``element``'s children."""
    if (element.text or "").strip() or any((child.tail or "").strip() for child in element):
        raise _bad_reply(f"unexpected text in {element.tag}")


def _bad_reply(message: str) -> ProtocolError:
    return ProtocolError(f"malformed notary reply: {message}", status=502)


# -- queries ----------------------------------------------------------------------


def parse_query(query: bytes) -> Target | None:
    """The service a request's query string (the bytes after ``?``) asks
    about (invariant 7), or None when it has no parameters (the index page).

    Queries parsed lately are remembered (the last ``PARSED_QUERIES``, a
    few MiB at most): parsing and normalising a host costs about as much as
    the rest of a cached answer, and clients ask the same services again.
    A query that is refused is not remembered (it raises again).

    ``host`` is required and normalised with
    :func:`~notary.model.targets.make_target`; ``port`` defaults to 443;
    ``service_type`` must be 2 when given. Values are percent-decoded
    (``+`` is a space, as in any form).

    Error handling: ``ProtocolError`` 414 for a query longer than
    :data:`MAX_QUERY_BYTES`; 400 for non-ASCII or undecodable text, an
    unknown or repeated parameter, a missing or empty host, another service
    type; ``BadTarget`` (400) for a host or port that does not normalise.
    Messages never echo the input.
    """
    return _parse_query(bytes(query))


@lru_cache(maxsize=PARSED_QUERIES)
def _parse_query(query: bytes) -> Target | None:
    if len(query) > MAX_QUERY_BYTES:
        raise ProtocolError("query too long", status=414)
    try:
        text = bytes(query).decode("ascii")
        fields = parse_qsl(
            text,
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_QUERY_FIELDS,
        )
    except UnicodeDecodeError:
        raise ProtocolError("query must be ASCII, percent-encoded UTF-8") from None
    except ValueError:
        raise ProtocolError("too many query parameters") from None
    if not fields:
        return None
    values: dict[str, str] = {}
    for name, value in fields:
        if name not in _QUERY_PARAMETERS:
            raise ProtocolError("unknown query parameter (expected host, port, service_type)")
        if name in values:
            raise ProtocolError(f"repeated query parameter {name}")
        values[name] = value
    service_type = values.get("service_type", str(SERVICE_TYPE_SSL))
    if service_type != str(SERVICE_TYPE_SSL):
        raise ProtocolError("only service_type=2 (TLS) is supported")
    host = values.get("host")
    if host is None:
        raise BadTarget("missing host")
    if not host:
        raise BadTarget("empty host")
    return make_target(host, values.get("port", str(DEFAULT_PORT)))


# -- the client's notary list ------------------------------------------------------------


class NotaryListError(UsageError, ValueError):
    """A notary list is malformed; ``line`` is the 1-based line at fault."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True, slots=True)
class NotaryListEntry:
    """One notary of a client's list: where to ask it and its public key
    (PEM, ``-----BEGIN PUBLIC KEY-----`` block ending with a newline)."""

    host: str
    port: int
    public_key_pem: str


def format_notary_list_entry(host_port: str, public_key_pem: str, comment: str | None) -> str:
    """One entry of the client's notary list (the format of
    ``tests/vectors/perspectives/http_notary_list.txt``)::

        # <comment>              (only when comment is given)
        <host:port>
        -----BEGIN PUBLIC KEY-----
        ...
        -----END PUBLIC KEY-----

    Every line ends with ``\\n``, so entries concatenate into a list.

    Raises ``ValueError`` when ``comment`` spans lines or is too long,
    ``host_port`` is not ``host:port``, or ``public_key_pem`` is not one PEM
    public key block.
    """
    lines = []
    if comment is not None:
        if len(comment) > MAX_COMMENT_CHARS or not comment.isprintable():
            raise ValueError("comment must be one printable line")
        lines.append(f"# {comment}".rstrip())
    host, port = _parse_host_port(host_port.strip(), line=1)
    host_text = f"[{host}]" if ":" in host else host
    lines.append(f"{host_text}:{port}")
    pem_lines = public_key_pem.strip().splitlines()
    if len(pem_lines) < 3 or pem_lines[0] != _PEM_BEGIN or pem_lines[-1] != _PEM_END:
        raise ValueError("public_key_pem must be one PEM public key block")
    lines.extend(pem_lines)
    return "\n".join(lines) + "\n"


def parse_notary_list(text: str) -> list[NotaryListEntry]:
    """The entries of a client's notary list, in order: a ``host:port`` line
    then a PEM public key block; ``#`` comment lines and blank lines are
    skipped anywhere except inside a PEM block.

    Raises :class:`NotaryListError` (a ``ValueError``) naming the line: a key
    without a host line, a host line without a key, a bad host or port, an
    unterminated block, a key that does not load as RSA.
    """
    entries: list[NotaryListEntry] = []
    pending: tuple[str, int, int] | None = None  # host, port, line number
    pem: list[str] | None = None
    pem_start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if pem is not None:
            pem.append(line)
            if line == _PEM_END:
                assert pending is not None
                entries.append(_list_entry(pending, pem, pem_start))
                pending, pem = None, None
            elif line.startswith("-----"):
                raise NotaryListError(number, "unexpected PEM boundary inside a key")
            continue
        if not line or line.startswith("#"):
            continue
        if line == _PEM_BEGIN:
            if pending is None:
                raise NotaryListError(number, "public key without a host:port line before it")
            pem, pem_start = [line], number
            continue
        if line.startswith("-----"):
            raise NotaryListError(number, "expected -----BEGIN PUBLIC KEY-----")
        if pending is not None:
            raise NotaryListError(pending[2], "host:port line without a public key after it")
        host, port = _parse_host_port(line, line=number)
        pending = (host, port, number)
    if pem is not None:
        raise NotaryListError(pem_start, "public key block is not terminated")
    if pending is not None:
        raise NotaryListError(pending[2], "host:port line without a public key after it")
    return entries


def _parse_host_port(text: str, *, line: int) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``, normalised."""
    host, colon, port = text.rpartition(":")
    if not colon or not host:
        raise NotaryListError(line, "expected host:port")
    if host.startswith("[") and not host.endswith("]"):
        raise NotaryListError(line, "expected host:port ([v6]:port for IPv6)")
    try:
        return normalise_host(host), parse_port(port)
    except BadTarget as exc:
        raise NotaryListError(line, exc.message) from None


def _list_entry(pending: tuple[str, int, int], pem: list[str], line: int) -> NotaryListEntry:
    text = "\n".join(pem) + "\n"
    try:
        key = serialization.load_pem_public_key(text.encode("ascii"))
    except (ValueError, TypeError, UnicodeEncodeError):
        raise NotaryListError(line, "public key does not load") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise NotaryListError(line, "public key is not RSA")
    return NotaryListEntry(pending[0], pending[1], text)


# -- index page ---------------------------------------------------------------------------


def index_page(
    *,
    version: str,
    public_key_pem: str,
    settings: Mapping[str, str],
    keep_alive: bool = False,
) -> bytes:
    """The complete HTTP 200 ``text/html`` response to ``GET /`` without
    parameters: what this notary is, its software version, its Perspectives
    public key (PEM, for the client's notary list) and the ``settings`` an
    operator chose to publish (e.g. the merge window), all HTML-escaped.
    A full response, like :func:`notary.protocol.relay.relay_page`."""
    rows = "".join(
        f"<tr><th>{html.escape(str(name))}</th><td>{html.escape(str(value))}</td></tr>\n"
        for name, value in sorted(settings.items())
    )
    body = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        "<title>Perspectives notary</title></head>\n<body><h1>Perspectives notary</h1>\n"
        "<p>This host runs a certificate notary. Perspectives clients ask "
        "<code>GET /?host=&lt;name&gt;&amp;port=&lt;n&gt;&amp;service_type=2</code> and "
        "receive the keys this notary has observed for the service, signed "
        f"(RSA, MD5).</p>\n<p>Version: {html.escape(version)}</p>\n"
        f"<h2>Public key</h2>\n<pre>{html.escape(public_key_pem.strip())}</pre>\n"
        f"<h2>Settings</h2>\n<table>\n{rows}</table>\n</body></html>\n"
    ).encode()
    return response(200, body, content_type=b"text/html; charset=utf-8", keep_alive=keep_alive)
