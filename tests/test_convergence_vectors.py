"""Interop with real Convergence answers captured from public notaries in 2011."""

import hashlib
import json

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from notary.protocol import convergence
from notary.protocol.bundle import parse_bundle
from notary.state.crypto import verify_convergence_signature
from tests.vectors_path import SHARED_VECTORS, VECTORS

DIR = VECTORS / "convergence"
GOOD = {
    "notary.thoughtcrime.org": "response-notary.thoughtcrime.org.json",
    "notary2.thoughtcrime.org": "response-notary2.thoughtcrime.org.json",
}
BAD = "bad-response-notary.thoughtcrime.org.json"


@pytest.fixture(scope="module")
def host_keys():
    bundle = parse_bundle((DIR / "thoughtcrime.notary").read_bytes())
    return {h.host: h.certificate.public_key() for h in bundle.hosts}


def test_vectors_match_shared():
    if not SHARED_VECTORS.is_dir():
        pytest.skip(f"{SHARED_VECTORS} not present (running outside the workplace)")
    for path in sorted(VECTORS.rglob("*")):
        if path.is_file():
            assert path.read_bytes() == (SHARED_VECTORS / path.relative_to(VECTORS)).read_bytes()


def test_serialiser_reproduces_signed_bytes_exactly():
    body = (DIR / GOOD["notary.thoughtcrime.org"]).read_bytes()
    document = json.loads(body)
    rows = [
        convergence.ListEntry(
            bytes.fromhex(row["fingerprint"].replace(":", "")),
            int(row["timestamp"]["start"]),
            int(row["timestamp"]["finish"]),
        )
        for row in document["fingerprintList"]
    ]
    assert len(rows) == 10
    payload = convergence.signed_payload(rows)
    signature = document["signature"]
    # The signed bytes are the body without its signature member...
    assert payload == body.replace(b', "signature": "' + signature.encode() + b'"', b"")
    # ...and the wire body is rebuilt byte for byte, with no trailing newline.
    assert convergence.answer_body(payload, signature) == body
    assert not body.endswith(b"\n")


@pytest.mark.parametrize("host", sorted(GOOD))
def test_good_answers_verify_only_with_their_hosts_key(host_keys, host):
    answer = convergence.parse_answer((DIR / GOOD[host]).read_bytes())
    assert len(answer.entries) == 10
    for key_host, key in host_keys.items():
        expected = key_host == host
        assert verify_convergence_signature(key, answer.payload, answer.signature_b64) is expected


def test_bad_answer_fails_with_both_keys(host_keys):
    answer = convergence.parse_answer((DIR / BAD).read_bytes())
    for key in host_keys.values():
        assert not verify_convergence_signature(key, answer.payload, answer.signature_b64)


def test_entries_are_ordered_by_finish_descending():
    answer = convergence.parse_answer((DIR / GOOD["notary.thoughtcrime.org"]).read_bytes())
    finishes = [entry.finish for entry in answer.entries]
    assert finishes == sorted(finishes, reverse=True)


def test_bundle_pins_are_sha1_of_der():
    bundle = parse_bundle((DIR / "thoughtcrime.notary").read_bytes())
    for host in bundle.hosts:
        cert = x509.load_pem_x509_certificate(host.certificate_pem.encode())
        der = cert.public_bytes(Encoding.DER)
        assert host.sha1_pin == hashlib.sha1(der).digest().hex(":").upper()
