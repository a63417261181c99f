"""The client's parser of Convergence answers
(:func:`notary.protocol.convergence.parse_answer`), as strict as the v2
parsers and on the same loader (:mod:`notary.protocol.strictjson`): bounded
size and depth, exact shapes, nothing coerced (issue 17, item 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notary.errors import ProtocolError
from notary.protocol import convergence, strictjson, v2
from notary.protocol.http import parse_response

ANSWERS = sorted((Path(__file__).parent.parent / "corpus" / "answers").glob("*.http"))
FP = "AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD"


def answer(rows: list[object], signature: object = "c2ln", **extra: object) -> bytes:
    return json.dumps({"fingerprintList": rows, "signature": signature, **extra}).encode()


def row(start: object = "1", finish: object = "2", fingerprint: object = FP) -> dict:
    return {"timestamp": {"start": start, "finish": finish}, "fingerprint": fingerprint}


def refused(body: bytes) -> str:
    with pytest.raises(ProtocolError) as info:
        convergence.parse_answer(body)
    assert info.value.status == 502
    return info.value.message


def test_a_well_formed_answer_is_taken_apart() -> None:
    parsed = convergence.parse_answer(answer([row("10", "20"), row("5", "5", FP.lower())]))
    assert [(e.start, e.finish) for e in parsed.entries] == [(10, 20), (5, 5)]
    assert parsed.entries[1].sha1 == bytes.fromhex(FP.replace(":", ""))
    assert parsed.payload == json.dumps({"fingerprintList": [row("10", "20"),
                                                             row("5", "5", FP.lower())]}).encode()
    assert parsed.signature_b64 == "c2ln"


@pytest.mark.parametrize(("body", "message"), [
    (b"[" * 200_000, "not strict UTF-8 JSON"),
    (b'{"a":' * 200_000, "not strict UTF-8 JSON"),
    (b'{"fingerprintList": [], "fingerprintList": [], "signature": "c2ln"}',
     "not strict UTF-8 JSON"),
    (b'{"fingerprintList": NaN, "signature": "c2ln"}', "not strict UTF-8 JSON"),
    (b'{"fingerprintList": [], "signature": "\xff"}', "not strict UTF-8 JSON"),
    (answer([], note="x"), "answer must be an object with fingerprintList, signature"),
    (answer([{**row(), "x": 1}]), "fingerprintList[0] must be an object with"),
    (answer([{"timestamp": {"start": "1", "finish": "2", "x": "3"}, "fingerprint": FP}]),
     "fingerprintList[0].timestamp must be an object"),
    (answer([row(start=1)]), "fingerprintList[0].timestamp.start must be a string"),
    (answer([row(start=True)]), "timestamp.start must be a string"),
    (answer([row(start=" 1")]), "timestamp.start must be a string"),
    (answer([row(start="1_0", finish="1_1")]), "timestamp.start must be a string"),
    (answer([row(start="-1")]), "timestamp.start must be a string"),
    (answer([row(start="\u0661")]), "timestamp.start must be a string"),
    (answer([row(finish="9" * 5000)]), "timestamp.finish must be a string"),
    (answer([row(start="3", finish="2")]), "timestamp.finish is before start"),
    (answer([row(fingerprint="AA")]), "fingerprint must be 20 hex pairs"),
    (answer([row(fingerprint=None)]), "fingerprint must be 20 hex pairs"),
    (answer([row(fingerprint=FP.replace(":", "-"))]), "fingerprint must be 20 hex pairs"),
    (answer([row()], signature=5), "signature must be base64"),
    (answer([row()], signature="no base64!"), "signature must be base64"),
    (answer([row()], signature="A" * 2000), "signature must be base64"),
    (b'{"fingerprintList": {}, "signature": "c2ln"}', "fingerprintList must be an array"),
    (b"[" * (convergence.MAX_ANSWER_BYTES + 1), "too large"),
])
def test_every_defect_is_refused_by_name(body: bytes, message: str) -> None:
    assert message in refused(body)


def test_every_corpus_answer_with_a_list_status_is_refused() -> None:
    checked = 0
    for path in ANSWERS:
        try:
            response = parse_response(path.read_bytes())
        except ProtocolError:
            continue  # refused before its body (tests/test_client_hostile.py)
        if response.status in (200, 409):
            refused(response.body)
            checked += 1
    assert checked >= 25


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.binary(max_size=400),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                 lambda kids: st.lists(kids, max_size=3)
                 | st.dictionaries(st.sampled_from(["fingerprintList", "signature",
                                                    "timestamp", "start", "finish",
                                                    "fingerprint"]), kids, max_size=3),
                 max_leaves=25).map(lambda v: json.dumps(v).encode()),
))
def test_any_body_parses_or_is_refused_with_a_502(body: bytes) -> None:
    try:
        parsed = convergence.parse_answer(body)
    except ProtocolError as exc:
        assert exc.status == 502
    else:
        assert parsed.payload.isascii()


@settings(max_examples=200, deadline=None)
@given(st.lists(
    st.tuples(st.binary(min_size=20, max_size=20), st.integers(0, 10**12 - 1),
              st.integers(0, 10**6)),
    max_size=5,
))
def test_what_a_notary_sends_parses_back_to_what_it_signed(
    rows: list[tuple[bytes, int, int]],
) -> None:
    entries = [convergence.ListEntry(sha1, start, start + span) for sha1, start, span in rows
               if start + span < 10**12]
    payload = convergence.signed_payload(entries)
    parsed = convergence.parse_answer(convergence.answer_body(payload, "c2lnbmF0dXJl"))
    assert list(parsed.entries) == entries
    assert parsed.payload == payload


def test_one_strict_loader_serves_both_protocols() -> None:
    assert v2._loads is strictjson.loads
    with pytest.raises(ValueError, match="nesting too deep"):
        strictjson.loads(b"[" * 200_000)
    with pytest.raises(strictjson.DuplicateKey):
        strictjson.loads(b'{"a": 1, "a": 1}')
    with pytest.raises(ValueError):
        strictjson.loads(b"[Infinity]")
    with pytest.raises(ValueError):
        strictjson.loads(b'"\xff"')
    assert strictjson.loads(b"[" + b"9" * 21 + b"]") == [strictjson.HUGE_INTEGER]
    assert strictjson.loads(b"[" + b"9" * 20 + b"]") == [10**20 - 1]
