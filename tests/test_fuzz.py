"""Fuzzing of what a client's bytes reach first: the request parser
(``notary.protocol.http.RequestReader``, each of its twins: the compiled
``notary.protocol._fastrequest`` and the pure ``_fastrequest_py``, which
must also agree with each other) and the target normaliser
(``notary.model.targets``), plus the parsers behind them (Convergence
form, Perspectives query, relay CONNECT, the API's percent-decoding).

Two parts: the checked-in seed corpus (``tests/corpus/``, see its README)
replayed in full, and hypothesis tests that mutate those seeds and generate
new inputs, bounded by ``max_examples`` and a ``deadline`` so that they take
a few seconds per run.

The invariants:

1. Only the project's own errors escape: ``ProtocolError`` (``BadTarget``
   for targets), with a status the server can answer.
2. Feeding a stream split anywhere gives the same outcome as feeding it in
   one piece: the same requests, the same error status, the same bytes
   after an upgrade. One documented tolerance: the bound on an unfinished
   header line (431) counts the raw bytes of the feeds that completed
   nothing, while a completed line counts its name and value (llhttp drops
   the whitespace before a value): so a split stream can meet a 431 where
   the whole one did not (yet), or met a later error (a malformed byte, a
   body over its bound), or is still waiting for bytes. Memory stays bounded
   either way. No other difference is allowed.
3. Normalisation is idempotent (a normalised host normalises to itself,
   a formatted target parses back to itself), and the three ways to make
   a target (a segment, a host and a port, the API's percent-encoded path)
   agree.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notary.errors import BadTarget, ProtocolError
from notary.model.targets import (
    MAX_HOST_CHARS,
    Target,
    format_convergence_target,
    make_target,
    normalise_host,
    parse_convergence_target,
)
from notary.protocol.convergence import parse_fingerprint_form, parse_target_segment
from notary.protocol.http import RequestReader
from notary.protocol.perspectives import parse_query
from notary.protocol.relay import RelayRefused, parse_connect_request
from tests.support.twins import KINDS, twin

FAST_REQUEST = "notary.protocol._fastrequest"

CORPUS = Path(__file__).parent / "corpus"
REQUESTS = sorted((CORPUS / "requests").glob("*.http"))
TARGETS: list[str] = [
    json.loads(line)
    for line in (CORPUS / "targets.jsonl").read_text(encoding="ascii").splitlines()
    if line.strip()
]
#: Statuses the reader may raise with (invariant 1).
READER_STATUSES = {400, 413, 431, 505}
#: Small limits, to reach every bound with short inputs.
TINY = {"max_header_bytes": 64, "max_headers": 3, "max_body_bytes": 8}
FUZZ = settings(
    max_examples=250,
    deadline=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_the_corpus_is_there() -> None:
    assert len(REQUESTS) >= 30
    assert len(TARGETS) >= 80


# -- the request reader ----------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    requests: tuple  # the twin's Request objects
    status: int | None  # the error raised, if any
    after: bytes  # bytes after an upgrade: leftover, then whatever was fed later
    message: str | None = None  # the error's message, if any (the 400s' llhttp reason)

    def comparable(self) -> tuple:
        """The outcome as plain values: the twins' Request classes differ."""
        return (
            tuple(r._fields() for r in self.requests), self.status, self.after, self.message
        )


def feed(chunks: list[bytes], kind: str = "pure", **limits: int) -> Outcome:
    """Feed ``chunks`` to a fresh reader of the twin ``kind`` (invariant 1
    checked on the way)."""
    module = twin(kind, FAST_REQUEST)
    reader = module.RequestReader(**limits)
    requests: list = []
    fed_after = b""
    for index, chunk in enumerate(chunks):
        if reader.finished:
            fed_after += chunk
            assert reader.feed(chunk) == []
            continue
        try:
            got = reader.feed(chunk)
        except ProtocolError as exc:
            assert exc.status in READER_STATUSES, exc
            assert reader.finished
            assert reader.feed(b"GET / HTTP/1.1\r\n\r\n") == []
            return Outcome(tuple(requests), exc.status, b"", exc.message)
        except BaseException as exc:  # pragma: no cover - the point of the test
            raise AssertionError(f"{type(exc).__name__} escaped at chunk {index}") from exc
        for request in got:
            assert isinstance(request, module.Request)
            assert request.version in ("1.0", "1.1")
        requests += got
        if got and (not got[-1].keep_alive or got[-1].upgrade):
            assert reader.finished
    upgrade = bool(requests) and requests[-1].upgrade
    return Outcome(tuple(requests), None, reader.leftover + fed_after if upgrade else b"")


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def assert_same_outcome(whole: Outcome, pieces: Outcome, context: object) -> None:
    """Invariant 2."""
    if 431 in (whole.status, pieces.status) and whole.status != pieces.status:
        # The tolerance: the other is still waiting, or failed further on.
        common = min(len(whole.requests), len(pieces.requests))
        assert whole.requests[:common] == pieces.requests[:common], context
        return
    assert whole.status == pieces.status, context
    if whole.status is None:
        assert pieces.requests == whole.requests, context
        assert pieces.after == whole.after, context
    else:
        # A feed that raises loses the requests it completed (documented in
        # RequestReader): one whole feed returns none, split feeds some.
        assert whole.requests == ()
        assert pieces.requests[: len(whole.requests)] == whole.requests, context


def check_stream(stream: bytes, cuts: list[int], kind: str, **limits: int) -> None:
    """Invariant 2 for the twin ``kind``; and both twins agree, whole and split."""
    whole = feed([stream], kind, **limits)
    pieces = split(stream, cuts)
    assert_same_outcome(whole, feed(pieces, kind, **limits), (stream[:200], cuts))
    other = "pure" if kind == "compiled" else "compiled"
    assert feed([stream], other, **limits).comparable() == whole.comparable(), stream[:200]
    assert feed(pieces, other, **limits).comparable() == feed(
        pieces, kind, **limits).comparable(), (stream[:200], cuts)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", REQUESTS, ids=[p.stem for p in REQUESTS])
@pytest.mark.parametrize("limits", [{}, TINY], ids=["default-limits", "tiny-limits"])
def test_corpus_request(path: Path, limits: dict[str, int], kind: str) -> None:
    """Each seed, whole, byte by byte, and cut in every 1..7-byte rhythm."""
    stream = path.read_bytes()
    whole = feed([stream], kind, **limits)
    other = "pure" if kind == "compiled" else "compiled"
    assert feed([stream], other, **limits).comparable() == whole.comparable()
    splits = [list(range(len(stream)))]  # byte by byte
    splits += [list(range(0, len(stream), step)) for step in range(2, 8)]
    splits += [random.Random(seed).sample(range(len(stream)), min(8, len(stream)))
               for seed in range(4)]
    for cuts in splits:
        assert_same_outcome(whole, feed(split(stream, cuts), kind, **limits),
                            (path.name, cuts[:10]))


def test_corpus_expectations() -> None:
    """A few seeds pinned: the legitimate ones parse, the smuggling ones never
    yield the hidden request."""
    outcomes = {p.stem: feed([p.read_bytes()]) for p in REQUESTS}
    assert [r.method for r in outcomes["keep-alive-pipeline"].requests] == [b"GET", b"POST", b"GET"]
    assert outcomes["connect-bounce-with-early-bytes"].after.startswith(b"\x16\x03\x01")
    assert outcomes["websocket-upgrade-with-frame"].after.startswith(b"\x81\x85")
    # An upgrade's head ends its request: a body it announces is the new
    # protocol's first bytes (httptools' rule, kept by the compiled reader).
    upgraded = outcomes["upgrade-with-content-length"]
    assert upgraded.requests[0].body == b"" and upgraded.after == b"abc\x81\x85"
    assert outcomes["chunked-post-with-extension-and-trailer"].requests[0].body.startswith(
        b"fingerprint="
    )
    for name, outcome in outcomes.items():
        if name.startswith("smuggle-") and name != "smuggle-http10-te":
            assert outcome.status == 400, name
        assert all(b"smuggled" not in r.target for r in outcome.requests), name
    # HTTP/1.0 with chunked framing: read as chunked and closed after it, so
    # the bytes behind it are never a request.
    assert [r.target for r in outcomes["smuggle-http10-te"].requests] == [b"/"]


@pytest.mark.xfail(
    strict=True,
    reason="the head bound counts header names and values: the whitespace llhttp skips "
    "before a value is not counted, so a head padded past max_header_bytes is accepted "
    "when it arrives in one read (refused with 431 when dripped); memory stays bounded, "
    "the skipped bytes are not kept. Counting raw head bytes needs the parser's offsets, "
    "which httptools does not give",
)
def test_a_head_padded_with_whitespace_past_the_bound_is_refused() -> None:
    head = b"GET / HTTP/1.1\r\nX-Pad:" + b" " * 20_000 + b"v\r\nConnection: close\r\n\r\n"
    with pytest.raises(ProtocolError):
        RequestReader().feed(head)


_TOKENS = [
    b"\r\n", b"\n", b"\r", b" ", b"\t", b":", b",", b";", b"\x00", b"\xff", b"\x7f", b"\x0b",
    b"GET", b"POST", b"CONNECT", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"0", b"5", b"ff",
    b"Content-Length: ", b"Transfer-Encoding: chunked", b"Transfer-Encoding: identity",
    b"Connection: close", b"Connection: keep-alive", b"Upgrade: websocket", b"Expect: 100-continue",
    b"/target/a+443", b"%", b"%00", b"?", b"#", b"a" * 70,
]


@st.composite
def mutated_stream(draw: st.DrawFn) -> bytes:
    """A corpus seed with a few edits: tokens inserted, bytes replaced,
    spans deleted or duplicated, or another seed spliced in."""
    seeds = [p.read_bytes() for p in REQUESTS]
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 4))):
        where = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["insert", "replace", "delete", "duplicate", "splice"]))
        if edit == "insert":
            data[where:where] = draw(st.sampled_from(_TOKENS))
        elif edit == "replace" and where < len(data):
            data[where] = draw(st.integers(0, 255))
        elif edit == "delete":
            data[where : where + draw(st.integers(1, 16))] = b""
        elif edit == "duplicate":
            data[where:where] = data[where : where + draw(st.integers(1, 64))]
        else:
            data[where:] = draw(st.sampled_from(seeds))[: draw(st.integers(0, 200))]
    return bytes(data)


_CUTS = st.lists(st.integers(0, 12_000), max_size=12)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(mutated_stream(), _CUTS, st.sampled_from([{}, TINY]))
def test_fuzz_mutated_corpus_requests(kind: str, stream: bytes, cuts: list[int],
                                      limits: dict) -> None:
    check_stream(stream, cuts, kind, **limits)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(st.lists(st.sampled_from(_TOKENS), max_size=40).map(b"".join), _CUTS,
       st.sampled_from([{}, TINY]))
def test_fuzz_token_soup(kind: str, stream: bytes, cuts: list[int], limits: dict) -> None:
    check_stream(stream, cuts, kind, **limits)


@pytest.mark.parametrize("kind", KINDS)
@FUZZ
@given(st.binary(max_size=600), _CUTS)
def test_fuzz_random_bytes(kind: str, stream: bytes, cuts: list[int]) -> None:
    check_stream(stream, cuts, kind)


# -- targets ------------------------------------------------------------------------------


def check_target_text(text: str) -> None:
    """Invariants 1 and 3 for one candidate segment (or bare host)."""
    try:
        target = parse_convergence_target(text)
    except BadTarget as exc:
        assert exc.status == 400 and exc.message
        target = None
    except BaseException as exc:  # pragma: no cover - the point of the test
        raise AssertionError(f"{type(exc).__name__} escaped for {text!r}") from exc
    if target is not None:
        assert_normal(target)
        formatted = format_convergence_target(target)
        assert parse_convergence_target(formatted) == target
        host, _, port = text.partition("+")
        assert make_target(host, port) == target
    # The API's path: the segment percent-encoded as a client would send it.
    try:
        encoded = quote(text, safe="+[]:", errors="surrogatepass").encode("ascii")
    except UnicodeEncodeError:
        encoded = None
    if encoded is not None:
        try:
            through_api = parse_target_segment(encoded)
        except ProtocolError as exc:
            assert exc.status in (400, 414)
            through_api = None
        if any("\ud800" <= c <= "\udfff" for c in text):
            assert through_api is None  # lone surrogates are not UTF-8
        else:
            assert through_api == target
    # The host alone.
    host = text.rpartition("+")[0] if "+" in text else text
    try:
        normal = normalise_host(host)
    except BadTarget:
        return
    except BaseException as exc:  # pragma: no cover
        raise AssertionError(f"{type(exc).__name__} escaped for host {host!r}") from exc
    assert normalise_host(normal) == normal
    assert len(normal) <= MAX_HOST_CHARS and normal.isascii() and normal == normal.lower()


def assert_normal(target: Target) -> None:
    assert 1 <= target.port <= 65535
    assert normalise_host(target.host) == target.host
    assert target.host.isascii() and target.host == target.host.lower()
    assert Target(target.host, target.port).key == target.key


@pytest.mark.parametrize("text", TARGETS, ids=[f"t{i}" for i in range(len(TARGETS))])
def test_corpus_target(text: str) -> None:
    check_target_text(text)


def test_corpus_target_expectations() -> None:
    normal = {}
    for text in TARGETS:
        try:
            normal[text] = parse_convergence_target(text)
        except BadTarget:
            normal[text] = None
    assert normal["bücher.example+8443"] == Target("xn--bcher-kva.example", 8443)
    assert normal["[::ffff:127.0.0.1]+443"] == Target("127.0.0.1", 443)
    assert normal["[fe80::1%eth0]+443"] is None
    assert normal["a+b+443"] is None
    assert sum(t is not None for t in normal.values()) >= 20


_HOST_CHARS = st.sampled_from(
    [*"abcz09-.+[]:%_@/ ", "ü", "ß", "\u0430", "א", "例", "。", "\uff0e", "\u00ad", "\u200d",
     "\x00", "\udc80", "\U0001f600", "xn--", "ffff:", "::"]
)


@st.composite
def mutated_target(draw: st.DrawFn) -> str:
    text = list(draw(st.sampled_from(TARGETS)))
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "replace", "delete", "upper"]))
        if edit == "insert":
            text[where:where] = list(draw(_HOST_CHARS))
        elif edit == "replace" and where < len(text):
            text[where] = draw(_HOST_CHARS)
        elif edit == "delete":
            del text[where : where + draw(st.integers(1, 4))]
        else:
            text = list("".join(text).upper())
    return "".join(text)


@FUZZ
@given(
    st.one_of(
        mutated_target(),
        st.text(max_size=80),
        st.lists(_HOST_CHARS, max_size=30).map("".join),
    )
)
def test_fuzz_targets(text: str) -> None:
    check_target_text(text)


# -- the parsers behind the reader ----------------------------------------------------------


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated_stream().map(lambda s: s[-300:])))
def test_fuzz_form_and_query(data: bytes) -> None:
    for parse in (parse_fingerprint_form, parse_query):
        try:
            parse(data)
        except ProtocolError as exc:
            assert exc.status in (400, 413, 414)


@FUZZ
@given(mutated_stream())
def test_fuzz_connect_requests(stream: bytes) -> None:
    """Whatever request the reader lets through, the relay's CONNECT parser
    answers it with a destination list, a 403 or a 400."""
    try:
        requests = RequestReader().feed(stream)
    except ProtocolError:
        return
    for request in requests:
        try:
            connect = parse_connect_request(request, max_destinations=8)
        except RelayRefused as exc:
            assert exc.status == 403
        except ProtocolError as exc:
            assert exc.status == 400
        else:
            assert 1 <= len(connect.destinations) <= 8
            for host in connect.destinations:
                assert normalise_host(host) == host


# -- the twins' Convergence query parsers ---------------------------------------------------

_HEX = st.sampled_from(b"0123456789abcdefABCDEF").map(lambda c: bytes([c]))


@st.composite
def form_body(draw: st.DrawFn) -> bytes:
    """A plain fingerprint form, maybe with one byte changed, cut or grown."""
    body = b"fingerprint=" + b":".join(draw(_HEX) + draw(_HEX) for _ in range(20))
    edit = draw(st.sampled_from(["none", "replace", "cut", "grow"]))
    data = bytearray(body)
    if edit == "replace":
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif edit == "cut":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif edit == "grow":
        data += draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


def parsed(queries, method: bytes, path: bytes, body: bytes) -> tuple:
    """What a query parser makes of a query: its result or its error."""
    try:
        return ("ok", queries.parse(method, path, body))
    except ProtocolError as exc:
        return ("error", exc.status, exc.message)


@FUZZ
@given(
    st.sampled_from([b"GET", b"POST", b"HEAD"]),
    st.one_of(
        st.sampled_from(TARGETS).map(
            lambda t: quote(t.encode("utf-8", "surrogatepass"), safe="+[]:").encode("ascii")),
        st.binary(max_size=80),
    ),
    # A query string is not part of the target, nor of its length bound.
    st.sampled_from(
        [b"", b"/192.0.2.1", b"/", b"/a/b", b"?x=1", b"/192.0.2.1?", b"?" + b"q" * 100]
    ),
    st.one_of(form_body(), st.binary(max_size=100)),
)
def test_fuzz_the_twins_parse_queries_alike(
    method: bytes, segment: bytes, tail: bytes, body: bytes
) -> None:
    """The compiled and the pure ``ConvergenceQueries`` and
    ``plain_form_fingerprint`` agree on every query, the errors included,
    and both on what the general form parser says."""
    from notary.protocol import convergence

    compiled, pure = (twin(kind, FAST_REQUEST) for kind in ("compiled", "pure"))
    assert compiled.plain_form_fingerprint(body) == pure.plain_form_fingerprint(body)
    plain = pure.plain_form_fingerprint(body)
    if plain is not None:
        assert parse_fingerprint_form(body) == plain
    made = [
        module.ConvergenceQueries(
            prefix=b"/target/", max_target_bytes=64, max_entries=4,
            parse_segment=parse_target_segment,
            parse_form=convergence._parse_fingerprint_form_slowly,
        )
        for module in (compiled, pure)
    ]
    path = b"/target/" + segment + tail
    for _ in range(2):  # the second time through the memo
        results = [parsed(queries, method, path, body) for queries in made]
        assert results[0] == results[1], (path, body)
    assert len(made[0]) == len(made[1]) <= 4


_HEADER_NAMES = st.sampled_from([b"Origin", b"ORIGIN", b"origin", b"Host", b"HOST", b"Sec-Fetch-Site",
                                 b"sec-fetch-site", b"Origin2", b"Hosts", b"X", b"Referer", b""])


@FUZZ
@given(st.lists(st.tuples(st.one_of(_HEADER_NAMES, st.binary(max_size=16)),
                          st.binary(max_size=24)), max_size=8).map(tuple))
def test_fuzz_the_twins_find_browser_headers_alike(headers: tuple) -> None:
    """Both twins' ``browser_headers`` pick the same first Origin, Host and
    Sec-Fetch-Site (names in any case), or both say no browser sent it."""
    compiled, pure = (twin(kind, FAST_REQUEST) for kind in ("compiled", "pure"))
    found = pure.browser_headers(headers)
    assert compiled.browser_headers(headers) == found
    names = [name.lower() for name, _ in headers]
    assert (found is None) == (b"origin" not in names and b"sec-fetch-site" not in names)
    if found is not None:
        first = {name: value for name, value in reversed([(n.lower(), v) for n, v in headers])}
        assert found == (first.get(b"origin"), first.get(b"host"), first.get(b"sec-fetch-site"))
