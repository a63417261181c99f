"""The PROXY protocol header parser (notary.protocol.proxyheader): the
spec's examples and worst cases, every split point of a header, and the
refusals, each with its reason."""

from __future__ import annotations

import socket
import struct

import pytest

from notary.protocol.proxyheader import (
    MAX_V1_HEADER_BYTES,
    MAX_V2_HEADER_BYTES,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    parse_proxy_header,
    starts_with_proxy_header,
)

REQUEST = b"GET / HTTP/1.1\r\nHost: 192.168.0.11\r\n\r\n"


def v2(command: int = 1, family: int = 0x11, block: bytes = b"", *, version: int = 2,
       length: int | None = None) -> bytes:
    size = len(block) if length is None else length
    return V2_SIGNATURE + bytes([version << 4 | command, family]) + struct.pack("!H", size) + block


def inet(source: str = "192.0.2.7", destination: str = "198.51.100.1",
         ports: tuple[int, int] = (40000, 443)) -> bytes:
    return (socket.inet_pton(socket.AF_INET, source)
            + socket.inet_pton(socket.AF_INET, destination) + struct.pack("!HH", *ports))


def inet6(source: str = "2001:db8::7", destination: str = "2001:db8::1",
          ports: tuple[int, int] = (40000, 443)) -> bytes:
    return (socket.inet_pton(socket.AF_INET6, source)
            + socket.inet_pton(socket.AF_INET6, destination) + struct.pack("!HH", *ports))


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack("!H", len(value)) + value


# -- version 1 ----------------------------------------------------------------------


def test_the_spec_example_before_an_http_request() -> None:
    line = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
    assert parse_proxy_header(line + REQUEST) == ProxyHeader(len(line), 1, "192.168.0.1", 56324)


@pytest.mark.parametrize(("line", "source"), [
    # The spec's longest lines of each kind (56, 104, 15 and 107 bytes).
    (b"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n", "255.255.255.255"),
    (b"PROXY TCP6 " + b"ffff:" * 7 + b"ffff " + b"ffff:" * 7 + b"ffff 65535 65535\r\n",
     "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    (b"PROXY UNKNOWN\r\n", None),
    (b"PROXY UNKNOWN " + b"ffff:" * 7 + b"ffff " + b"ffff:" * 7 + b"ffff 65535 65535\r\n", None),
])
def test_the_spec_worst_cases_are_read(line: bytes, source: str | None) -> None:
    assert len(line) in (56, 104, 15, 107)
    header = parse_proxy_header(line + REQUEST)
    assert header is not None
    assert (header.length, header.version, header.source) == (len(line), 1, source)


def test_an_ipv6_source_is_canonical_and_mapped_ipv4_is_kept() -> None:
    line = b"PROXY TCP6 2001:DB8:0:0::7 ::1 1 0\r\n"
    assert parse_proxy_header(line) == ProxyHeader(len(line), 1, "2001:db8::7", 1)
    # nginx writes a v4 client of a dual-stack listener so.
    line = b"PROXY TCP6 ::ffff:192.0.2.7 ::1 1 0\r\n"
    header = parse_proxy_header(line)
    assert header is not None and header.source == "::ffff:c000:207"


def test_every_proper_prefix_needs_more() -> None:
    line = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
    for cut in range(len(line)):
        assert parse_proxy_header(line[:cut]) is None, cut


@pytest.mark.parametrize(("line", "reason"), [
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\n", "malformed"),  # bare LF
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\rX\n", "malformed"),  # bare CR
    (b"PROXY TCP4 192.168.0.1\r192.168.0.11 56324 443\r\n", "malformed"),
    (b"PROXY TCP4  192.168.0.1 192.168.0.11 56324 443\r\n", "malformed"),  # two spaces
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324\r\n", "malformed"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443 7\r\n", "malformed"),
    (b"PROXY TCP5 192.168.0.1 192.168.0.11 56324 443\r\n", "family"),
    (b"PROXY UDP4 192.168.0.1 192.168.0.11 56324 443\r\n", "family"),
    (b"PROXY \r\n", "family"),
    (b"PROXY TCP4 192.168.0.01 192.168.0.11 56324 443\r\n", "address"),  # leading zero
    (b"PROXY TCP4 2001:db8::1 192.168.0.11 56324 443\r\n", "address"),  # wrong family
    (b"PROXY TCP6 192.168.0.1 ::1 56324 443\r\n", "address"),
    (b"PROXY TCP6 fe80::1%eth0 ::1 56324 443\r\n", "address"),  # a zone
    (b"PROXY TCP4 192.168.0.1 192.168.0.1x 56324 443\r\n", "address"),
    (b"PROXY TCP4 192.168.\xff.1 192.168.0.11 56324 443\r\n", "address"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 056324 443\r\n", "malformed"),  # leading zero
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 65536 443\r\n", "malformed"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 -1 443\r\n", "malformed"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 5\xd9\xa3 443\r\n", "malformed"),  # non-ASCII digit
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 +5 443\r\n", "malformed"),
    (b"PROXY UNKNOWN " + b"x" * 200 + b"\r\n", "too-long"),
    (b"PROXY TCP4 " + b"1" * 200, "too-long"),  # no CRLF in 107 bytes: not waited for
])
def test_bad_v1_lines_are_refused_with_a_reason(line: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError) as refused:
        parse_proxy_header(line + REQUEST)
    assert refused.value.reason == reason


def test_a_line_is_refused_once_107_bytes_hold_no_crlf() -> None:
    line = b"PROXY UNKNOWN " + b"x" * (MAX_V1_HEADER_BYTES - 16) + b"\r\n"
    assert len(line) == MAX_V1_HEADER_BYTES
    assert parse_proxy_header(line) == ProxyHeader(MAX_V1_HEADER_BYTES, 1)
    longer = b"PROXY UNKNOWN " + b"x" * (MAX_V1_HEADER_BYTES - 15) + b"\r\n"
    assert parse_proxy_header(longer[:MAX_V1_HEADER_BYTES - 1]) is None
    with pytest.raises(ProxyHeaderError, match="without CRLF"):
        parse_proxy_header(longer)


# -- version 2 ----------------------------------------------------------------------


def test_haproxy_send_proxy_v2_as_captured() -> None:
    # What HAProxy writes before a request (a capture of send-proxy-v2):
    # TCP over IPv4, 172.19.0.1:42578 to 172.19.0.3:80.
    header = bytes.fromhex(
        "0d0a0d0a000d0a515549540a" "21" "11" "000c" "ac130001" "ac130003" "a652" "0050"
    )
    assert parse_proxy_header(header + REQUEST) == ProxyHeader(28, 2, "172.19.0.1", 42578)


def test_ipv6_and_tlvs() -> None:
    tlvs = tlv(0x01, b"http/1.1") + tlv(0x04, b"") + tlv(0x20, b"\x01" + b"\x00" * 4)
    data = v2(family=0x21, block=inet6() + tlvs)
    assert parse_proxy_header(data + REQUEST) == ProxyHeader(len(data), 2, "2001:db8::7", 40000)


@pytest.mark.parametrize(("command", "family", "block"), [
    (0, 0x00, b""),  # LOCAL, as a health check sends it
    (0, 0x11, inet()),  # LOCAL with an address: ignored
    (0, 0x11, b"\xff" * 5),  # LOCAL: the block is skipped unread
    (1, 0x00, b"junk"),  # PROXY UNSPEC
    (1, 0x10, inet()),  # INET over an unspecified transport
    (1, 0x31, b"/run/edge.sock".ljust(108, b"\0") * 2),  # AF_UNIX
])
def test_headers_naming_no_client_leave_the_connections_own(
    command: int, family: int, block: bytes
) -> None:
    data = v2(command, family, block)
    assert parse_proxy_header(data + REQUEST) == ProxyHeader(len(data), 2)


def test_every_proper_prefix_of_a_v2_header_needs_more() -> None:
    data = v2(block=inet() + tlv(0x05, b"id"))
    for cut in range(len(data)):
        assert parse_proxy_header(data[:cut]) is None, cut
    assert parse_proxy_header(data) == ProxyHeader(len(data), 2, "192.0.2.7", 40000)


def test_the_largest_v2_header_is_read_and_one_byte_more_refused_at_once() -> None:
    block = inet() + tlv(0x04, b"\0" * (MAX_V2_HEADER_BYTES - 16 - 12 - 3))
    data = v2(block=block)
    assert len(data) == MAX_V2_HEADER_BYTES
    assert parse_proxy_header(data) == ProxyHeader(len(data), 2, "192.0.2.7", 40000)
    # The declared length alone refuses it: its bytes are not waited for.
    with pytest.raises(ProxyHeaderError) as refused:
        parse_proxy_header(v2(length=MAX_V2_HEADER_BYTES - 16 + 1))
    assert refused.value.reason == "too-long"
    with pytest.raises(ProxyHeaderError, match="65551 bytes"):
        parse_proxy_header(v2(length=0xFFFF))


@pytest.mark.parametrize(("data", "reason"), [
    (v2(version=1, block=inet()), "version"),
    (v2(version=3, block=inet()), "version"),
    (v2(command=2, block=inet()), "command"),
    (v2(command=0xF, block=inet()), "command"),
    (v2(family=0x41, block=inet()), "family"),
    (v2(family=0x13, block=inet()), "family"),
    (v2(family=0x12, block=inet()), "family"),  # UDP
    (v2(family=0x11, block=inet()[:11]), "address"),
    (v2(family=0x21, block=inet()), "address"),
    (v2(family=0x31, block=b"\0" * 100), "address"),
    (v2(block=inet() + b"\x01\x00"), "tlv"),  # cut inside a TLV's head
    (v2(block=inet() + b"\x01\x00\x05ab"), "tlv"),  # a value past the end
    (v2(block=inet() + tlv(1, b"ok") + b"\x02\xff\xff"), "tlv"),
    (b"\r\n\r\n\x00\r\nQUIT\r" + b"\x21\x11\x00\x0c" + inet(), "missing"),  # bad signature
    (b"\r\n\r\n\x01\r\nQUIT\n" + b"\x21\x11\x00\x0c" + inet(), "missing"),
])
def test_bad_v2_headers_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError) as refused:
        parse_proxy_header(data + REQUEST)
    assert refused.value.reason == reason


# -- no header ----------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    REQUEST, b"POST /target/x+443 HTTP/1.0\r\n", b"\x16\x03\x01\x02\x00",  # a TLS ClientHello
    b"PROXYTCP4", b"proxy TCP4 1.2.3.4 1.2.3.4 1 1\r\n", b"\r\n\r\nGET / HTTP/1.1\r\n",
])
def test_other_protocols_are_no_header(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError) as refused:
        parse_proxy_header(data)
    assert refused.value.reason == "missing"
    assert starts_with_proxy_header(data) is False


@pytest.mark.parametrize(("data", "starts"), [
    (b"", None), (b"P", None), (b"PROXY", None), (b"\r\n\r\n", None),
    (V2_SIGNATURE[:11], None), (b"PROXY ", True), (V2_SIGNATURE, True),
    (b"PROXY TCP4 garbage", True), (b"PO", False), (b"\r\n\r\nG", False),
])
def test_sniffing_the_first_bytes(data: bytes, starts: bool | None) -> None:
    assert starts_with_proxy_header(data) is starts


def test_refusals_are_peer_errors_with_a_message() -> None:
    with pytest.raises(ProxyHeaderError) as refused:
        parse_proxy_header(v2(command=3))
    assert refused.value.message == "PROXY v2 header with command 3"
