"""Convergence rules as pure functions: fingerprints, forms, decisions."""

import datetime

import pytest
from cryptography.hazmat.primitives.serialization import Encoding
from hypothesis import given
from hypothesis import strategies as st

from notary.errors import ProtocolError
from notary.model.observations import Certificate, ProbeResult, Timeline
from notary.model.targets import Target
from notary.protocol import convergence
from notary.protocol.convergence import Decision, decide
from notary.state import crypto

FP = "8F:C0:79:E8:14:77:7F:68:8B:A4:C8:07:D9:BD:67:D6:2A:F7:1A:EB"
TARGET = Target("example.com", 443)
DAY = 86400


@pytest.fixture(scope="module")
def certs():
    key = crypto.generate_rsa_key()
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    return [
        Certificate.from_der(
            crypto.make_self_signed_certificate(key, f"c{i}.test", now=now).public_bytes(
                Encoding.DER
            )
        )
        for i in range(3)
    ]


def seen(timeline, cert, at, address="192.0.2.1"):
    return timeline.merged(ProbeResult(TARGET, cert, (cert.der,), address, at))


def test_fingerprint_round_trip_and_case():
    digest = convergence.parse_fingerprint(FP.lower())
    assert convergence.format_fingerprint(digest) == FP
    assert convergence.parse_fingerprint(FP) == digest


@pytest.mark.parametrize(
    "text",
    ["", FP[:-3], FP + ":00", FP.replace(":", ""), FP.replace(":", "-"), "ZZ" + FP[2:], FP + " "],
)
def test_bad_fingerprints_are_400(text):
    with pytest.raises(ProtocolError) as info:
        convergence.parse_fingerprint(text)
    assert info.value.status == 400


@pytest.mark.parametrize(
    "body",
    [f"fingerprint={FP}", f"fingerprint={FP.replace(':', '%3A')}", f"a=b&fingerprint={FP}"],
)
def test_form_bodies(body):
    assert convergence.format_fingerprint(convergence.parse_fingerprint_form(body.encode())) == FP


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"", 400),
        (b"fingerprint=", 400),
        (b"finger=" + FP.encode(), 400),
        (f"fingerprint={FP}&fingerprint={FP}".encode(), 400),
        (b"\xff\xfe", 400),
        (b"fingerprint=" + b"A" * 2000, 413),
    ],
)
def test_bad_form_bodies(body, status):
    with pytest.raises(ProtocolError) as info:
        convergence.parse_fingerprint_form(body)
    assert info.value.status == status


@given(st.binary(max_size=300))
def test_form_parser_never_raises_anything_else(body):
    try:
        convergence.parse_fingerprint_form(body)
    except ProtocolError as exc:
        assert 400 <= exc.status < 500


def test_entries_newest_finish_first(certs):
    timeline = seen(seen(seen(Timeline(TARGET), certs[0], 100), certs[1], 200), certs[0], 150)
    entries = convergence.entries_of(timeline)
    assert [(e.sha1, e.start, e.finish) for e in entries] == [
        (certs[1].sha1, 200, 200),
        (certs[0].sha1, 100, 150),
    ]


def test_parse_answer_of_own_body_round_trips(certs):
    timeline = seen(seen(Timeline(TARGET), certs[0], 100), certs[1], 200)
    payload = convergence.signed_payload(convergence.entries_of(timeline))
    parsed = convergence.parse_answer(convergence.answer_body(payload, "c2ln"))
    assert parsed.payload == payload
    assert parsed.signature_b64 == "c2ln"


@pytest.mark.parametrize(
    "body", [b"", b"[]", b"{}", b'{"fingerprintList": [], "signature": 5}', b'{"signature": "x"}']
)
def test_parse_answer_rejects_malformed(body):
    with pytest.raises(ProtocolError) as info:
        convergence.parse_answer(body)
    assert info.value.status == 502


class TestDecide:
    now = 10 * DAY

    def decide(self, timeline, fingerprint, reprobe_after_s=60):
        return decide(
            timeline, fingerprint, now=self.now, fresh_for_s=DAY, reprobe_after_s=reprobe_after_s
        )

    def test_unknown_target_probes(self, certs):
        assert self.decide(None, None) is Decision.PROBE
        assert self.decide(Timeline(TARGET), certs[0].sha1) is Decision.PROBE

    def test_fresh_fingerprint_answers(self, certs):
        timeline = seen(Timeline(TARGET), certs[0], self.now - DAY + 1)
        assert self.decide(timeline, certs[0].sha1) is Decision.ANSWER
        assert convergence.status_of(timeline, certs[0].sha1, now=self.now, fresh_for_s=DAY) == 200

    def test_stale_fingerprint_probes(self, certs):
        timeline = seen(Timeline(TARGET), certs[0], self.now - DAY - 1)
        assert self.decide(timeline, certs[0].sha1) is Decision.PROBE
        assert self.decide(timeline, None) is Decision.PROBE

    def test_unknown_fingerprint_probes_unless_just_probed(self, certs):
        old = seen(Timeline(TARGET), certs[0], self.now - 61)
        assert self.decide(old, certs[1].sha1) is Decision.PROBE
        recent = seen(Timeline(TARGET), certs[0], self.now - 59)
        assert self.decide(recent, certs[1].sha1) is Decision.ANSWER
        assert convergence.status_of(recent, certs[1].sha1, now=self.now, fresh_for_s=DAY) == 409
        assert self.decide(recent, certs[1].sha1, reprobe_after_s=0) is Decision.PROBE

    def test_fresh_get_answers(self, certs):
        timeline = seen(Timeline(TARGET), certs[0], self.now)
        assert self.decide(timeline, None) is Decision.ANSWER

    def test_failed_probe(self, certs):
        timeline = seen(Timeline(TARGET), certs[0], 1)
        assert convergence.status_after_failed_probe(timeline, None) == 200
        assert convergence.status_after_failed_probe(timeline, certs[0].sha1) is None
        assert convergence.status_after_failed_probe(None, None) is None


def test_timeline_merge_moves_forward_only(certs):
    timeline = seen(Timeline(TARGET), certs[0], 500, "192.0.2.1")
    later = seen(timeline, certs[0], 400, "192.0.2.2")
    (observation,) = later.observations
    assert (observation.first_seen, observation.last_seen) == (400, 500)
    assert observation.addresses == ("192.0.2.2", "192.0.2.1")
    assert seen(later, certs[0], 500, "192.0.2.2") == later
