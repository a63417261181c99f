"""Perspectives rules as pure functions: service ids, runs, the signed blob,
the reply XML, queries, the notary list and the index page."""

import base64
import hashlib
import itertools
import re
import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from hypothesis import given
from hypothesis import strategies as st

from notary.errors import BadTarget, ProtocolError, UsageError
from notary.model.observations import add_sighting
from notary.model.targets import Target, make_target
from notary.protocol import perspectives
from notary.protocol.http import parse_response
from notary.protocol.perspectives import KeyHistory
from notary.state import crypto

HOUR = 3600
WINDOW = 48 * HOUR
T0 = 1_700_000_000
MD5_A = hashlib.md5(b"a").digest()
MD5_B = hashlib.md5(b"b").digest()


@pytest.fixture(scope="module")
def key():
    return crypto.generate_perspectives_key()


# -- service ids --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (Target("example.com", 443), "example.com:443,2"),
        (make_target("Example.COM.", "8443"), "example.com:8443,2"),
        (make_target("192.0.2.1", 443), "192.0.2.1:443,2"),
        (make_target("[0:0::1]", 443), "[::1]:443,2"),
        (make_target("bücher.example", 443), "xn--bcher-kva.example:443,2"),
    ],
)
def test_service_id(target, expected):
    assert perspectives.service_id(target) == expected


# -- KeyHistory ---------------------------------------------------------------------


def test_key_history_normalises_to_tuples():
    history = KeyHistory(MD5_A, [[1, 2], (3, 4)])
    assert history.timespans == ((1, 2), (3, 4))
    assert history.newest == 4
    assert KeyHistory(MD5_A, ()).newest is None


@pytest.mark.parametrize(
    ("md5", "timespans"),
    [
        (MD5_A[:15], ()),
        (bytearray(MD5_A), ()),
        ("00" * 16, ()),
        (MD5_A, ((2, 1),)),
        (MD5_A, ((-1, 1),)),
        (MD5_A, ((0, 2**32),)),
        (MD5_A, ((True, 2),)),
        (MD5_A, ((1.0, 2),)),
        (MD5_A, ((1, 2, 3),)),
        (MD5_A, (1,)),
        (MD5_A, ((1, 1),) * 0x10000),
    ],
)
def test_key_history_refuses_what_the_blob_cannot_carry(md5, timespans):
    with pytest.raises(ValueError):
        KeyHistory(md5, timespans)


# -- runs ---------------------------------------------------------------------------


def test_observations_47_hours_apart_make_one_run():
    runs = add_sighting((), T0, WINDOW)
    assert add_sighting(runs, T0 + 47 * HOUR, WINDOW) == ((T0, T0 + 47 * HOUR),)


def test_observations_49_hours_apart_make_two_runs():
    runs = add_sighting((), T0, WINDOW)
    assert add_sighting(runs, T0 + 49 * HOUR, WINDOW) == (
        (T0, T0),
        (T0 + 49 * HOUR, T0 + 49 * HOUR),
    )


def test_a_gap_of_exactly_the_window_still_extends():
    assert add_sighting(((T0, T0),), T0 + WINDOW, WINDOW) == ((T0, T0 + WINDOW),)
    assert add_sighting(((T0, T0),), T0 + WINDOW + 1, WINDOW) == (
        (T0, T0),
        (T0 + WINDOW + 1, T0 + WINDOW + 1),
    )


def test_out_of_order_observations():
    runs = ((T0, T0 + 10 * HOUR), (T0 + 100 * HOUR, T0 + 110 * HOUR))
    # inside a run: nothing changes
    assert add_sighting(runs, T0 + 5 * HOUR, WINDOW) == runs
    # before the first run, within the window: the run starts earlier
    assert add_sighting(runs, T0 - 40 * HOUR, WINDOW) == (
        (T0 - 40 * HOUR, T0 + 10 * HOUR),
        runs[1],
    )
    # long before: a run of its own, first
    assert add_sighting(runs, T0 - 60 * HOUR, WINDOW)[0] == (
        T0 - 60 * HOUR,
        T0 - 60 * HOUR,
    )
    # between two runs, within the window of both: they become one
    assert add_sighting(runs, T0 + 55 * HOUR, WINDOW) == ((T0, T0 + 110 * HOUR),)
    # between, within the window of the later one only
    assert add_sighting(runs, T0 + 70 * HOUR, WINDOW) == (
        runs[0],
        (T0 + 70 * HOUR, T0 + 110 * HOUR),
    )


def test_unsorted_or_overlapping_input_runs_are_merged():
    runs = ((T0 + 100, T0 + 200), (T0, T0 + 150), (T0 + 10 * WINDOW, T0 + 10 * WINDOW))
    assert add_sighting(runs, T0 + 50, 0) == (
        (T0, T0 + 200),
        (T0 + 10 * WINDOW, T0 + 10 * WINDOW),
    )


def test_bad_runs_and_windows_are_refused():
    with pytest.raises(ValueError):
        add_sighting(((T0 + 1, T0),), T0, WINDOW)
    with pytest.raises(ValueError):
        add_sighting((), T0, -1)


def model_runs(times, window):
    """Runs from scratch: sort every observation time and split where two
    consecutive ones are more than ``window`` apart."""
    runs = []
    for t in sorted(times):
        if runs and t - runs[-1][1] <= window:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return tuple((start, end) for start, end in runs)


@given(
    times=st.lists(st.integers(0, 2_000), min_size=1, max_size=40),
    window=st.integers(0, 300),
    data=st.data(),
)
def test_runs_equal_the_model_in_any_insertion_order(times, window, data):
    order = data.draw(st.permutations(times))
    runs = ()
    for t in order:
        runs = add_sighting(runs, t, window)
        # Invariants hold after every step: sorted, separated by > window.
        assert all(start <= end for start, end in runs)
        assert all(b[0] - a[1] > window for a, b in itertools.pairwise(runs))
    assert runs == model_runs(times, window)


@given(
    times=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20),
    window=st.sampled_from([0, HOUR, WINDOW, 2**31]),
    data=st.data(),
)
def test_runs_equal_the_model_for_real_timestamps(times, window, data):
    runs = ()
    for t in data.draw(st.permutations(times)):
        runs = add_sighting(runs, t, window)
    assert runs == model_runs(times, window)
    KeyHistory(MD5_A, runs)  # always representable in the blob


# -- the signed blob ----------------------------------------------------------------


def hand_blob(service, keys):
    """PROTOCOLS.md 2.3, written out by hand."""
    out = service.encode("ascii") + b"\x00"
    for md5, spans in reversed(keys):
        out += struct.pack(">HHB", len(spans), 16, 3) + md5
        for start, end in spans:
            out += struct.pack(">II", start, end)
    return out


def test_signed_blob_by_hand():
    keys = [
        (MD5_A, [(1, 2), (0x01020304, 0xFFFFFFFF)]),
        (MD5_B, [(T0, T0 + 5)]),
    ]
    histories = [KeyHistory(md5, tuple(spans)) for md5, spans in keys]
    blob = perspectives.signed_blob("example.com:443,2", histories)
    assert blob == hand_blob("example.com:443,2", keys)
    # The last key of the XML comes first in the blob.
    assert blob[18:23] == b"\x00\x01\x00\x10\x03"
    assert blob[23:39] == MD5_B
    assert blob.endswith(
        MD5_A + b"\x00\x00\x00\x01\x00\x00\x00\x02\x01\x02\x03\x04\xff\xff\xff\xff"
    )


def test_signed_blob_without_keys_is_the_service_id_and_nul():
    assert perspectives.signed_blob("a.example:1,2", []) == b"a.example:1,2\x00"


@pytest.mark.parametrize("service", ["b\u00fccher:443,2", "a\x00b:443,2"])
def test_signed_blob_refuses_odd_service_ids(service):
    with pytest.raises(ValueError):
        perspectives.signed_blob(service, [])


# -- reply XML ----------------------------------------------------------------------


def test_reply_xml_layout():
    keys = [KeyHistory(MD5_A, ((1, 2), (5, 9))), KeyHistory(MD5_B, ())]
    assert perspectives.reply_xml(keys, "QUJD+/==") == (
        b'<notary_reply sig="QUJD+/==" sig_type="rsa-md5" version="1">\n'
        b'\t<key fp="' + MD5_A.hex(":").encode() + b'" type="ssl">\n'
        b'\t\t<timestamp end="2" start="1"/>\n'
        b'\t\t<timestamp end="9" start="5"/>\n'
        b"\t</key>\n"
        b'\t<key fp="' + MD5_B.hex(":").encode() + b'" type="ssl">\n'
        b"\t</key>\n"
        b"</notary_reply>\n"
    )
    assert perspectives.reply_xml([], "QQ==") == (
        b'<notary_reply sig="QQ==" sig_type="rsa-md5" version="1">\n</notary_reply>\n'
    )


@pytest.mark.parametrize("signature", ["", 'a"b', "a b", "QQ==\n", "<x>", None])
def test_reply_xml_refuses_a_signature_that_is_not_base64(signature):
    with pytest.raises(ValueError):
        perspectives.reply_xml([], signature)


def test_canonical_key_order():
    a, b = KeyHistory(MD5_A, ()), KeyHistory(MD5_B, ())
    assert MD5_A < MD5_B
    assert perspectives.canonical_key_order([b, a]) == (a, b)


def test_md5_fingerprints():
    text = perspectives.format_md5_fingerprint(MD5_A)
    assert text == text.lower() and len(text) == 47
    assert perspectives.parse_md5_fingerprint(text.upper()) == MD5_A
    with pytest.raises(ValueError):
        perspectives.format_md5_fingerprint(MD5_A[:8])


# -- round trip with a fresh key ---------------------------------------------------------

SERVICE = "example.com:443,2"
SPAN_RE = re.compile(r'<timestamp end="(\d+)" start="(\d+)"/>')


def signed_reply(key, histories, service=SERVICE):
    signer = crypto.PerspectivesSigner(key)
    signature = signer.sign(perspectives.signed_blob(service, histories))
    assert signer.signatures_made == 1
    return perspectives.reply_xml(histories, signature)


def histories():
    return [
        KeyHistory(MD5_B, ((T0, T0 + 10 * HOUR), (T0 + 100 * HOUR, T0 + 130 * HOUR))),
        KeyHistory(MD5_A, ((T0 + 200 * HOUR, T0 + 300 * HOUR),)),
    ]


def test_round_trip(key):
    xml = signed_reply(key, histories())
    reply = perspectives.parse_reply(xml)
    assert reply.keys == tuple(histories())
    assert (reply.version, reply.sig_type) == ("1", "rsa-md5")
    blob = perspectives.signed_blob(SERVICE, reply.keys)
    assert crypto.verify_perspectives_signature(key.public_key(), blob, reply.signature_b64)
    # An independent check from the spec: regex the text, pack by hand,
    # verify with cryptography directly.
    text = xml.decode("ascii")
    keys = [
        (bytes.fromhex(fp.replace(":", "")), [(int(s), int(e)) for e, s in SPAN_RE.findall(body)])
        for fp, body in re.findall(r'<key fp="([0-9a-f:]{47})" type="ssl">(.*?)</key>', text, re.S)
    ]
    signature = base64.b64decode(re.search(r'sig="([^"]+)"', text).group(1))
    key.public_key().verify(signature, hand_blob(SERVICE, keys), padding.PKCS1v15(), hashes.MD5())


@pytest.mark.parametrize(
    "tamper",
    [
        lambda xml: xml.replace(str(T0 + 130 * HOUR).encode(), str(T0 + 131 * HOUR).encode()),
        lambda xml: xml.replace(f'start="{T0}"'.encode(), f'start="{T0 - 1}"'.encode()),
        lambda xml: xml.replace(
            MD5_A.hex(":").encode(), hashlib.md5(b"c").digest().hex(":").encode()
        ),
    ],
)
def test_tampered_replies_fail(key, tamper):
    xml = signed_reply(key, histories())
    tampered = tamper(xml)
    assert tampered != xml
    reply = perspectives.parse_reply(tampered)
    blob = perspectives.signed_blob(SERVICE, reply.keys)
    assert not crypto.verify_perspectives_signature(key.public_key(), blob, reply.signature_b64)


def test_key_order_and_service_are_signed(key):
    reply = perspectives.parse_reply(signed_reply(key, histories()))
    public = key.public_key()
    swapped = perspectives.signed_blob(SERVICE, reply.keys[::-1])
    assert not crypto.verify_perspectives_signature(public, swapped, reply.signature_b64)
    other = perspectives.signed_blob("example.com:444,2", reply.keys)
    assert not crypto.verify_perspectives_signature(public, other, reply.signature_b64)


@pytest.mark.parametrize(
    "signature",
    ["", "not base64!", "QQ==", "A" * 344, None, 12, "\u00e9"],
)
def test_verify_never_raises_on_garbage(key, signature):
    assert not crypto.verify_perspectives_signature(key.public_key(), b"blob", signature)


def test_verify_refuses_non_keys(key):
    signature = crypto.PerspectivesSigner(key).sign(b"blob")
    assert crypto.verify_perspectives_signature(key.public_key(), b"blob", signature)
    assert not crypto.verify_perspectives_signature(None, b"blob", signature)
    assert not crypto.verify_perspectives_signature(key, b"blob", signature)  # private
    assert not crypto.verify_perspectives_signature(key.public_key(), "blob", signature)


def test_public_key_pem(key):
    pem = crypto.public_key_pem(key)
    assert pem == crypto.public_key_pem(key.public_key())
    assert pem.startswith("-----BEGIN PUBLIC KEY-----\n")
    assert load_pem_public_key(pem.encode()).public_numbers() == key.public_key().public_numbers()


def test_key_sizes(key):
    assert key.key_size == crypto.PERSPECTIVES_KEY_BITS == 2048
    with pytest.raises(UsageError):
        crypto.generate_perspectives_key(512)


# -- hostile replies ----------------------------------------------------------------

HEAD = b'<notary_reply sig="QUJD" sig_type="rsa-md5" version="1">'
FP = MD5_A.hex(":").encode()


def key_xml(fp=FP, spans=b'<timestamp end="2" start="1"/>', attrs=None):
    attrs = attrs if attrs is not None else b'fp="' + fp + b'" type="ssl"'
    return b"<key " + attrs + b">" + spans + b"</key>"


def reply(*children):
    return HEAD + b"".join(children) + b"</notary_reply>"


LAUGHS = (
    b'<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol">'
    b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>\n'
    b'<notary_reply sig="&lol2;" sig_type="rsa-md5" version="1"/>'
)


@pytest.mark.parametrize(
    "xml",
    [
        pytest.param(LAUGHS, id="entity-expansion"),
        pytest.param(b'<!DOCTYPE r SYSTEM "file:///etc/passwd"><notary_reply/>', id="external-dtd"),
        pytest.param(b"<!doctype x>" + reply(), id="lower-case-doctype"),
        pytest.param(reply() + b" " * perspectives.MAX_REPLY_BYTES, id="huge"),
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00\xff garbage", id="garbage"),
        pytest.param(b"HTTP/1.1 200 OK\r\n\r\n", id="not-xml"),
        pytest.param(reply()[:-3], id="truncated"),
        pytest.param(HEAD.replace(b"QUJD", b"\xc3\xa9") + b"</notary_reply>", id="non-ascii"),
        pytest.param(b"<html/>", id="wrong-root"),
        pytest.param(b'<notary_reply sig_type="rsa-md5" version="1"/>', id="missing-sig"),
        pytest.param(b'<notary_reply sig="QUJD" version="1"/>', id="missing-sig-type"),
        pytest.param(b'<notary_reply sig="QUJD" sig_type="rsa-md5"/>', id="missing-version"),
        pytest.param(HEAD.replace(b"QUJD", b"Q U") + b"</notary_reply>", id="sig-not-base64"),
        pytest.param(reply(key_xml(fp=FP[:-3])), id="short-fp"),
        pytest.param(reply(key_xml(fp=FP.replace(b":", b"-"))), id="dashed-fp"),
        pytest.param(reply(key_xml(fp=b"zz" + FP[2:])), id="non-hex-fp"),
        pytest.param(reply(key_xml(attrs=b'type="ssl"')), id="missing-fp"),
        pytest.param(reply(key_xml(attrs=b'fp="' + FP + b'"')), id="missing-type"),
        pytest.param(reply(key_xml(attrs=b'fp="' + FP + b'" type="ssh"')), id="ssh-key"),
        pytest.param(reply(key_xml(spans=b'<timestamp end="x" start="1"/>')), id="nan-time"),
        pytest.param(reply(key_xml(spans=b'<timestamp end="2" start="-1"/>')), id="negative"),
        pytest.param(reply(key_xml(spans=b'<timestamp end="1.5" start="1"/>')), id="float"),
        pytest.param(reply(key_xml(spans=b'<timestamp end=" 2" start="1"/>')), id="blank"),
        pytest.param(
            reply(key_xml(spans=b'<timestamp end="4294967296" start="1"/>')), id="overflow"
        ),
        pytest.param(reply(key_xml(spans=b'<timestamp end="1" start="2"/>')), id="backwards"),
        pytest.param(reply(key_xml(spans=b'<timestamp start="1"/>')), id="missing-end"),
        pytest.param(reply(key_xml(spans=b'<timestamp end="2"/>')), id="missing-start"),
        pytest.param(reply(key_xml(spans=b"<stamp/>")), id="unknown-in-key"),
        pytest.param(
            reply(key_xml(spans=b'<timestamp end="2" start="1">x</timestamp>')), id="text-in-ts"
        ),
        pytest.param(reply(key_xml(spans=b"hello")), id="text-in-key"),
        pytest.param(reply(b"<other/>"), id="unknown-in-reply"),
        pytest.param(reply(b"text"), id="text-in-reply"),
        pytest.param(b"<a>" * 50_000 + b"</a>" * 50_000, id="deep"),
    ],
)
def test_hostile_replies_are_502(xml):
    with pytest.raises(ProtocolError) as info:
        perspectives.parse_reply(xml)
    assert info.value.status == 502
    assert len(info.value.message) < 100


def test_reply_parser_accepts_harmless_variations():
    xml = b'<?xml version="1.0" encoding="UTF-8"?>\n<!-- a comment -->\n' + reply(
        key_xml(fp=FP.upper()), b"\n  "
    )
    parsed = perspectives.parse_reply(bytearray(xml))
    assert parsed.keys == (KeyHistory(MD5_A, ((1, 2),)),)
    # Version and sig_type are reported for the caller to judge.
    other = perspectives.parse_reply(b'<notary_reply sig="QQ==" sig_type="rsa-sha1" version="2"/>')
    assert (other.version, other.sig_type, other.keys) == ("2", "rsa-sha1", ())


def test_declared_encoding_cannot_hide_a_doctype():
    xml = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE x><notary_reply/>'.encode("utf-16")
    with pytest.raises(ProtocolError) as info:
        perspectives.parse_reply(xml)
    assert info.value.status == 502


@given(st.binary(max_size=300))
def test_parse_reply_raises_only_protocol_errors(data):
    try:
        perspectives.parse_reply(data)
    except ProtocolError as exc:
        assert exc.status == 502


# -- queries ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (b"", None),
        (b"&", None),
        (b"host=example.com", Target("example.com", 443)),
        (b"host=example.com&port=8443", Target("example.com", 8443)),
        (b"host=www.citibank.com&port=443&service_type=2", Target("www.citibank.com", 443)),
        (b"service_type=2&port=443&host=Example.COM.", Target("example.com", 443)),
        (b"host=%65xample.com&port=%34%34%33", Target("example.com", 443)),
        (b"host=%5B0%3A0%3A%3A1%5D&port=443", Target("::1", 443)),
        (b"host=::1", Target("::1", 443)),
        (b"host=b%C3%BCcher.example", Target("xn--bcher-kva.example", 443)),
        (b"host=192.0.2.1&port=00443", Target("192.0.2.1", 443)),
    ],
)
def test_good_queries(query, expected):
    assert perspectives.parse_query(query) == expected


@pytest.mark.parametrize(
    ("query", "status", "error"),
    [
        (b"host=example.com&foo=1", 400, ProtocolError),
        (b"hostname=example.com", 400, ProtocolError),
        (b"host=a.example&host=b.example", 400, ProtocolError),
        (b"host=example.com&port=443&port=443", 400, ProtocolError),
        (b"host=", 400, BadTarget),
        (b"host", 400, BadTarget),
        (b"port=443", 400, BadTarget),
        (b"service_type=2", 400, BadTarget),
        (b"host=example.com&service_type=1", 400, ProtocolError),
        (b"host=example.com&service_type=", 400, ProtocolError),
        (b"host=example.com&service_type=02", 400, ProtocolError),
        (b"host=example.com&port=0", 400, BadTarget),
        (b"host=example.com&port=65536", 400, BadTarget),
        (b"host=example.com&port=", 400, BadTarget),
        (b"host=example.com&port=-1", 400, BadTarget),
        (b"host=example.com&port=4%2043", 400, BadTarget),
        (b"host=exa%20mple.com", 400, BadTarget),
        (b"host=exa+mple.com", 400, BadTarget),
        (b"host=a..b", 400, BadTarget),
        (b"host=127.1", 400, BadTarget),
        (b"host=fe80::1%25eth0", 400, BadTarget),
        (b"host=%00", 400, BadTarget),
        (b"host=%FF", 400, ProtocolError),
        (b"host=\xc3\xa9", 400, ProtocolError),
        (b"a=1&" * 9 + b"host=x", 400, ProtocolError),
        (b"host=" + b"a" * perspectives.MAX_QUERY_BYTES, 414, ProtocolError),
    ],
)
def test_bad_queries(query, status, error):
    with pytest.raises(error) as info:
        perspectives.parse_query(query)
    assert info.value.status == status
    assert b"\xc3" not in info.value.message.encode()


# -- the client's notary list ------------------------------------------------------------


def test_notary_list_round_trip(key):
    pem = crypto.public_key_pem(key)
    text = (
        "# revision 1\n\n"
        + perspectives.format_notary_list_entry("Notary.Example:8080", pem, "our notary")
        + perspectives.format_notary_list_entry("[::1]:8080", pem, None)
    )
    assert text.count("\n# our notary\nnotary.example:8080\n-----BEGIN PUBLIC KEY-----\n") == 1
    assert "\n[::1]:8080\n" in text
    entries = perspectives.parse_notary_list(text)
    assert [(e.host, e.port) for e in entries] == [("notary.example", 8080), ("::1", 8080)]
    assert all(e.public_key_pem == pem for e in entries)
    # CRLF line ends and indentation are tolerated.
    assert perspectives.parse_notary_list(text.replace("\n", "\r\n  ")) == entries


def test_empty_notary_list():
    assert perspectives.parse_notary_list("# nothing\n\n") == []


BEGIN = "-----BEGIN PUBLIC KEY-----\n"


@pytest.fixture(scope="module")
def pem(key):
    return crypto.public_key_pem(key)


@pytest.mark.parametrize(
    ("make_text", "line"),
    [
        (lambda pem: "# c\n" + pem, 2),  # key without host
        (lambda pem: "a.example:8080\n", 1),  # host without key
        (lambda pem: "a.example:8080\nb.example:8080\n" + pem, 1),  # two hosts
        (lambda pem: "a.example:8080\n" + pem.rsplit("-----END", 1)[0], 2),  # unterminated
        (lambda pem: "\na.example\n" + pem, 2),  # no port
        (lambda pem: "a.example:0\n" + pem, 1),
        (lambda pem: "a..example:8080\n" + pem, 1),
        (lambda pem: "[::1:8080\n" + pem, 1),
        (lambda pem: "a.example:8080\n" + pem.replace("\n", "\n!!!", 2).replace("!!!", "", 1), 2),
        (lambda pem: "a.example:8080\n-----BEGIN CERTIFICATE-----\n", 2),
        (lambda pem: "a.example:8080\n" + pem.replace(BEGIN, BEGIN * 2, 1), 3),
    ],
)
def test_bad_notary_lists_name_the_line(pem, make_text, line):
    with pytest.raises(perspectives.NotaryListError) as info:
        perspectives.parse_notary_list(make_text(pem))
    assert info.value.line == line
    assert str(info.value).startswith(f"line {line}: ")
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, UsageError)


def test_notary_list_refuses_non_rsa_keys():
    ec_pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    with pytest.raises(perspectives.NotaryListError, match="not RSA") as info:
        perspectives.parse_notary_list("# x\na.example:8080\n" + ec_pem)
    assert info.value.line == 3


@pytest.mark.parametrize(
    ("host_port", "pem_text", "comment"),
    [
        ("a.example:8080", "not a pem", None),
        ("a.example:8080", None, "two\nlines"),
        ("a.example", None, None),
        ("a.example:99999", None, None),
    ],
)
def test_bad_notary_list_entries(pem, host_port, pem_text, comment):
    with pytest.raises(ValueError):
        perspectives.format_notary_list_entry(host_port, pem_text or pem, comment)


# -- index page ---------------------------------------------------------------------


def test_index_page(pem):
    raw = perspectives.index_page(
        version="0.1.0<b>",
        public_key_pem=pem,
        settings={"merge_window_s": "172800", "<script>": "a&b"},
    )
    answer = parse_response(raw)
    assert answer.status == 200
    assert answer.header(b"content-type").startswith(b"text/html")
    body = answer.body.decode()
    assert pem.strip() in body
    assert "0.1.0&lt;b&gt;" in body
    assert "&lt;script&gt;" in body and "<script>" not in body
    assert "a&amp;b" in body and "172800" in body
    assert b"Connection: close" in raw
    keep = perspectives.index_page(version="1", public_key_pem=pem, settings={}, keep_alive=True)
    assert b"Connection: keep-alive" in keep


def test_a_query_parsed_lately_is_remembered_and_a_refused_one_is_not() -> None:
    """Parsing a Perspectives query is remembered (bounded): the same bytes
    give the same target again without being parsed; a refused query raises
    every time and takes no room."""
    from notary.protocol.perspectives import PARSED_QUERIES, _parse_query

    query = b"host=Remembered.Example.ORG&port=8443&service_type=2"
    first = perspectives.parse_query(query)
    hits = _parse_query.cache_info().hits
    assert perspectives.parse_query(bytearray(query)) == first  # any bytes-like query
    assert _parse_query.cache_info().hits == hits + 1
    assert first is not None and (first.host, first.port) == ("remembered.example.org", 8443)
    size = _parse_query.cache_info().currsize
    for _ in range(2):
        with pytest.raises(ProtocolError):
            perspectives.parse_query(b"host=a.example&service_type=1")
    assert _parse_query.cache_info().currsize == size
    assert _parse_query.cache_info().maxsize == PARSED_QUERIES
