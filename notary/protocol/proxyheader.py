"""The PROXY protocol header (HAProxy's ``proxy-protocol.txt``, versions 1
and 2), sans-IO: bytes in, a parsed header, "need more", or an error.

A TLS terminator in front of the notary (nginx's ``stream`` module, HAProxy)
opens one connection to the notary's plain API listener per client and
writes, before the client's bytes, a header naming the client's address
(docs/edge.md). ``parse_proxy_header`` reads it from the first bytes of such
a connection; ``starts_with_proxy_header`` tells whether a connection from
an address not allowed to send one begins with one (it is then refused).

Rules:

1. Version 2 (binary) begins with the 12-byte ``V2_SIGNATURE``, then a byte
   of version (must be 2) and command (``LOCAL`` 0 or ``PROXY`` 1, others
   refused), a byte of family (``UNSPEC`` 0, ``INET`` 1, ``INET6`` 2,
   ``UNIX`` 3) and transport (``UNSPEC`` 0, ``STREAM`` 1, ``DGRAM`` 2), and
   the length of what follows (big-endian, two bytes).
2. A version 2 header longer than ``MAX_V2_HEADER_BYTES`` in all (536: the
   smallest MSS every TCP host accepts, RFC 1122; the spec has senders send
   the header "at once", in one segment) is refused as soon as its length
   is read, without waiting for its bytes: the longest address block
   (``UNIX``, 216 bytes) leaves room for 284 bytes of TLVs.
3. ``LOCAL`` (a health check of the edge itself), family ``UNSPEC`` or
   ``UNIX``, or transport ``UNSPEC``: the header names no client; the
   connection's own address is the client's (``ProxyHeader.source`` None).
   ``PROXY`` over ``INET``/``INET6`` ``STREAM``: the source address and
   port are the client's. ``DGRAM`` is refused (a TCP listener relays no
   datagrams).
4. The bytes after the address block are TLVs (type, two-byte length,
   value): skipped, each checked to lie within the header's declared length.
   Under ``LOCAL``, ``UNSPEC`` and unknown address layouts everything after
   the 16 fixed bytes is skipped unread.
5. Version 1 (text) is one line ``PROXY TCP4|TCP6 <src> <dst> <sport>
   <dport>\\r\\n`` with single spaces, canonical decimal ports (no leading
   zeros), addresses of the family named; at most ``MAX_V1_HEADER_BYTES``
   (107) bytes with its CRLF, else refused. A CR or LF alone is refused.
   ``PROXY UNKNOWN`` and anything up to the CRLF: the connection's own
   address (rule 3).
6. Bytes that are a proper prefix of a header are "need more" (None);
   bytes that cannot begin one are refused (``ProxyHeaderError``, reason
   ``missing``).

Error handling: every refusal is a ``ProxyHeaderError`` with a short
``reason`` word (for counts and logs) and a message; nothing else is raised
for any input.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from notary.errors import PeerError

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_V1_HEADER_BYTES",
    "MAX_V2_HEADER_BYTES",
    "V1_PREFIX",
    "V2_SIGNATURE",
    "ProxyHeader",
    "ProxyHeaderError",
    "parse_proxy_header",
    "starts_with_proxy_header",
]

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
#: Version 1's longest line, its CRLF included (the spec's worst case).
MAX_V1_HEADER_BYTES = 107
#: Version 2's longest header accepted (rule 2).
MAX_V2_HEADER_BYTES = 536
#: The most bytes a header may take, either version.
MAX_HEADER_BYTES = max(MAX_V1_HEADER_BYTES, MAX_V2_HEADER_BYTES)

_V2_FIXED_BYTES = 16
_LOCAL, _PROXY = 0x0, 0x1
_UNSPEC, _INET, _INET6, _UNIX = 0x0, 0x1, 0x2, 0x3
_STREAM, _DGRAM = 0x1, 0x2
#: The address block of each family (rule 3): addresses, then ports.
_ADDRESS_BYTES = {_INET: 12, _INET6: 36, _UNIX: 216}
_AddressType = type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address]
_V1_FAMILIES: dict[bytes, _AddressType] = {
    b"TCP4": ipaddress.IPv4Address, b"TCP6": ipaddress.IPv6Address,
}


class ProxyHeaderError(PeerError):
    """The first bytes of a connection are not an acceptable PROXY header
    (or one came from an address not allowed to send it). ``reason`` is a
    short word: ``missing``, ``version``, ``command``, ``family``,
    ``too-long``, ``malformed``, ``address``, ``tlv``. Never answered: the
    connection is closed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A whole header: its ``length`` in bytes (what to skip before the
    client's bytes), its ``version`` (1 or 2), and the client's address
    and port (``source`` None: none named, the connection's own is the
    client's, rule 3)."""

    length: int
    version: int
    source: str | None = None
    source_port: int | None = None


def starts_with_proxy_header(data: bytes) -> bool | None:
    """Whether ``data``, the first bytes of a connection, begin a PROXY
    header of either version: True, False, or None when too few bytes
    arrived to tell (``data`` is a proper prefix of a signature)."""
    if data.startswith(V1_PREFIX) or data.startswith(V2_SIGNATURE):
        return True
    if V1_PREFIX.startswith(data) or V2_SIGNATURE.startswith(data):
        return None  # b"" included
    return False


def parse_proxy_header(data: bytes) -> ProxyHeader | None:
    """The header at the start of ``data`` (the bytes after it are the
    client's), or None when more bytes are needed to read it whole.

    Error handling: ``ProxyHeaderError`` when ``data`` does not begin with
    an acceptable header (the module's rules)."""
    if data[:12] == V2_SIGNATURE:
        return _parse_v2(data)
    if data.startswith(V1_PREFIX):
        return _parse_v1(data)
    if V2_SIGNATURE.startswith(data) or V1_PREFIX.startswith(data):
        return None
    raise ProxyHeaderError("missing", "the connection does not begin with a PROXY header")


def _parse_v2(data: bytes) -> ProxyHeader | None:
    if len(data) < _V2_FIXED_BYTES:
        return None
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyHeaderError("version", f"PROXY v2 header with version {version}")
    if command not in (_LOCAL, _PROXY):
        raise ProxyHeaderError("command", f"PROXY v2 header with command {command}")
    family, transport = data[13] >> 4, data[13] & 0x0F
    if family > _UNIX or transport > _DGRAM:
        raise ProxyHeaderError("family", f"PROXY v2 header with family byte {data[13]:#04x}")
    length = _V2_FIXED_BYTES + int.from_bytes(data[14:16])
    if length > MAX_V2_HEADER_BYTES:
        raise ProxyHeaderError(
            "too-long", f"PROXY v2 header of {length} bytes (at most {MAX_V2_HEADER_BYTES})"
        )
    if len(data) < length:
        return None
    if command == _LOCAL or family == _UNSPEC or transport == _UNSPEC:
        return ProxyHeader(length, 2)
    if transport == _DGRAM:
        raise ProxyHeaderError("family", "PROXY v2 header for a datagram connection")
    block = data[_V2_FIXED_BYTES:length]
    size = _ADDRESS_BYTES[family]
    if len(block) < size:
        raise ProxyHeaderError(
            "address", f"PROXY v2 address block of {len(block)} bytes (its family needs {size})"
        )
    _check_tlvs(block[size:])
    if family == _UNIX:
        return ProxyHeader(length, 2)
    if family == _INET:
        source = socket.inet_ntop(socket.AF_INET, block[0:4])
        port = int.from_bytes(block[8:10])
    else:
        source = socket.inet_ntop(socket.AF_INET6, block[0:16])
        port = int.from_bytes(block[32:34])
    return ProxyHeader(length, 2, source, port)


def _check_tlvs(tlvs: bytes) -> None:
    """Rule 4: each TLV's value ends within ``tlvs``."""
    at = 0
    end = len(tlvs)
    while at < end:
        if end - at < 3:
            raise ProxyHeaderError("tlv", "PROXY v2 TLV cut short by the header's length")
        at += 3 + int.from_bytes(tlvs[at + 1:at + 3])
        if at > end:
            raise ProxyHeaderError("tlv", "PROXY v2 TLV longer than the header's length")


def _parse_v1(data: bytes) -> ProxyHeader | None:
    window = data[:MAX_V1_HEADER_BYTES]
    cr = window.find(b"\r")
    lf = window.find(b"\n")
    if lf >= 0 and lf != cr + 1:
        raise ProxyHeaderError("malformed", "PROXY v1 line with a bare LF or CR")
    if lf < 0:
        if cr >= 0 and cr != len(window) - 1:
            raise ProxyHeaderError("malformed", "PROXY v1 line with a bare CR")
        if len(window) >= MAX_V1_HEADER_BYTES:
            raise ProxyHeaderError(
                "too-long", f"PROXY v1 line without CRLF in {MAX_V1_HEADER_BYTES} bytes"
            )
        return None
    length = lf + 1
    fields = window[:cr].split(b" ")
    if fields[1] == b"UNKNOWN":
        return ProxyHeader(length, 1)
    family = _V1_FAMILIES.get(fields[1])
    if family is None:
        raise ProxyHeaderError("family", "PROXY v1 line with a protocol other than TCP4/TCP6")
    if len(fields) != 6:
        raise ProxyHeaderError("malformed", "PROXY v1 line without exactly six fields")
    source, destination, source_port, destination_port = fields[2:]
    address = _v1_address(family, source)
    _v1_address(family, destination)
    port = _v1_port(source_port)
    _v1_port(destination_port)
    return ProxyHeader(length, 1, address, port)


def _v1_address(family: _AddressType, text: bytes) -> str:
    """An address of ``family`` in canonical text (IPv4: no leading zeros;
    IPv6: no zone id), as ``ipaddress`` writes it."""
    try:
        if b"%" in text:
            raise ValueError
        return str(family(text.decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        raise ProxyHeaderError("address", "PROXY v1 line with a bad address") from None


def _v1_port(text: bytes) -> int:
    if not (text.isdigit() and text.isascii()) or (text[:1] == b"0" and text != b"0"):
        raise ProxyHeaderError("malformed", "PROXY v1 line with a bad port")
    port = int(text)
    if port > 65535:
        raise ProxyHeaderError("malformed", "PROXY v1 line with a port over 65535")
    return port
