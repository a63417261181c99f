"""The cache-hit fast paths: ``convergence.answer_status`` (one pass, one
``now``) against ``decide`` + ``status_of``; the fast form parser against
the general one; prepared HTTP responses; the API's target memo."""

from __future__ import annotations

import functools
import hashlib

import pytest
import trio
from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st

from notary.config import V2Config
from notary.errors import ProtocolError
from notary.model.observations import Certificate, Observation, ProbeReport, Timeline
from notary.model.targets import Target
from notary.protocol import convergence, http, tlog, v2
from notary.protocol.convergence import Decision
from notary.server import api
from notary.server.api import ApiHandler
from notary.service.query import Answer, response_index
from notary.service.records import RECORD_OVERHEAD_BYTES, RecordSigner, TargetRecord
from notary.state import crypto
from tests.support.observations import probe_result

TARGET = Target("example.com", 443)
SHA1S = [hashlib.sha1(bytes([i])).digest() for i in range(4)]


def certificate(index: int) -> Certificate:
    return Certificate(
        der=bytes([index]),
        sha1=SHA1S[index],
        sha256=hashlib.sha256(bytes([index])).digest(),
        md5=b"",
        spki_sha256=b"",
    )


observations = st.builds(
    lambda index, first, length: Observation(certificate(index), first, first + length),
    st.integers(0, 3),
    st.integers(0, 1000),
    st.integers(0, 500),
)
timelines = st.lists(observations, max_size=4, unique_by=lambda o: o.certificate.sha1).map(
    lambda obs: Timeline(TARGET, tuple(obs))
)
fingerprints = st.one_of(st.none(), st.sampled_from(SHA1S), st.binary(min_size=20, max_size=20))


@given(timelines, fingerprints, st.integers(0, 2000), st.integers(0, 600), st.integers(0, 600))
def test_answer_status_agrees_with_decide_and_status_of(
    timeline: Timeline, fingerprint: bytes | None, now: int, fresh_for_s: int, reprobe_after_s: int
) -> None:
    decision = convergence.decide(
        timeline, fingerprint, now=now, fresh_for_s=fresh_for_s, reprobe_after_s=reprobe_after_s
    )
    expected = None
    if decision is Decision.ANSWER:
        expected = convergence.status_of(timeline, fingerprint, now=now, fresh_for_s=fresh_for_s)
    got = convergence.answer_status(timeline, fingerprint, now, fresh_for_s, reprobe_after_s)
    assert got == expected


def outcome(parse, body: bytes) -> tuple:
    try:
        return ("ok", parse(body))
    except ProtocolError as exc:
        return ("error", exc.status, exc.message)


FAST_FORM = st.from_regex(rb"\Afingerprint=[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){19}\Z", fullmatch=True)
FORM_BYTES = st.sampled_from(list(b"fingerprt=&:%+ 0123456789ABCDEFabcdef\n\x00\xff"))


@given(
    st.one_of(
        FAST_FORM,
        FAST_FORM.map(lambda body: body + b"\n"),
        FAST_FORM.map(lambda body: body.replace(b":", b"%3A")),
        FAST_FORM.map(lambda body: b"a=1&" + body),
        st.lists(FORM_BYTES, max_size=80).map(bytes),
        st.binary(max_size=100),
        st.binary(min_size=1020, max_size=1030),
    )
)
def test_fast_form_parser_agrees_with_the_general_one(body: bytes) -> None:
    assert outcome(convergence.parse_fingerprint_form, body) == outcome(
        convergence._parse_fingerprint_form_slowly, body
    )


def test_fast_form_gives_the_fingerprint() -> None:
    fp = bytes(range(20))
    body = b"fingerprint=" + convergence.format_fingerprint(fp).lower().encode()
    assert convergence.parse_fingerprint_form(body) == fp


def test_record_responses_are_what_the_handler_would_build() -> None:
    timeline = Timeline(TARGET, (Observation(certificate(0), 1, 2),))
    record = TargetRecord(timeline, record_signer()[0])
    for status in (200, 409):
        for keep_alive in (False, True):
            expected = http.response(
                status, record.convergence_body, content_type=convergence.CONTENT_TYPE,
                keep_alive=keep_alive,
            )
            assert record.http_responses[response_index(status, keep_alive)] == expected


@functools.cache
def keys() -> tuple:
    return crypto.generate_rsa_key(), crypto.generate_perspectives_key()


@functools.cache
def real_certificate(index: int) -> Certificate:
    cert = crypto.make_self_signed_certificate(keys()[0], f"site{index}.example")
    return Certificate.from_der(cert.public_bytes(serialization.Encoding.DER))


class WorstCaseLog:
    """A statement log that sequences at once, with the largest inclusion a
    statement can carry: a 40-hash proof, a checkpoint of a long origin."""

    origin = "notary.example.org/" + "v2/log/" * 10

    def promise(self, signed_at: int) -> dict[str, object]:
        return v2.log_promise(self.origin, signed_at=signed_at, max_merge_delay_s=3600)

    def submit(self, signed: v2.SignedStatement) -> None:
        key = crypto.generate_ed25519_key()
        note = tlog.sign_note(
            tlog.format_checkpoint(tlog.Checkpoint(self.origin, 2**40 - 1, bytes(32))),
            self.origin, key.sign, crypto.ed25519_public_raw(key),
        )
        assert signed.log is not None
        signed.log.item = v2.inclusion_item(
            signed.entry, index=2**40 - 2, proof=[bytes(32)] * 40, checkpoint=note
        )


def record_signer(log: WorstCaseLog | None = None) -> tuple[RecordSigner, list[str]]:
    """A signer for every protocol, and the log of what it signed."""
    convergence_key, perspectives_key = keys()
    signed: list[str] = []

    class Counting(RecordSigner):
        def convergence_body(self, timeline):
            signed.append("convergence")
            return super().convergence_body(timeline)

        def perspectives_body(self, timeline):
            signed.append("perspectives")
            return super().perspectives_body(timeline)

        def v2_statement(self, timeline, dane=None):
            signed.append("v2")
            return super().v2_statement(timeline, dane)

    signer = Counting(
        crypto.ConvergenceSigner(convergence_key), crypto.PerspectivesSigner(perspectives_key),
        crypto.Ed25519Signer(crypto.generate_ed25519_key()), V2Config(), lambda: 1_000_000.0,
        log=log,
    )
    return signer, signed


def test_a_record_signs_each_protocol_once_on_first_use() -> None:
    signer, signed = record_signer()
    timeline = Timeline(TARGET, (Observation(real_certificate(0), 1, 2),))
    record = TargetRecord(timeline, signer)
    assert signed == []  # a probe or a store load signs nothing
    first = record.http_responses
    assert record.http_responses is first and record.convergence_body in first[0]
    assert signed == ["convergence"]
    statement = record.v2_statement
    probed = record.with_probe(ProbeReport.of(probe_result(TARGET.host)), changed=False)
    assert probed.v2_statement is statement  # copies keep answers
    assert probed.last_probe is not None and probed.last_probe.chain == ()  # no chain kept
    assert record.perspectives_body == record.perspectives_body
    assert signed == ["convergence", "v2", "perspectives"]
    assert statement is not None
    due = statement.valid_until - V2Config().renew_before_s
    renewed, _ = record.v2_statement_at(due)  # a renewal, signed in place
    assert renewed is not statement and record.v2_statement is renewed
    assert probed.v2_statement is statement  # the copy keeps its own
    assert signed[-1] == "v2" and len(signed) == 4


@pytest.mark.parametrize("logged", [False, True])
@pytest.mark.parametrize("observations, runs, host", [
    (1, 1, "example.com"), (3, 1, "example.com"), (2, 40, "example.com"), (10, 3, "example.com"),
    (1, 1, ("a" * 62 + ".") * 4 + "com"),
])
def test_record_size_bounds_the_fully_signed_record(
    observations: int, runs: int, host: str, logged: bool
) -> None:
    signer, _ = record_signer(WorstCaseLog() if logged else None)
    timeline = Timeline(Target(host, 443), tuple(
        Observation(
            real_certificate(i), 1000 * i, 1000 * i + 900,
            addresses=("192.0.2.1", "2001:db8::1"),
            runs=tuple((1000 * i + 10 * r, 1000 * i + 10 * r + 5) for r in range(runs)),
        )
        for i in range(observations)
    ))
    record = TargetRecord(timeline, signer)
    size = record.size
    for name in ("http_responses", "perspectives_body", "v2_statement"):
        getattr(record, name)
    ders = sum(len(o.certificate.der) for o in timeline.observations)
    assert record.size == size  # fixed: the cache's accounting cannot drift
    assert ders + record.signed_bytes() <= size - RECORD_OVERHEAD_BYTES
    assert size - RECORD_OVERHEAD_BYTES <= 1.25 * (ders + record.signed_bytes())  # not lavish


class FakeService:
    """Answers GET at once (prepared bytes) and POST only when awaited."""

    def __init__(self) -> None:
        self.targets: list[Target] = []

    def answer_at_once(
        self, target: Target, fingerprint, keep_alive: bool, client=None
    ) -> bytes | None:
        self.targets.append(target)
        return b"prepared" if fingerprint is None else None

    async def answer(self, target: Target, fingerprint, client=None) -> Answer:
        self.targets.append(target)
        return Answer(409, b"body")


def get(path: bytes, *, keep_alive: bool = True) -> http.Request:
    return http.Request(b"GET", path, "1.1", (), b"", keep_alive)


def answer(handler: ApiHandler, request: http.Request) -> tuple[bytes, bool]:
    """What the connection loop does: the fast path, else the handler."""
    return handler.answer_at_once(request) or trio.run(handler, request)


def test_prepared_responses_are_sent_as_they_are() -> None:
    service = FakeService()
    handler = ApiHandler(service, index_text="")  # type: ignore[arg-type]
    assert handler.answer_at_once(get(b"/target/Example.COM.+443")) == (b"prepared", True)
    request = http.Request(b"POST", b"/target/example.com+443", "1.1", (), b"fingerprint=" +
                           convergence.format_fingerprint(bytes(20)).encode(), False)
    assert handler.answer_at_once(request) is None
    response, keep_alive = answer(handler, request)
    assert keep_alive is False
    assert response == http.response(
        409, b"body", content_type=convergence.CONTENT_TYPE, keep_alive=False
    )


def test_the_fast_path_leaves_errors_to_the_handler() -> None:
    service = FakeService()
    handler = ApiHandler(service, index_text="")  # type: ignore[arg-type]
    for request in (
        get(b"/target/example.com+0"),
        get(b"/target/" + b"a" * 2000 + b"+443"),
        http.Request(b"PUT", b"/target/example.com+443", "1.1", (), b"", True),
        http.Request(b"POST", b"/target/example.com+443", "1.1", (), b"fingerprint=zz", True),
        get(b"/"),
    ):
        assert handler.answer_at_once(request) is None
        response, _ = answer(handler, request)
        assert response.startswith(b"HTTP/1.1 4") or request.target == b"/"
    assert service.targets == []


def test_a_query_string_is_not_part_of_the_target() -> None:
    """The fast path and the handler read ``/target/<host>+<port>?...`` alike:
    the target before the ``?``, however long the query string."""
    service = FakeService()
    handler = ApiHandler(service, index_text="")  # type: ignore[arg-type]
    request = get(b"/target/Example.COM.+443?" + b"x" * 2000)
    assert handler.answer_at_once(request) == (b"prepared", True)
    response, _ = trio.run(handler, request)
    assert response.startswith(b"HTTP/1.1 409 ")
    assert service.targets == [TARGET, TARGET]


def test_the_target_memo_is_exact_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    service = FakeService()
    handler = ApiHandler(service, index_text="")  # type: ignore[arg-type]
    answer(handler, get(b"/target/Example.COM.+443/192.0.2.1"))
    answer(handler, get(b"/target/Example.COM.+443"))
    answer(handler, get(b"/target/example.com+0443"))
    assert service.targets == [TARGET] * 3
    assert service.targets[0] is service.targets[1]  # memoised
    # Errors are answered every time and never stored.
    for _ in range(2):
        response, _ = answer(handler, get(b"/target/example.com+0"))
        assert response.startswith(b"HTTP/1.1 400 ")
    assert b"example.com+0" not in handler._queries
    assert b"Example.COM.+443" in handler._queries
    monkeypatch.setattr(api, "TARGET_MEMO_ENTRIES", 4)
    handler = ApiHandler(service, index_text="")  # type: ignore[arg-type]
    for port in range(1, 10):
        answer(handler, get(b"/target/example.com+%d" % port))
        assert len(handler._queries) <= 4
    assert service.targets[-1] == Target("example.com", 9)


def test_record_size_counts_each_certificate_dane_judged() -> None:
    """A DANE verdict on a site serving ten certificates at once (issue 31)
    against one on one of them: the nine more judgements, in memory and in
    the statement's ``judged`` (its bytes and its answer entry), are within
    what the record's size adds for them, and not lavishly."""
    import sys
    from datetime import UTC, datetime

    from notary.model.dane import DnssecStatus, Presented, Tlsa, TlsaLookup, verdict_on

    convergence_key, perspectives_key = keys()
    signer = RecordSigner(
        crypto.ConvergenceSigner(convergence_key), crypto.PerspectivesSigner(perspectives_key),
        crypto.Ed25519Signer(crypto.generate_ed25519_key()), V2Config(), lambda: 1_000_000.0,
        backends=("dane",),
    )
    certificates = [real_certificate(i) for i in range(10)]
    timeline = Timeline(TARGET, tuple(
        Observation(c, 1000 * i, 1000 * i + 900, addresses=("192.0.2.1",))
        for i, c in enumerate(certificates)
    ))
    # One record vouches for two of them (3 0 1: the whole certificate's SHA-256).
    lookup = TlsaLookup(DnssecStatus.SECURE, tuple(
        Tlsa(3, 0, 1, c.sha256) for c in certificates[:2]), 300, 999_000)

    def judged(count: int) -> TargetRecord:
        dane = verdict_on(
            lookup, [Presented(c.sha256, c.sha1, (c.der,)) for c in certificates[:count]],
            TARGET.host, datetime.fromtimestamp(1_000_000, UTC), max_reuse_s=600)
        record = TargetRecord(timeline, signer).with_dane(dane)
        assert record.v2_statement is not None
        return record

    one, ten = judged(1), judged(10)
    assert ten.dane is not None and len(ten.dane.others) == 9
    statement, single = ten.v2_statement, one.v2_statement
    assert statement is not None and single is not None
    memory = sum(
        sys.getsizeof(j) + sys.getsizeof(j.sha256) + sys.getsizeof(j.sha1) + 8
        + (sys.getsizeof(j.matched) if j.matched is not None else 0)
        for j in ten.dane.others
    )
    signed = (len(statement.statement) - len(single.statement)) + (
        ten.signed_bytes() - one.signed_bytes())
    added = ten.size - one.size
    assert memory + signed <= added <= 1.25 * (memory + signed)
