"""Tests of notary.model.targets: pure functions, no name is resolved."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from notary.errors import BadTarget, ProtocolError
from notary.model.targets import (
    MAX_HOST_CHARS,
    MAX_HOST_INPUT_CHARS,
    MAX_LABEL_CHARS,
    NON_PUBLIC_SUFFIXES,
    NOT_PUBLIC_NAME,
    Target,
    format_convergence_target,
    make_target,
    normalise_host,
    parse_convergence_target,
    parse_port,
    public_name_refusal,
)
from notary.protocol import perspectives, relay, v2
from notary.protocol.http import RequestReader

# --- normalise_host: names ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("example.com", "example.com"),
        ("Example.COM", "example.com"),
        ("EXAMPLE.com.", "example.com"),  # one trailing dot stripped
        ("localhost", "localhost"),
        ("a", "a"),
        ("a-b.c0-9.example", "a-b.c0-9.example"),
        ("0.example", "0.example"),
        ("123.example", "123.example"),  # numeric labels fine unless last
        ("example.123abc", "example.123abc"),
        ("ab--cd.example", "ab--cd.example"),  # R-LDH label that is not xn--
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
    ],
)
def test_names(text: str, expected: str) -> None:
    assert normalise_host(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.Example", "xn--bcher-kva.example"),
        ("bücher.example.", "xn--bcher-kva.example"),
        ("bu\u0308cher.example", "xn--bcher-kva.example"),  # NFC applied
        ("bücher。example", "xn--bcher-kva.example"),  # ideographic full stop
        ("bücher\uff0eexample", "xn--bcher-kva.example"),  # fullwidth full stop
        ("\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45.com", "example.com"),  # fullwidth letters
        ("exam\u00adple.com", "example.com"),  # soft hyphen is ignored
        ("straße.de", "xn--strae-oqa.de"),  # IDNA 2008: no transitional ss
        ("例え.テスト", "xn--r8jz45g.xn--zckzah"),
        ("ab--cd.bücher.example", "ab--cd.xn--bcher-kva.example"),
        ("xn--bcher-kva.bücher", "xn--bcher-kva.xn--bcher-kva"),
    ],
)
def test_idna(text: str, expected: str) -> None:
    assert normalise_host(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        ".",
        "..",
        "example..com",
        "example.com..",
        ".example.com",
        "-example.com",
        "example-.com",
        "example.-com",
        "_dmarc.example.com",  # underscores refused
        "a_b.example",
        "exa mple.com",
        " example.com",
        "example.com ",
        "example.com\n",
        "example.com\x00",
        "\x00",
        "exa\x00mple.com",
        "example.com/path",
        "user@example.com",
        "example.com:443",  # colon: parsed as IPv6, which it is not
        "*.example.com",
        "exa%mple.com",
        "example.com]",
        "[example.com]",
        "[1.2.3.4]",
        "[::1",
        "\udc80",
        "\udc80.example",
        "bücher\udc80.example",
        "\ud83d\ude00.example",  # surrogate pair spelt as two lone surrogates
        "😀.example",  # emoji: not valid in IDNA 2008
        "ex\u200dample.com",  # ZWJ outside its context
        "xn--.example",
        "xn--zz.example",
        "xn--abc-.example",
        "\uff45\uff58\uff41\uff4d\uff50\uff4c\uff45\uff3f.com",  # fullwidth low line maps to "_"
        "bücher.exa_mple",
    ],
)
def test_bad_names(text: str) -> None:
    with pytest.raises(BadTarget):
        normalise_host(text)


def test_label_and_name_length_limits() -> None:
    label63 = "a" * MAX_LABEL_CHARS
    assert normalise_host(f"{label63}.example") == f"{label63}.example"
    with pytest.raises(BadTarget, match="label too long"):
        normalise_host(f"{'a' * (MAX_LABEL_CHARS + 1)}.example")
    # 253 characters: four labels of 63 and 61 plus three dots.
    name253 = ".".join([label63, label63, label63, "b" * 61])
    assert len(name253) == MAX_HOST_CHARS
    assert normalise_host(name253) == name253
    assert normalise_host(name253 + ".") == name253
    name254 = ".".join([label63, label63, label63, "b" * 62])
    with pytest.raises(BadTarget, match="too long"):
        normalise_host(name254)
    with pytest.raises(BadTarget, match="too long"):
        normalise_host(name254 + ".")
    with pytest.raises(BadTarget, match="too long"):
        normalise_host("a." * 200 + "example")


def test_idna_label_too_long_after_conversion() -> None:
    # 60 characters of Unicode make an A-label longer than 63.
    with pytest.raises(BadTarget):
        normalise_host("ü" * 60 + ".example")


@pytest.mark.parametrize(
    "text",
    [
        "a" * (MAX_HOST_INPUT_CHARS + 1),
        "ü" * (MAX_HOST_INPUT_CHARS + 1),
        "\x00" * 1_000_000,
        "a." * 1_000_000,
        "[" + ":" * 1_000_000 + "]",
    ],
)
def test_huge_input_refused(text: str) -> None:
    with pytest.raises(BadTarget, match="too long"):
        normalise_host(text)


def test_ignored_characters_do_not_bypass_the_length_limit() -> None:
    padded = "exam" + "\u00ad" * 900 + "ple.com"  # soft hyphens vanish
    assert normalise_host(padded) == "example.com"


@pytest.mark.parametrize("value", [None, 42, b"example.com", ["example.com"]])
def test_non_text_host(value: object) -> None:
    with pytest.raises(BadTarget):
        normalise_host(value)  # type: ignore[arg-type]


def test_errors_are_client_safe() -> None:
    with pytest.raises(BadTarget) as excinfo:
        normalise_host("<script>alert(1)</script>")
    assert "<" not in str(excinfo.value)
    assert excinfo.value.status == 400
    assert isinstance(excinfo.value, ProtocolError)


# --- normalise_host: IP literals -------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),  # well-formed; the address policy refuses it
        ("255.255.255.255", "255.255.255.255"),
        ("8.8.8.8.", "8.8.8.8"),
        (
            "\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11",
            "127.0.0.1",
        ),  # fullwidth digits map to ASCII
        ("[::1]", "::1"),
        ("::1", "::1"),  # bare IPv6 accepted
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("[2001:DB8::0:1]", "2001:db8::1"),
        ("[2001:db8:0:0:1:0:0:1]", "2001:db8::1:0:0:1"),
        ("2606:4700:4700:0000:0000:0000:0000:1111", "2606:4700:4700::1111"),
        ("[::]", "::"),
        ("[::ffff:192.0.2.1]", "192.0.2.1"),  # IPv4-mapped is the IPv4 address
        ("[::ffff:c000:201]", "192.0.2.1"),
        ("[64:ff9b::192.0.2.1]", "64:ff9b::c000:201"),
    ],
)
def test_ip_literals(text: str, expected: str) -> None:
    assert normalise_host(text) == expected
    assert Target(normalise_host(text), 443).is_ip_literal


@pytest.mark.parametrize(
    "text",
    [
        "127.1",
        "127.0.1",
        "0x7f.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "2130706433",
        "017700000001",
        "010.0.0.1",
        "127.0.0.01",
        "00.0.0.0",
        "256.0.0.1",
        "1.2.3.4.5",
        "1.2.3.999",
        "example.123",  # all-numeric final label that is not IPv4
        "example.0x1f",  # hex final label, as URL parsers read it
        "example.0x",
        "443",
        "1.2.3.4..",
        "[fe80::1%eth0]",
        "fe80::1%eth0",
        "[fe80::1%25eth0]",
        "[::1]]",
        "[[::1]]",
        "[:::1]",
        "[1::2::3]",
        "[::ffff:010.0.0.1]",
        "[]",
        "[::1]:443",
        "[::1].",
        "[\uff11::1]",
        ":",
        "::g",
    ],
)
def test_bad_ip_literals(text: str) -> None:
    with pytest.raises(BadTarget):
        normalise_host(text)


# --- parse_port and make_target -------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", 1), ("443", 443), ("65535", 65535), ("08443", 8443), ("00001", 1)],
)
def test_ports(text: str, expected: int) -> None:
    assert parse_port(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "00000",
        "65536",
        "99999",
        "100000",
        "000443",  # more than five digits
        "-1",
        "+443",
        " 443",
        "443 ",
        "443\n",
        "4 43",
        "abc",
        "0x1bb",
        "1e3",
        "443.0",
        "٤٤٣",  # Arabic-Indic digits
        "\uff14\uff14\uff13",  # fullwidth digits
        "\x00",
        "443\x00",
        "\udc80",
        "9" * 10_000,
    ],
)
def test_bad_ports(text: str) -> None:
    with pytest.raises(BadTarget):
        parse_port(text)


@pytest.mark.parametrize("value", [None, 443, b"443"])
def test_non_text_port(value: object) -> None:
    with pytest.raises(BadTarget):
        parse_port(value)  # type: ignore[arg-type]


def test_make_target() -> None:
    assert make_target("Example.COM.", 443) == Target("example.com", 443)
    assert make_target("bücher.example", "8443") == Target("xn--bcher-kva.example", 8443)
    assert make_target("[::1]", 65535) == Target("::1", 65535)
    assert make_target("::1", "1").key == "[::1]:1"
    for port in (0, -1, 65536, True, False, 443.0, None):
        with pytest.raises(BadTarget):
            make_target("example.com", port)  # type: ignore[arg-type]
    with pytest.raises(BadTarget):
        make_target("example..com", 443)


# --- Convergence segments ------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "expected"),
    [
        ("example.com+443", Target("example.com", 443)),
        ("Example.COM.+443", Target("example.com", 443)),
        ("bücher.example+8443", Target("xn--bcher-kva.example", 8443)),
        ("[::1]+443", Target("::1", 443)),
        ("::1+443", Target("::1", 443)),
        ("[2001:DB8::1]+4242", Target("2001:db8::1", 4242)),
        ("127.0.0.1+1", Target("127.0.0.1", 1)),
    ],
)
def test_parse_convergence_target(segment: str, expected: Target) -> None:
    target = parse_convergence_target(segment)
    assert target == expected
    assert parse_convergence_target(format_convergence_target(target)) == target


@pytest.mark.parametrize(
    ("segment", "message"),
    [
        ("example.com", "missing port"),
        ("example.com+", "missing port"),
        ("example.com:443", "missing port"),
        ("+443", "missing host"),
        ("+", "missing host"),
        ("", "missing port"),
        ("a+b+443", "more than one"),
        ("example.com++443", "more than one"),
        ("example.com+443+", "more than one"),
        ("example.com+0", "port"),
        ("example.com+65536", "port"),
        ("example.com+-1", "port"),
        ("example.com+abc", "port"),
        ("example.com+ 443", "port"),
        ("example.com +443", "character"),
        ("[::1]443", "missing port"),
        ("[::1]:443", "missing port"),
        ("[fe80::1%eth0]+443", "zone"),
        ("x" * 5000 + "+443", "too long"),
    ],
)
def test_bad_convergence_targets(segment: str, message: str) -> None:
    with pytest.raises(BadTarget, match=message):
        parse_convergence_target(segment)


def test_format_convergence_target() -> None:
    assert format_convergence_target(Target("example.com", 443)) == "example.com+443"
    assert format_convergence_target(Target("::1", 443)) == "[::1]+443"
    assert format_convergence_target(Target("192.0.2.1", 8443)) == "192.0.2.1+8443"


def test_target_api_unchanged() -> None:
    target = Target("::1", 443)
    assert target.key == str(target) == "[::1]:443"
    assert Target("example.com", 443).key == "example.com:443"
    assert not Target("example.com", 443).is_ip_literal


# --- public names only --------------------------------------------------------

#: (normalised host, reason): names a target may not have.
NOT_PUBLIC = [
    ("localhost", "localhost"),
    ("www.localhost", "localhost"),
    ("printer.local", "local"),
    ("a.b.local", "local"),
    ("duckduckgogg42xjoc72x3sjasowoarfbgcmvfimaftt6twagswzczad.onion", "onion"),
    ("www.example.onion", "onion"),
    ("x.invalid", "invalid"),
    ("invalid", "invalid"),
    ("corp.internal", "internal"),
    ("nas.home.arpa", "home.arpa"),
    ("home.arpa", "home.arpa"),
    ("x.alt", "alt"),
    ("intranet", "single-label"),
    ("com", "single-label"),
    ("xn--bcher-kva", "single-label"),
]

#: Names and IP literals the rule lets through (the address policy judges
#: the addresses).
PUBLIC = [
    "example.com",
    "www.example.test",  # RFC 6761: .test and .example are ordinary names
    "x.example",
    "localhost.example.com",  # the special labels elsewhere than at the end
    "local.example.com",
    "onion.example",
    "www.notlocal",
    "www.myalt",
    "x.arpa",
    "home.arpa.example",
    "127.0.0.1",
    "10.0.0.1",
    "::1",
    "fe80::1",
    "::",
]


@pytest.mark.parametrize(("host", "reason"), NOT_PUBLIC)
def test_non_public_names_are_refused(host: str, reason: str) -> None:
    assert normalise_host(host) == host  # well-formed: the rule is not syntax
    assert public_name_refusal(host) == reason
    with pytest.raises(BadTarget) as info:
        make_target(host, 443)
    assert info.value.message == NOT_PUBLIC_NAME
    assert info.value.status == 400
    with pytest.raises(BadTarget, match=NOT_PUBLIC_NAME):
        parse_convergence_target(format_convergence_target(Target(host, 443)))


@pytest.mark.parametrize("host", PUBLIC)
def test_public_names_and_ip_literals_pass(host: str) -> None:
    assert public_name_refusal(host) is None
    assert make_target(host, 443) == Target(normalise_host(host), 443)


@pytest.mark.parametrize(
    "spelling",
    [
        "LOCALHOST",
        "localhost.",
        "Printer.Local.",
        "drucker.l\u00f6cal.local",  # an IDN under .local
        "nas\u3002home\uff0earpa",  # ideographic and fullwidth full stops
        "WWW.Example.ONION",
        "intranet.",
        "INTRANET",
        "b\u00fccher",  # one IDN label
    ],
)
def test_every_spelling_of_a_non_public_name_is_refused(spelling: str) -> None:
    with pytest.raises(BadTarget, match=NOT_PUBLIC_NAME):
        make_target(spelling, "443")
    with pytest.raises(BadTarget, match=NOT_PUBLIC_NAME):
        parse_convergence_target(f"{spelling}+443")


def test_the_suffixes_are_normalised_names() -> None:
    for suffix in NON_PUBLIC_SUFFIXES:
        assert normalise_host(suffix) == suffix
    assert "test" not in NON_PUBLIC_SUFFIXES and "example" not in NON_PUBLIC_SUFFIXES


def test_normalise_host_alone_keeps_such_names() -> None:
    """Notary hosts (bundles, notary lists, relay bundles) and opt-outs are
    spelt by normalise_host; the name rule is the target parsers'."""
    assert normalise_host("Notary.Internal.") == "notary.internal"
    assert normalise_host("localhost") == "localhost"


def _request(data: bytes):
    [request] = RequestReader().feed(data)
    return request


@pytest.mark.parametrize("host", ["localhost", "printer.local", "x.onion", "intranet"])
def test_every_protocol_parser_refuses_non_public_names(host: str) -> None:
    """The parsers of each protocol's request (v2 batches, WebSocket
    queries, Perspectives queries, relay CONNECT lines) inherit the rule."""
    body = (
        b'{"targets":[{"host":"www.example.test","port":443},{"host":"%s","port":443}]}'
        % host.encode()
    )
    with pytest.raises(BadTarget) as info:
        v2.parse_query_request(body, max_batch=10, max_body_bytes=4096)
    assert info.value.status == 400
    assert info.value.message == f"targets[1].host: {NOT_PUBLIC_NAME}"
    with pytest.raises(BadTarget, match=NOT_PUBLIC_NAME) as info:
        perspectives.parse_query(b"host=%s&port=443&service_type=2" % host.encode())
    assert info.value.status == 400
    for head in (
        b"CONNECT %s:4242 HTTP/1.1\r\nHost: %s\r\n\r\n" % (host.encode(), host.encode()),
        b"CONNECT notary.example.test:4242 HTTP/1.1\r\nX-Convergence-Notary: %s+4242\r\n\r\n"
        % host.encode(),
    ):
        for mode_independent in (1, 8):
            with pytest.raises(ProtocolError) as error:
                relay.parse_connect_request(_request(head), max_destinations=mode_independent)
            assert error.value.status == 400
            assert error.value.message == f"bad destination: {NOT_PUBLIC_NAME}"


def test_relay_destinations_may_still_be_public_names_and_ip_literals() -> None:
    head = (
        b"CONNECT notary.example.test:4242 HTTP/1.1\r\n"
        b"X-Convergence-Notary: 127.0.0.2+4242, [::1]+4242\r\n\r\n"
    )
    request = _request(head)
    parsed = relay.parse_connect_request(request, max_destinations=8)
    assert parsed.destinations == ("notary.example.test", "127.0.0.2", "::1")


# --- properties ---------------------------------------------------------------

_LABEL_CHARS = st.sampled_from(
    [*"abcxyzABCXYZ0123456789-_.+[]:%", "ü", "ß", "例", "。", "\u00ad", "\x00", "\udc80"]
)
_LABEL = st.text(_LABEL_CHARS, min_size=0, max_size=12)
_ANY_CHAR = st.characters(exclude_categories=())  # lone surrogates included
_UNICODE_LABEL = st.text(st.characters(categories=("L", "M", "N", "Pd")), max_size=12)
_PLAUSIBLE_HOST = st.one_of(
    st.lists(_LABEL, min_size=1, max_size=5).map(".".join),
    st.lists(_UNICODE_LABEL, min_size=1, max_size=4).map(".".join),
    st.text(_ANY_CHAR, max_size=40),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.ip_addresses(v=6).map(str),
    st.lists(st.integers(0, 300).map(str), min_size=1, max_size=5).map(".".join),
)
_PLAUSIBLE_PORT = st.one_of(st.integers(-5, 70000).map(str), st.text(max_size=6))
_SEGMENT = st.one_of(
    st.text(_ANY_CHAR, max_size=300),
    st.builds(lambda h, p: f"{h}+{p}", _PLAUSIBLE_HOST, _PLAUSIBLE_PORT),
)


@given(_SEGMENT)
@example("[::1]+443")
@example("bücher.example.+443")
@example("[::ffff:1.2.3.4]+443")
@example("a+b+443")
def test_parse_convergence_target_round_trips_or_raises_bad_target(segment: str) -> None:
    try:
        target = parse_convergence_target(segment)
    except BadTarget:
        return
    assert isinstance(target, Target)
    assert 1 <= target.port <= 65535
    formatted = format_convergence_target(target)
    assert parse_convergence_target(formatted) == target
    # The formatted segment is ASCII, and the host is a fixed point.
    assert formatted.isascii()
    assert normalise_host(target.host) == target.host


@given(st.one_of(st.text(), _PLAUSIBLE_HOST))
def test_normalise_host_is_idempotent_or_raises_bad_target(text: str) -> None:
    try:
        host = normalise_host(text)
    except BadTarget:
        return
    assert normalise_host(host) == host
    assert host.isascii()
    assert host == host.lower()
    assert len(host) <= MAX_HOST_CHARS


@given(st.text(max_size=8))
def test_parse_port_returns_a_port_or_raises_bad_target(text: str) -> None:
    try:
        port = parse_port(text)
    except BadTarget:
        return
    assert 1 <= port <= 65535
    assert str(port) == text.lstrip("0")
