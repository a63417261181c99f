"""The sans-IO side of the bounce relay (notary.protocol.relay) and the HTTP
reader's hand-over of the bytes after a CONNECT head.

Plain ``def`` tests: requests are parsed from the exact bytes clients send.
"""

from __future__ import annotations

import pytest
import trustme

from notary.errors import BadTarget, PeerError, ProtocolError
from notary.protocol.bundle import BundleHost, make_bundle
from notary.protocol.http import Request, RequestReader
from notary.protocol.relay import (
    RELAY_PORT,
    RelayMode,
    RelayRefused,
    bundle_hosts,
    connection_established,
    parse_connect_request,
    refusal,
    relay_page,
)
from tests.support.notaries import parse_response

#: What the 2011 add-on's NotaryProxyConnector sends for a notary with three hosts.
LEGACY_BOUNCE = (
    b"CONNECT notary.example:4242 HTTP/1.1\r\n"
    b"Host: notary.example\r\n"
    b"X-Convergence-Notary: notary2.example+4242\r\n"
    b"X-Convergence-Notary: 192.0.2.7+4242\r\n"
    b"\r\n"
)


@pytest.fixture(scope="module")
def certificate_pem() -> str:
    return trustme.CA().issue_cert("notary.example").cert_chain_pems[0].bytes().decode("ascii")


def read_one(data: bytes) -> tuple[Request, bytes]:
    reader = RequestReader()
    requests = reader.feed(data)
    assert len(requests) == 1
    return requests[0], reader.leftover


def connect(head: bytes, *, max_destinations: int = 8) -> tuple[str, ...]:
    request, _ = read_one(head)
    return parse_connect_request(request, max_destinations=max_destinations).destinations


# -- the reader keeps what follows the head ----------------------------------------


def test_legacy_bounce_request_names_every_host_in_order() -> None:
    assert connect(LEGACY_BOUNCE) == ("notary.example", "notary2.example", "192.0.2.7")


def test_bytes_after_the_connect_head_are_handed_over() -> None:
    client_hello = b"\x16\x03\x01\x00\x05hello"
    request, leftover = read_one(LEGACY_BOUNCE + client_hello)
    assert request.method == b"CONNECT" and request.upgrade
    assert leftover == client_hello


def test_bytes_after_a_head_split_over_feeds_are_handed_over() -> None:
    reader = RequestReader()
    assert reader.feed(LEGACY_BOUNCE[:20]) == []
    requests = reader.feed(LEGACY_BOUNCE[20:] + b"tunnel")
    assert [r.method for r in requests] == [b"CONNECT"]
    assert reader.leftover == b"tunnel" and reader.finished
    assert reader.feed(b"more") == []  # the reader is done; the tunnel owns the rest


def test_no_leftover_without_trailing_bytes() -> None:
    _, leftover = read_one(LEGACY_BOUNCE)
    assert leftover == b""


# -- destinations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (b"Notary.Example.:4242", "notary.example"),
        (b"[::1]:4242", "::1"),
        (b"[0:0::1]:4242", "::1"),
        (b"192.0.2.1:4242", "192.0.2.1"),
        (b"notary.example+4242", "notary.example"),
        (b"[2001:db8::1]+4242", "2001:db8::1"),
    ],
)
def test_destination_spellings_normalise(target: bytes, expected: str) -> None:
    head = b"CONNECT " + target + b" HTTP/1.1\r\n\r\n"
    assert connect(head) == (expected,)


@pytest.mark.parametrize("header", [b"notary2.example", b"notary2.example:4242", b"2001:db8::2"])
def test_header_destinations_without_plus_are_accepted(header: bytes) -> None:
    head = b"CONNECT a.example:4242 HTTP/1.1\r\nX-Convergence-Notary: " + header + b"\r\n\r\n"
    assert connect(head)[1] in ("notary2.example", "2001:db8::2")


def test_comma_separated_header_values_and_duplicates() -> None:
    head = (
        b"CONNECT a.example:4242 HTTP/1.1\r\n"
        b"x-convergence-notary: b.example+4242, A.EXAMPLE+4242 ,c.example+4242\r\n\r\n"
    )
    assert connect(head) == ("a.example", "b.example", "c.example")


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /target/a+443 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"CONNECT a.example:443 HTTP/1.1\r\n\r\n",
        b"CONNECT a.example:80 HTTP/1.0\r\n\r\n",
        b"CONNECT a.example:4242 HTTP/1.1\r\nX-Convergence-Notary: b.example+443\r\n\r\n",
        b"CONNECT a.example:4242 HTTP/1.1\r\nX-Convergence-Notary: b.example:22\r\n\r\n",
    ],
)
def test_other_methods_and_ports_are_refused_with_403(head: bytes) -> None:
    with pytest.raises(RelayRefused) as caught:
        connect(head)
    assert caught.value.status == 403


@pytest.mark.parametrize(
    "header",
    [
        b"bad_host.example+4242",
        b"+4242",
        b"a.example+",
        b"a.example+42x",
        b"[::1+4242",
        b"127.1+4242",
        b"a..example:4242",
        b"caf\xc3\xa9.example+4242",
    ],
)
def test_malformed_destinations_are_400(header: bytes) -> None:
    head = b"CONNECT a.example:4242 HTTP/1.1\r\nX-Convergence-Notary: " + header + b"\r\n\r\n"
    with pytest.raises(ProtocolError) as caught:
        connect(head)
    assert caught.value.status == 400
    assert not isinstance(caught.value, BadTarget)  # mapped, with its own message
    assert caught.value.message.startswith("bad destination") or "ASCII" in caught.value.message


def test_too_many_destinations_is_400() -> None:
    headers = b"".join(b"X-Convergence-Notary: n%d.example+4242\r\n" % i for i in range(8))
    head = b"CONNECT a.example:4242 HTTP/1.1\r\n" + headers + b"\r\n"
    assert len(connect(head, max_destinations=9)) == 9
    with pytest.raises(ProtocolError, match="more than 8 destinations"):
        connect(head, max_destinations=8)


def test_bundle_hosts_are_normalised(certificate_pem: str) -> None:
    bundle = make_bundle(
        name="Two hosts",
        location="https://notary.example/two.notary",
        hosts=[
            BundleHost("Notary.Example", 443, 80, certificate_pem),
            BundleHost("0:0::1", 443, 80, certificate_pem),
        ],
    )
    assert bundle_hosts([bundle]) == {"notary.example", "::1"}
    assert bundle_hosts([]) == frozenset()


# -- answers ---------------------------------------------------------------------------


def test_connection_established_bytes() -> None:
    assert connection_established("notary2.example") == (
        b"HTTP/1.0 200 Connection Established\r\n"
        b"Proxy-Agent: notary\r\n"
        b"X-Convergence-Notary: notary2.example\r\n\r\n"
    )


def test_unreachable_is_404_unable_to_connect() -> None:
    data = refusal(PeerError("unable to connect to the notary", status=404))
    assert data.startswith(b"HTTP/1.1 404 Unable to connect\r\n")
    answer = parse_response(data)
    assert answer.headers[b"connection"] == b"close"
    assert answer.body == b"unable to connect to the notary\n"


def test_refusal_403_closes() -> None:
    data = refusal(RelayRefused("destination is not a notary this relay trusts"))
    assert data.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert parse_response(data).headers[b"connection"] == b"close"


@pytest.mark.parametrize("mode", list(RelayMode))
def test_relay_page_says_what_this_is_and_escapes_the_name(mode: RelayMode) -> None:
    answer = parse_response(relay_page(mode=mode, notary_name="<Evil & Co>", status=403))
    assert answer.status == 403
    assert answer.headers[b"content-type"] == b"text/html; charset=utf-8"
    assert b"&lt;Evil &amp; Co&gt;" in answer.body and b"<Evil" not in answer.body
    assert int(answer.headers[b"content-length"]) == len(answer.body)
    assert (b"does not relay" in answer.body) == (mode is RelayMode.OFF)
    assert str(RELAY_PORT).encode() in answer.body
