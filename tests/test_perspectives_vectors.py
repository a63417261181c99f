"""Interop with real Perspectives replies captured from public notaries in 2011.

``response.N`` is signed by the N-th notary of ``http_notary_list.txt`` (1 =
cmu, 2 = convoke, 3 = mvn, 4 = hostway); ``response-bad.1`` has an altered
fingerprint and must fail with every key.
"""

import base64
import itertools
import re
import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from notary.model.targets import make_target
from notary.protocol import perspectives
from notary.state.crypto import verify_perspectives_signature
from tests.vectors_path import SHARED_VECTORS, VECTORS

DIR = VECTORS / "perspectives"
SERVICE = "www.citibank.com:443,2"
NOTARIES = [
    "cmu.ron.lcs.mit.edu",
    "convoke.ron.lcs.mit.edu",
    "mvn.ron.lcs.mit.edu",
    "hostway.ron.lcs.mit.edu",
]
GOOD = [f"response.{n}" for n in range(1, 5)]
BAD = "response-bad.1"

_KEY_RE = re.compile(r'<key fp="([0-9a-f:]+)" type="ssl">(.*?)</key>', re.S)
_SPAN_RE = re.compile(r'<timestamp end="(\d+)" start="(\d+)"/>')


@pytest.fixture(scope="module")
def notary_list():
    return perspectives.parse_notary_list((DIR / "http_notary_list.txt").read_text("ascii"))


@pytest.fixture(scope="module")
def public_keys(notary_list):
    return [load_pem_public_key(entry.public_key_pem.encode()) for entry in notary_list]


def independent_blob(service, xml):
    """The signed bytes, from PROTOCOLS.md 2.3 alone: regular expressions
    over the text instead of our parser, ``struct`` by hand."""
    text = xml.decode("ascii")
    keys = []
    for fp, body in _KEY_RE.findall(text):
        spans = [(int(start), int(end)) for end, start in _SPAN_RE.findall(body)]
        keys.append((bytes.fromhex(fp.replace(":", "")), spans))
    blob = service.encode("ascii") + b"\x00"
    for md5, spans in reversed(keys):
        blob += struct.pack(">H", len(spans)) + struct.pack(">H", 16) + bytes([3]) + md5
        for start, end in spans:
            blob += struct.pack(">I", start) + struct.pack(">I", end)
    return blob


def test_vectors_match_shared():
    shared = SHARED_VECTORS / "perspectives"
    if not shared.is_dir():
        pytest.skip(f"{shared} not present (running outside the workplace)")
    ours = sorted(path.name for path in DIR.iterdir() if path.is_file())
    assert ours == sorted(path.name for path in shared.iterdir() if path.is_file())
    for name in ours:
        assert (DIR / name).read_bytes() == (shared / name).read_bytes()


def test_notary_list(notary_list, public_keys):
    assert [(entry.host, entry.port) for entry in notary_list] == [
        (host, 8080) for host in NOTARIES
    ]
    # The original notaries' keys are 1369-bit RSA.
    assert [key.key_size for key in public_keys] == [1369] * 4


def test_notary_list_entries_format_back(notary_list):
    text = (DIR / "http_notary_list.txt").read_text("ascii")
    for entry in notary_list:
        formatted = perspectives.format_notary_list_entry(
            f"{entry.host}:{entry.port}", entry.public_key_pem, entry.host
        )
        # The file's comment lines carry trailing blanks; the rest is verbatim.
        body = formatted.split("\n", 1)[1]
        assert body in text
        assert perspectives.parse_notary_list(formatted) == [entry]


def test_service_id_of_the_vectors():
    assert perspectives.service_id(make_target("www.citibank.com", 443)) == SERVICE
    assert perspectives.service_id(make_target("WWW.Citibank.COM.", "443")) == SERVICE


@pytest.mark.parametrize("index", range(4))
def test_each_reply_verifies_only_with_its_notarys_key(public_keys, index):
    xml = (DIR / GOOD[index]).read_bytes()
    reply = perspectives.parse_reply(xml)
    assert len(reply.keys) == 11
    assert (reply.version, reply.sig_type) == ("1", "rsa-md5")
    blob = perspectives.signed_blob(SERVICE, reply.keys)
    assert blob == independent_blob(SERVICE, xml)
    results = [verify_perspectives_signature(key, blob, reply.signature_b64) for key in public_keys]
    assert results == [i == index for i in range(4)]


@pytest.mark.parametrize("name", GOOD)
def test_reply_fails_for_another_service(public_keys, name):
    reply = perspectives.parse_reply((DIR / name).read_bytes())
    blob = perspectives.signed_blob("www.citibank.com:8443,2", reply.keys)
    assert not any(
        verify_perspectives_signature(key, blob, reply.signature_b64) for key in public_keys
    )


def test_bad_reply_fails_with_every_key(public_keys):
    reply = perspectives.parse_reply((DIR / BAD).read_bytes())
    blob = perspectives.signed_blob(SERVICE, reply.keys)
    for key in public_keys:
        assert not verify_perspectives_signature(key, blob, reply.signature_b64)


def test_serialiser_given_the_keys_produces_the_signed_bytes(public_keys):
    """Build KeyHistory values from the text (not from our parser): our blob
    is exactly the bytes the cmu notary signed."""
    xml = (DIR / "response.1").read_bytes()
    keys = [
        perspectives.KeyHistory(
            bytes.fromhex(fp.replace(":", "")),
            tuple((int(start), int(end)) for end, start in _SPAN_RE.findall(body)),
        )
        for fp, body in _KEY_RE.findall(xml.decode("ascii"))
    ]
    assert len(keys) == 11
    assert sum(len(key.timespans) for key in keys) > 50
    blob = perspectives.signed_blob(SERVICE, keys)
    signature = base64.b64decode(perspectives.parse_reply(xml).signature_b64)
    # Verified with cryptography directly, not through our helper.
    public_keys[0].verify(signature, blob, padding.PKCS1v15(), hashes.MD5())


@pytest.mark.parametrize("name", [*GOOD, BAD])
def test_reply_xml_rebuilds_the_captured_bytes(name):
    xml = (DIR / name).read_bytes()
    reply = perspectives.parse_reply(xml)
    rebuilt = perspectives.reply_xml(reply.keys, reply.signature_b64)
    assert rebuilt == xml
    assert perspectives.parse_reply(rebuilt) == reply


@pytest.mark.parametrize("name", GOOD)
def test_captured_histories_follow_our_ordering_rules(name):
    reply = perspectives.parse_reply((DIR / name).read_bytes())
    # Keys by MD5 ascending, runs by start and disjoint: the order we write.
    assert perspectives.canonical_key_order(reply.keys) == reply.keys
    for key in reply.keys:
        assert list(key.timespans) == sorted(key.timespans)
        for (_, end), (start, _) in itertools.pairwise(key.timespans):
            assert start > end
