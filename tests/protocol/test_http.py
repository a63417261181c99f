"""The sans-IO HTTP/1.x reader and the response builders (notary.protocol.http).

Plain ``def`` tests: no sockets, no clock. The legacy Convergence client's
request is reproduced byte for byte (HTTP/1.0, no Host header).
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notary.errors import ProtocolError
from notary.protocol.http import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    Request,
    RequestReader,
    error_response,
    response,
    status_line,
)

FINGERPRINT = b"AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD"
FORM = b"fingerprint=" + FINGERPRINT
LEGACY_REQUEST = (
    b"POST /target/host+443 HTTP/1.0\r\n"
    b"Content-Type: application/x-www-form-urlencoded\r\n"
    b"Content-Length: 71\r\n"
    b"\r\n" + FORM
)
GET_A = b"GET /target/a.example+443 HTTP/1.1\r\nHost: notary\r\n\r\n"
GET_B = b"GET /target/b.example+443 HTTP/1.1\r\nHost: notary\r\n\r\n"
ALLOWED_ERROR_STATUSES = {400, 408, 413, 414, 431, 505}


def feed_all(reader: RequestReader, *chunks: bytes) -> list[Request]:
    requests: list[Request] = []
    for chunk in chunks:
        requests += reader.feed(chunk)
    return requests


def protocol_error(*chunks: bytes, **limits: int) -> ProtocolError:
    reader = RequestReader(**limits)
    with pytest.raises(ProtocolError) as info:
        feed_all(reader, *chunks)
    assert reader.finished, "a reader that raised must not parse further bytes"
    assert reader.feed(GET_A) == []
    return info.value


# -- the legacy client -----------------------------------------------------------


def test_legacy_request_has_the_expected_length() -> None:
    assert len(FORM) == 71


def test_legacy_client_request_is_one_closing_request() -> None:
    reader = RequestReader()
    [request] = reader.feed(LEGACY_REQUEST)
    assert request == Request(
        method=b"POST",
        target=b"/target/host+443",
        version="1.0",
        headers=(
            (b"Content-Type", b"application/x-www-form-urlencoded"),
            (b"Content-Length", b"71"),
        ),
        body=FORM,
        keep_alive=False,
        upgrade=False,
    )
    assert request.header(b"host") is None
    assert request.header(b"content-type") == b"application/x-www-form-urlencoded"
    assert reader.finished
    assert not reader.in_request


def test_legacy_request_fed_byte_by_byte() -> None:
    reader = RequestReader()
    requests = feed_all(reader, *(LEGACY_REQUEST[i : i + 1] for i in range(len(LEGACY_REQUEST))))
    assert [r.body for r in requests] == [FORM]
    assert not requests[0].keep_alive


def test_reader_reports_a_partial_request() -> None:
    reader = RequestReader()
    assert not reader.in_request
    assert reader.feed(LEGACY_REQUEST[:10]) == []
    assert reader.in_request
    assert not reader.finished
    assert len(reader.feed(LEGACY_REQUEST[10:])) == 1
    assert not reader.in_request


def test_empty_feed_returns_nothing() -> None:
    reader = RequestReader()
    assert reader.feed(b"") == []
    assert not reader.finished


@pytest.mark.parametrize(
    "trailing",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"garbage\x00\xff\r\n\r\n",
        b"\r\n",
        b"x" * 100_000,
    ],
)
def test_bytes_after_a_closing_request_are_ignored(trailing: bytes) -> None:
    reader = RequestReader()
    [request] = reader.feed(LEGACY_REQUEST + trailing)
    assert request.body == FORM
    assert reader.finished
    assert reader.feed(trailing) == []
    assert reader.feed(GET_A) == []


def test_bytes_after_a_closing_request_in_a_later_feed_are_ignored() -> None:
    reader = RequestReader()
    assert len(reader.feed(LEGACY_REQUEST)) == 1
    assert reader.feed(b"\x00garbage") == []
    assert reader.feed(GET_A) == []


def test_http11_connection_close_finishes_the_reader() -> None:
    reader = RequestReader()
    [request] = reader.feed(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n" + GET_A)
    assert request.version == "1.1"
    assert not request.keep_alive
    assert reader.finished


def test_http10_get_without_host() -> None:
    [request] = RequestReader().feed(b"GET /target/example.com+443 HTTP/1.0\r\n\r\n")
    assert request.method == b"GET"
    assert request.target == b"/target/example.com+443"
    assert request.version == "1.0"
    assert request.headers == ()
    assert request.body == b""
    assert not request.keep_alive


def test_http10_keep_alive_is_honoured() -> None:
    reader = RequestReader()
    requests = reader.feed(
        b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n\r\n"
    )
    assert [(r.target, r.keep_alive) for r in requests] == [(b"/a", True), (b"/b", False)]
    assert reader.finished


# -- HTTP/1.1 keep-alive and pipelining ------------------------------------------


def test_http11_keep_alive() -> None:
    reader = RequestReader()
    [first] = reader.feed(GET_A)
    assert first.keep_alive
    assert first.version == "1.1"
    assert first.header(b"HOST") == b"notary"
    assert not reader.finished
    [second] = reader.feed(GET_B)
    assert second.target == b"/target/b.example+443"
    assert not reader.finished


def test_pipelined_requests_in_one_feed_come_out_in_order() -> None:
    reader = RequestReader()
    requests = reader.feed(GET_A + GET_B)
    assert [r.target for r in requests] == [b"/target/a.example+443", b"/target/b.example+443"]
    assert all(r.keep_alive for r in requests)


def test_pipelined_post_and_get() -> None:
    post = (
        b"POST /target/a.example+443 HTTP/1.1\r\nHost: n\r\n"
        b"Content-Length: 71\r\n\r\n" + FORM
    )
    reader = RequestReader()
    requests = reader.feed(post + GET_B + post)
    assert [r.method for r in requests] == [b"POST", b"GET", b"POST"]
    assert [r.body for r in requests] == [FORM, b"", FORM]


def test_pipelining_stops_at_a_closing_request() -> None:
    closing = b"GET /close HTTP/1.1\r\nConnection: close\r\n\r\n"
    reader = RequestReader()
    requests = reader.feed(GET_A + closing + GET_B)
    assert [r.target for r in requests] == [b"/target/a.example+443", b"/close"]
    assert reader.finished


def test_chunked_body() -> None:
    [request] = RequestReader().feed(
        b"POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"c\r\nfingerprint=\r\n3B\r\n" + FINGERPRINT + b"\r\n0\r\n\r\n"
    )
    assert request.body == FORM


def test_header_lookup_is_case_insensitive_and_returns_the_first() -> None:
    [request] = RequestReader().feed(b"GET / HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\n\r\n")
    assert request.header(b"x-A") == b"1"
    assert request.header(b"missing") is None
    assert request.headers == ((b"X-A", b"1"), (b"x-a", b"2"))


def test_leading_empty_lines_are_skipped() -> None:
    [request] = RequestReader().feed(b"\r\n\r\n" + GET_A)
    assert request.target == b"/target/a.example+443"


@pytest.mark.parametrize(
    "head",
    [
        b"CONNECT a.example:4242 HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET /ws HTTP/1.1\r\nHost: n\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    ],
)
def test_upgrade_request_finishes_the_reader(head: bytes) -> None:
    reader = RequestReader()
    [request] = reader.feed(head + b"tunnelled bytes")
    assert request.upgrade
    assert not request.keep_alive
    assert reader.finished
    assert reader.feed(GET_A) == []


def test_connect_request_target() -> None:
    [request] = RequestReader().feed(
        b"CONNECT a.example:4242 HTTP/1.1\r\nHost: a.example\r\n"
        b"X-Convergence-Notary: b.example+4242\r\n\r\n"
    )
    assert request.method == b"CONNECT"
    assert request.target == b"a.example:4242"
    assert request.header(b"x-convergence-notary") == b"b.example+4242"


# -- any split of a valid stream gives the same requests -------------------------

_STREAMS = [
    LEGACY_REQUEST,
    GET_A + GET_B,
    GET_A + b"POST /p HTTP/1.1\r\nContent-Length: 71\r\n\r\n" + FORM + GET_B,
    GET_A + b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    GET_A + b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\n",
    b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + LEGACY_REQUEST,
]


@st.composite
def split_stream(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    stream = draw(st.sampled_from(_STREAMS))
    cuts = sorted(draw(st.sets(st.integers(1, len(stream) - 1), max_size=40)))
    bounds = [0, *cuts, len(stream)]
    return stream, [stream[a:b] for a, b in itertools.pairwise(bounds)]


@given(split_stream())
def test_any_split_gives_the_same_requests(case: tuple[bytes, list[bytes]]) -> None:
    stream, chunks = case
    whole = RequestReader().feed(stream)
    assert whole
    reader = RequestReader()
    assert feed_all(reader, *chunks) == whole
    assert reader.finished == (not whole[-1].keep_alive)


@pytest.mark.parametrize("stream", _STREAMS)
def test_byte_by_byte_gives_the_same_requests(stream: bytes) -> None:
    whole = RequestReader().feed(stream)
    reader = RequestReader()
    assert feed_all(reader, *(stream[i : i + 1] for i in range(len(stream)))) == whole


# -- limits ----------------------------------------------------------------------


def test_defaults_match_the_config_defaults() -> None:
    from notary.config import HttpConfig

    defaults = HttpConfig()
    assert defaults.max_header_bytes == DEFAULT_MAX_HEADER_BYTES
    assert defaults.max_headers == DEFAULT_MAX_HEADERS
    assert defaults.max_body_bytes == DEFAULT_MAX_BODY_BYTES


def test_header_bytes_over_the_limit_is_431() -> None:
    error = protocol_error(b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
    assert error.status == 431


def test_header_bytes_just_under_the_limit_pass() -> None:
    value = b"a" * 1000
    [request] = RequestReader(max_header_bytes=1100).feed(
        b"GET / HTTP/1.1\r\nX: " + value + b"\r\n\r\n"
    )
    assert request.header(b"x") == value


def test_header_bytes_over_a_custom_limit_is_431() -> None:
    error = protocol_error(b"GET / HTTP/1.1\r\nX: " + b"a" * 1000 + b"\r\n\r\n", max_header_bytes=500)
    assert error.status == 431


def test_many_small_headers_over_the_byte_limit_is_431() -> None:
    head = b"GET / HTTP/1.1\r\n" + b"X-Header: value\r\n" * 60 + b"\r\n"
    assert protocol_error(head, max_header_bytes=512).status == 431


def test_long_request_target_is_431() -> None:
    assert protocol_error(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n").status == 431


def test_long_request_target_dripped_in_is_431() -> None:
    chunks = [b"GET /"] + [b"a" * 100] * 100 + [b" HTTP/1.1\r\n\r\n"]
    assert protocol_error(*chunks).status == 431


@pytest.mark.parametrize("where", [b"X-Big: ", b"X-Big", b""], ids=["value", "name", "new-name"])
def test_one_endless_header_line_fed_in_pieces_is_431(where: bytes) -> None:
    """httptools buffers a header name/value until its line ends; the reader
    must still bound it (invariant 1), not only once the line is complete."""
    reader = RequestReader()
    reader.feed(b"GET / HTTP/1.1\r\nHost: n\r\n" + where)
    with pytest.raises(ProtocolError) as info:
        for _ in range(64):  # 64 x 4 KiB = 256 KiB, far past the 8 KiB bound
            reader.feed(b"a" * 4096)
    assert info.value.status == 431
    assert reader.finished


def test_endless_trailer_line_is_431() -> None:
    reader = RequestReader()
    reader.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: ")
    with pytest.raises(ProtocolError) as info:
        for _ in range(64):
            reader.feed(b"a" * 4096)
    assert info.value.status == 431


def test_a_long_legal_header_dripped_in_small_pieces_passes() -> None:
    value = b"v" * 7000
    head = b"GET / HTTP/1.1\r\nX-Long: " + value + b"\r\n\r\n"
    reader = RequestReader()
    requests = feed_all(reader, *(head[i : i + 7] for i in range(0, len(head), 7)))
    assert [r.header(b"x-long") for r in requests] == [value]


def test_header_count_over_the_limit_is_431() -> None:
    head = b"GET / HTTP/1.1\r\n" + b"X: a\r\n" * (DEFAULT_MAX_HEADERS + 1) + b"\r\n"
    error = protocol_error(head)
    assert error.status == 431
    assert "header" in error.message


def test_header_count_at_the_limit_passes() -> None:
    head = b"GET / HTTP/1.1\r\n" + b"X: a\r\n" * DEFAULT_MAX_HEADERS + b"\r\n"
    [request] = RequestReader().feed(head)
    assert len(request.headers) == DEFAULT_MAX_HEADERS


def test_custom_header_count_limit() -> None:
    head = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"
    assert protocol_error(head, max_headers=2).status == 431
    assert len(RequestReader(max_headers=3).feed(head)[0].headers) == 3


def test_body_over_the_limit_is_413() -> None:
    size = DEFAULT_MAX_BODY_BYTES + 1
    head = b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % size
    assert protocol_error(head + b"a" * size).status == 413


def test_body_over_the_limit_is_413_before_it_all_arrives() -> None:
    reader = RequestReader(max_body_bytes=100)
    reader.feed(b"POST / HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n")
    with pytest.raises(ProtocolError) as info:
        for _ in range(10):
            reader.feed(b"a" * 50)
    assert info.value.status == 413


def test_body_at_the_limit_passes() -> None:
    body = b"b" * DEFAULT_MAX_BODY_BYTES
    head = b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
    [request] = RequestReader().feed(head + body)
    assert request.body == body


def test_chunked_body_over_the_limit_is_413() -> None:
    chunk = b"1000\r\n" + b"a" * 4096 + b"\r\n"
    reader = RequestReader()
    reader.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(ProtocolError) as info:
        for _ in range(3):
            reader.feed(chunk)
    assert info.value.status == 413


# -- versions and malformed requests ---------------------------------------------


@pytest.mark.parametrize("version", [b"HTTP/2.0"])
def test_unsupported_version_is_505(version: bytes) -> None:
    error = protocol_error(b"GET / " + version + b"\r\n\r\n")
    assert error.status == 505


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"GET /target/x.example+443\r\n\r\n", id="target"),
        pytest.param(b"GET /\r\n\r\n", id="root"),
        pytest.param(b"GET /\r\nHost: n\r\n\r\n", id="with-a-header"),
        pytest.param(b"POST /target/x.example+443\r\nContent-Length: 0\r\n\r\n", id="post"),
        # llhttp reports a written HTTP/0.9 as it reports no version at all;
        # HTTP/0.9 requests never carried that token, so it is malformed too.
        pytest.param(b"GET / HTTP/0.9\r\n\r\n", id="written-0.9"),
    ],
)
def test_a_request_line_without_a_version_is_400(data: bytes) -> None:
    error = protocol_error(data)
    assert error.status == 400
    assert error.message == "malformed request: no HTTP version"
    # The same, whatever the chunks it arrives in.
    assert protocol_error(*(data[i:i + 1] for i in range(len(data)))).status == 400


@pytest.mark.parametrize("version", [b"HTTP/1.2", b"HTTP/3.0"])
def test_other_unknown_versions_are_505(version: bytes) -> None:
    assert protocol_error(b"GET / " + version + b"\r\n\r\n").status == 505


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"GARBAGE\r\n\r\n", id="bad-request-line"),
        pytest.param(b"GET\r\n\r\n", id="no-target"),
        pytest.param(b"GET / FTP/1.1\r\n\r\n", id="bad-protocol"),
        pytest.param(b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", id="obsolete-folding"),
        pytest.param(b"GET / HTTP/1.1\r\nX: a\r\n\tfolded\r\n\r\n", id="obsolete-folding-tab"),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            id="duplicate-content-length",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
            id="duplicate-equal-content-length",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\n",
            id="cl-te-smuggling",
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
            b"0\r\n\r\n",
            id="te-cl-smuggling",
        ),
        pytest.param(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", id="negative-length"),
        pytest.param(b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", id="bad-length"),
        pytest.param(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", id="bad-chunk-size"
        ),
        pytest.param(b"GET /\x00 HTTP/1.1\r\n\r\n", id="nul-in-target"),
        pytest.param(b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", id="nul-in-header-value"),
        pytest.param(b"GET / HTTP/1.1\r\nX\x00: a\r\n\r\n", id="nul-in-header-name"),
        pytest.param(b"GET / HTTP/1.1\nHost: x\n\n", id="bare-lf"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\n\r\n", id="bare-lf-after-header"),
        pytest.param(b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", id="space-before-colon"),
        pytest.param(b"GET / HTTP/1.1\r\nNo colon\r\n\r\n", id="header-without-colon"),
        pytest.param(b"GET / HTTP/1.1\r\n: empty-name\r\n\r\n", id="empty-header-name"),
    ],
)
def test_malformed_requests_are_400(data: bytes) -> None:
    error = protocol_error(data)
    assert error.status == 400
    assert error.message.startswith("malformed request")


def test_malformed_request_fed_byte_by_byte_is_400() -> None:
    data = b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n"
    assert protocol_error(*(data[i : i + 1] for i in range(len(data)))).status == 400


def test_malformed_second_pipelined_request_raises() -> None:
    reader = RequestReader()
    assert len(reader.feed(GET_A)) == 1
    with pytest.raises(ProtocolError) as info:
        reader.feed(b"GARBAGE\r\n\r\n")
    assert info.value.status == 400
    assert reader.finished


# -- fuzz: nothing but Requests or ProtocolError ---------------------------------

_PREFIXES = [
    b"",
    b"GET / HTTP/1.1\r\n",
    b"POST /target/a+443 HTTP/1.0\r\nContent-Length: 5\r\n",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    GET_A,
    b"CONNECT a:4242 HTTP/1.1\r\n",
]
_HTTPISH = st.lists(
    st.sampled_from(
        [b"\r\n", b"\n", b"\r", b" ", b":", b"\x00", b"GET", b"HTTP/1.1", b"HTTP/1.0",
         b"HTTP/2.0", b"Content-Length: ", b"Transfer-Encoding: chunked", b"0", b"5",
         b"Connection: close", b"Upgrade: x", b"\t", b"\xff", b"/", b"a"]
    ),
    max_size=30,
).map(b"".join)


def _check_fuzz(prefix: bytes, data: bytes, cuts: list[int], **limits: int) -> None:
    stream = prefix + data
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(stream)), len(stream)]
    reader = RequestReader(**limits)
    try:
        for a, b in itertools.pairwise(bounds):
            for request in reader.feed(stream[a:b]):
                assert isinstance(request, Request)
    except ProtocolError as exc:
        assert exc.status in ALLOWED_ERROR_STATUSES
        assert reader.finished


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_PREFIXES),
    st.one_of(st.binary(max_size=300), _HTTPISH),
    st.lists(st.integers(0, 400), max_size=8),
)
def test_fuzz_arbitrary_bytes_give_requests_or_protocol_error(
    prefix: bytes, data: bytes, cuts: list[int]
) -> None:
    _check_fuzz(prefix, data, cuts)


@settings(max_examples=200)
@given(st.sampled_from(_PREFIXES), st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=8))
def test_fuzz_with_tiny_limits(prefix: bytes, data: bytes, cuts: list[int]) -> None:
    _check_fuzz(prefix, data, cuts, max_header_bytes=32, max_headers=2, max_body_bytes=4)


# -- responses -------------------------------------------------------------------


def parse_response(data: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    line, *fields = head.split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for field in fields:
        name, _, value = field.partition(b": ")
        assert name.lower() not in headers, f"duplicate header {name!r}"
        headers[name.lower()] = value
    return line, headers, body


def test_response_has_content_length_and_closes_by_default() -> None:
    data = response(200, b'{"a": 1}', content_type=b"application/json")
    line, headers, body = parse_response(data)
    assert line == b"HTTP/1.1 200 OK"
    assert headers[b"content-length"] == b"8"
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close"
    assert headers[b"server"] == b"notary"
    assert body == b'{"a": 1}'


def test_keep_alive_response() -> None:
    _, headers, _ = parse_response(response(409, b"x", keep_alive=True))
    assert headers[b"connection"] == b"keep-alive"


def test_empty_body_still_has_content_length() -> None:
    data = response(204, b"")
    line, headers, body = parse_response(data)
    assert line == b"HTTP/1.1 204 No Content"
    assert headers[b"content-length"] == b"0"
    assert body == b""
    assert data.endswith(b"\r\n\r\n")


def test_extra_headers_are_written() -> None:
    _, headers, _ = parse_response(
        response(200, b"", extra_headers=((b"Proxy-Agent", b"notary"), (b"X-A", b"1")))
    )
    assert headers[b"proxy-agent"] == b"notary"
    assert headers[b"x-a"] == b"1"


@pytest.mark.parametrize(
    ("status", "phrase"),
    [(200, b"OK"), (400, b"Bad Request"), (405, b"Method Not Allowed"), (409, b"Conflict"),
     (413, b"Request Entity Too Large"), (431, b"Request Header Fields Too Large"),
     (503, b"Service Unavailable"), (505, b"HTTP Version Not Supported")],
)
def test_status_lines(status: int, phrase: bytes) -> None:
    assert status_line(status) == b"HTTP/1.1 %d %s\r\n" % (status, phrase)


@pytest.mark.parametrize("status", [0, 99, 299, 600, 999])
def test_unknown_status_is_refused(status: int) -> None:
    with pytest.raises(ValueError):
        status_line(status)
    with pytest.raises(ValueError):
        response(status, b"")


def test_error_response_body_is_the_message_and_a_newline() -> None:
    data = error_response(400, "malformed target")
    line, headers, body = parse_response(data)
    assert line == b"HTTP/1.1 400 Bad Request"
    assert body == b"malformed target\n"
    assert headers[b"content-length"] == str(len(body)).encode()
    assert headers[b"content-type"].startswith(b"text/plain")
    assert headers[b"connection"] == b"close"


def test_error_response_keep_alive_and_extra_headers() -> None:
    _, headers, body = parse_response(
        error_response(405, "method not allowed", keep_alive=True,
                       extra_headers=((b"Allow", b"GET, POST"),))
    )
    assert headers[b"connection"] == b"keep-alive"
    assert headers[b"allow"] == b"GET, POST"
    assert body == b"method not allowed\n"


def test_error_response_encodes_non_ascii_as_utf8() -> None:
    _, headers, body = parse_response(error_response(400, "bad host h\u00e9"))
    assert body == "bad host h\u00e9\n".encode()
    assert headers[b"content-length"] == str(len(body)).encode()


@given(st.sampled_from([200, 303, 400, 403, 404, 405, 408, 409, 413, 431, 503, 505]),
       st.binary(max_size=200), st.booleans())
def test_every_response_is_well_framed(status: int, body: bytes, keep_alive: bool) -> None:
    data = response(status, body, keep_alive=keep_alive)
    line, headers, rest = parse_response(data)
    assert re.fullmatch(rb"HTTP/1\.1 \d{3} [A-Za-z ,'-]+", line)
    assert int(headers[b"content-length"]) == len(body)
    assert headers[b"connection"] == (b"keep-alive" if keep_alive else b"close")
    assert data.endswith(b"\r\n\r\n" + body)
    assert rest == body


def test_error_status_of_every_reader_error_has_a_status_line() -> None:
    for status in ALLOWED_ERROR_STATUSES:
        assert status_line(status).startswith(b"HTTP/1.1 %d " % status)


def test_status_line_with_a_custom_reason() -> None:
    assert status_line(404, "Unable to connect") == b"HTTP/1.1 404 Unable to connect\r\n"
    for bad in ("caf\u00e9", "a\r\nInjected: 1"):
        with pytest.raises(ValueError, match="reason phrase"):
            status_line(404, bad)
    with pytest.raises(ValueError, match="unknown HTTP status"):
        status_line(299, "Custom")


# -- responses received by the client ------------------------------------------------


def test_parse_response_framed_and_until_close() -> None:
    from notary.protocol.http import parse_response

    framed = parse_response(b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\nX-A: b\r\n\r\n{}")
    assert (framed.status, framed.body, framed.header(b"x-a")) == (409, b"{}", b"b")
    legacy = parse_response(b"HTTP/1.0 404 Unable to connect\r\n\r\n<html>gone</html>")
    assert (legacy.status, legacy.body) == (404, b"<html>gone</html>")
    assert parse_response(response(200, b"abc")).body == b"abc"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        # A switch of protocols nobody asked for (httptools raised
        # HttpParserUpgrade, which is not an HttpParserError: issue 30, item 2).
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\nPRI *",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
        # Only interim answers: no response.
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
        # Statuses no final response has, and a second response.
        b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\x00garbage",
    ],
)
def test_parse_response_refuses_malformed_or_truncated(data: bytes) -> None:
    from notary.protocol.http import parse_response

    with pytest.raises(ProtocolError) as caught:
        parse_response(data)
    assert caught.value.status == 502


def test_parse_response_skips_interim_answers() -> None:
    """RFC 9110 15.2: a client parses any number of 1xx answers before the
    final one; their headers are not the response's."""
    from notary.protocol.http import parse_response

    answer = parse_response(
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n"
        b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert (answer.status, answer.body, answer.header(b"link")) == (409, b"{}", None)
    unframed = parse_response(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nrest")
    assert (unframed.status, unframed.body) == (200, b"rest")


def test_the_request_path_twin_in_use_follows_the_flags() -> None:
    """``make test-compiled`` (NOTARY_REQUIRE_EXTENSION) runs the compiled
    request path, ``make test-pure`` (NOTARY_NO_EXTENSIONS) its twin."""
    import os

    from notary.protocol import _fastrequest_py, hotpath, http

    def flag(name: str) -> bool:
        return os.environ.get(name, "") not in ("", "0")

    if flag("NOTARY_REQUIRE_EXTENSION"):
        assert hotpath.IMPLEMENTATION == "compiled"
        assert http.RequestReader is not _fastrequest_py.RequestReader
    elif flag("NOTARY_NO_EXTENSIONS"):
        assert hotpath.IMPLEMENTATION == "pure"
        assert http.RequestReader is _fastrequest_py.RequestReader
    assert http.Request is hotpath.Request
