"""`notary check` and `notary watch` against hostile notaries (issue 17,
item 3): small Trio TLS servers on loopback port 0, each pinned by its
bundle (a trustme certificate), answering whatever bytes the test gives,
whole, split or dripped (``tests.support.hostile_notaries``). Time is
Trio's autojump clock (loopback I/O is ready as soon as it is sent, so the
clock only jumps when every task waits for a deadline), so drips cost no
real time.

The invariants:

1. Whatever one notary sends, ``check`` returns a report: that notary's row
   has a verdict other than success and a one-line reason
   (``MAX_DETAIL_CHARS``, printable), never an exception, and never the
   catch-all ``unexpected error`` (every defect found is handled by name).
2. Each notary costs at most ``timeout_s`` (virtual): a drip, a stall or an
   endless answer does not extend it.
3. A bundle's host goes on the wire as an A-label (IPv6 in brackets):
   Host header, resolver, CONNECT line, WebSocket handshake.
4. ``watch`` ends with one ``WatchFailed`` of one line on any hostile
   message, and its WebSocket handshake is under the deadline.
5. Through the CLI, a hostile notary is one row and one vote: the others'
   verdict decides the exit status.

The seeds are ``tests/corpus/answers/*.http`` (see its README).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio
import trio.testing
import trio_websocket
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from notary.cli.report import report_table
from notary.client import check as client
from notary.client.trusted import store_bundle
from notary.model.targets import Target
from notary.protocol import v2
from notary.protocol.bundle import Bundle, BundleHost, make_bundle
from notary.protocol.voting import Threshold, Verdict, tally
from notary.state import crypto
from tests.support.hostile_notaries import (
    PEM,
    Answer,
    Handler,
    bundle_for,
    drips,
    http,
    in_pieces,
    open_hostile_notary,
    read_request,
    sends,
    stalls,
)
from tests.support.notaries import open_notary
from tests.support.tls_targets import (
    LOCALHOST,
    open_raw_target,
    open_stalled_target,
    open_tls_target,
    static_resolver,
)

ANSWERS = sorted((Path(__file__).parent / "corpus" / "answers").glob("*.http"))
FINGERPRINT = bytes(range(20))
TIMEOUT_S = 5.0


# -- asking hostile notaries ---------------------------------------------------------------


async def ask(*bundles: Bundle, **options: object) -> client.CheckReport:
    options.setdefault("relay", None)
    options.setdefault("timeout_s", TIMEOUT_S)
    options.setdefault("resolver", static_resolver({}))
    return await client.check(
        Target(LOCALHOST, 443), list(bundles), fingerprint=FINGERPRINT, **options
    )


def assert_one_row(answer: client.NotaryAnswer) -> None:
    """Invariant 1 for one notary's row."""
    assert answer.verdict is not Verdict.SUCCESS
    assert answer.detail, answer
    assert answer.detail.isprintable() and len(answer.detail) <= client.MAX_DETAIL_CHARS
    assert "unexpected error" not in answer.detail, answer.detail


# -- what a notary sends -------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    b"[" * 200_000,
    b'{"a":' * 200_000,
    b'{"fingerprintList": ' + b"[" * 200_000,
], ids=["arrays", "objects", "in-the-list"])
async def test_a_deeply_nested_answer_is_that_notarys_failure(body: bytes) -> None:
    async with open_hostile_notary(sends(http(body))) as hostile:
        report = await ask(hostile.bundle)
    (answer,) = report.answers
    assert_one_row(answer)
    assert (answer.verdict, answer.status) == (Verdict.FAILURE, 200)
    assert answer.detail == "malformed answer: not strict UTF-8 JSON"


def test_the_answer_corpus_is_there() -> None:
    assert len(ANSWERS) >= 30


@pytest.mark.parametrize("path", ANSWERS, ids=[p.stem for p in ANSWERS])
async def test_each_corpus_answer_is_one_row(
    path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = await trio.Path(path).read_bytes()
    async with open_hostile_notary(sends(data)) as hostile:
        start = trio.current_time()
        report = await ask(hostile.bundle)
        elapsed = trio.current_time() - start
    (answer,) = report.answers
    assert_one_row(answer)
    assert elapsed <= TIMEOUT_S
    if answer.status in (200, 409):
        assert answer.detail.startswith("malformed answer: ")


async def test_a_legacy_answer_is_read_as_strictly_as_a_v2_one() -> None:
    """Before, ``int()`` took ``true``, `` 1`` and ``1_000`` as timestamps
    and the answer went on to its signature check."""
    row = {"timestamp": {"start": True, "finish": " 12"},
           "fingerprint": FINGERPRINT.hex(":").upper()}
    body = json.dumps({"fingerprintList": [row], "signature": "c2ln"}).encode()
    async with open_hostile_notary(sends(http(body))) as hostile:
        report = await ask(hostile.bundle)
    (answer,) = report.answers
    assert answer.verdict is Verdict.FAILURE
    assert answer.detail.startswith("malformed answer: fingerprintList[0].timestamp.start")


async def test_answers_over_the_size_bound_are_not_read_on() -> None:
    body = b"[" * (client.MAX_RESPONSE_BYTES + 1)
    async with open_hostile_notary(sends(http(body))) as hostile:
        report = await ask(hostile.bundle)
    (answer,) = report.answers
    assert (answer.verdict, answer.detail) == (Verdict.CONNECTIVITY_FAILURE, "answer too large")


async def test_a_v2_notary_sending_garbage_is_one_row() -> None:
    async with open_hostile_notary(sends(http(b"[" * 200_000))) as hostile:
        report = await ask(hostile.bundle, use_v2=True)
    (answer,) = report.answers
    assert_one_row(answer)
    assert answer.detail.startswith("malformed v2 key document")


async def test_one_hostile_notary_does_not_end_the_vote() -> None:
    async with (
        open_hostile_notary(sends(http(b"[" * 200_000)), name="Nested") as nested,
        open_hostile_notary(sends(http(b"", 303)), name="Busy") as busy,
    ):
        report = await ask(nested.bundle, busy.bundle, threshold=Threshold.MINORITY)
    verdicts = {a.notary: a.verdict for a in report.answers}
    assert verdicts == {"Nested": Verdict.FAILURE, "Busy": Verdict.INCONCLUSIVE}
    assert (report.tally.counted, report.tally.stood_aside) == (1, 1)


async def test_a_defect_nobody_foresaw_is_still_one_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last resort of invariant 1 (which the fuzz test shows is never
    reached by what a notary sends)."""
    judge = client._judge

    def broken(bundle: Bundle, *args: object) -> client.NotaryAnswer:
        if bundle.name == "Broken":
            raise RuntimeError("a bug\nwith lines")
        return judge(bundle, *args)

    monkeypatch.setattr(client, "_judge", broken)
    async with (
        open_hostile_notary(sends(http(b"{}")), name="Broken") as broken_one,
        open_hostile_notary(sends(http(b"", 303)), name="Busy") as busy,
    ):
        report = await ask(broken_one.bundle, busy.bundle)
    rows = {a.notary: a for a in report.answers}
    assert (rows["Broken"].verdict, rows["Broken"].detail) == (
        Verdict.CONNECTIVITY_FAILURE, "unexpected error (RuntimeError)")
    assert rows["Busy"].verdict is Verdict.INCONCLUSIVE


def test_one_line_is_printable_and_bounded() -> None:
    assert client.one_line("a\nb\x1b[2J\u2028c") == "a?b?[2J?c"
    assert client.one_line("x" * 500, 20) == "x" * 17 + "..."
    assert client.one_line("x" * 500, None) == "x" * 500


# -- drips and stalls: bounded by the deadline --------------------------------------------


_ENDLESS_HEAD = b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * 100_000
_ENDLESS_BODY = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"[" * 100_000


@pytest.mark.parametrize(("behaviour", "use_v2"), [
    (drips(_ENDLESS_HEAD, 0.25), False),
    (drips(_ENDLESS_BODY, 0.25), False),
    (drips(_ENDLESS_BODY, 0.25), True),
    (stalls, False),
    (stalls, True),
], ids=["head", "body", "v2-keys", "silent", "v2-silent"])
async def test_a_dripping_notary_costs_its_deadline_and_no_more(
    behaviour: Answer, use_v2: bool, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_hostile_notary(behaviour) as hostile:
        start = trio.current_time()
        report = await ask(hostile.bundle, use_v2=use_v2)
        elapsed = trio.current_time() - start
    (answer,) = report.answers
    assert (answer.verdict, answer.detail) == (Verdict.CONNECTIVITY_FAILURE, "timed out")
    assert elapsed == pytest.approx(TIMEOUT_S)


async def test_a_notary_silent_before_tls_costs_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_stalled_target() as stalled:
        start = trio.current_time()
        report = await ask(bundle_for(stalled.port))
        elapsed = trio.current_time() - start
    (answer,) = report.answers
    assert (answer.verdict, answer.detail) == (Verdict.CONNECTIVITY_FAILURE, "timed out")
    assert elapsed == pytest.approx(TIMEOUT_S)


async def test_a_dripping_relay_costs_the_deadline_of_the_notaries_it_carries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def drip_forever(stream: trio.SocketStream) -> None:
        await read_request(stream)
        for _ in range(10_000):
            await stream.send_all(b"H")
            await trio.sleep(0.25)

    async with open_raw_target(drip_forever) as relay_server:
        relay = make_bundle(
            name="Relay", location="https://127.0.0.1/relay.notary",
            hosts=[BundleHost(LOCALHOST, 443, relay_server.port, PEM)],
        )
        start = trio.current_time()
        report = await ask(bundle_for(1), relay=relay)
        elapsed = trio.current_time() - start
    (answer,) = report.answers
    assert (answer.verdict, answer.detail, answer.via) == (
        Verdict.CONNECTIVITY_FAILURE, "timed out", "Relay")
    assert elapsed == pytest.approx(TIMEOUT_S)


# -- the fuzz test ---------------------------------------------------------------------------


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(
        st.sampled_from(["fingerprintList", "signature", "timestamp", "start", "finish",
                         "fingerprint", "x"]) | st.text(max_size=5),
        children, max_size=4,
    ),
    max_leaves=20,
)


def _answer_shape(rows: int, start: str, finish: str, fingerprint: str, signature: str) -> bytes:
    row = {"timestamp": {"start": start, "finish": finish}, "fingerprint": fingerprint}
    return json.dumps({"fingerprintList": [row] * rows, "signature": signature}).encode()


_SHAPED = st.builds(
    _answer_shape,
    st.integers(0, 3),
    st.sampled_from(["1", "0", " 1", "-1", "1_0", "99999999999999", "x", ""]),
    st.sampled_from(["2", "1", "999999999999"]),
    st.sampled_from([FINGERPRINT.hex(":").upper(), FINGERPRINT.hex(":"), "AA", ""]),
    st.sampled_from(["c2ln", "", "!!", "A" * 2000]),
)


@st.composite
def _mutated(draw: st.DrawFn, seeds: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(seeds))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        index = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "drop", "repeat"]))
        if action == "flip":
            data[index] = draw(st.integers(0, 255))
        elif action == "drop":
            del data[index]
        else:
            data[index:index] = data[index:index + draw(st.integers(1, 64))] * draw(
                st.integers(1, 50))
    return bytes(data)


_BODIES = st.one_of(
    st.binary(max_size=300),
    _JSON.map(lambda value: json.dumps(value).encode()),
    _SHAPED,
    _mutated(_SHAPED),
    st.integers(900, 300_000).map(lambda depth: b"[" * depth),
    st.integers(0, 2_000_000).map(lambda size: b"9" * size),
)
_CORPUS = st.sampled_from(ANSWERS).map(Path.read_bytes) if ANSWERS else st.just(b"")


@st.composite
def _responses(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 3)) == 0:
        return draw(st.one_of(_CORPUS, _mutated(_CORPUS)))
    body = draw(_BODIES)
    status = draw(st.sampled_from([200, 409, 303, 404, 503, 100, 999]))
    framing = draw(st.sampled_from(["length", "close", "short", "long", "chunked"]))
    head = f"HTTP/1.1 {status} X\r\n"
    if framing == "length":
        head += f"Content-Length: {len(body)}\r\n"
    elif framing in ("short", "long"):
        head += f"Content-Length: {len(body) + (-1 if framing == 'short' else 7)}\r\n"
    elif framing == "chunked":
        head += "Transfer-Encoding: chunked\r\n"
        body = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return head.encode() + b"\r\n" + body


@settings(
    max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    response=_responses(),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
    pauses_s=st.lists(st.sampled_from([0.0, 0.5, 2.0, 7.0]), max_size=4),
    use_v2=st.booleans(),
)
@example(response=http(b"[" * 200_000), cuts=[7, 5000], pauses_s=[0.5], use_v2=False)
@example(response=http(b"[" * 200_000, 409), cuts=[], pauses_s=[], use_v2=False)
def test_fuzzed_notary_answers_are_one_row_each_in_bounded_time(
    response: bytes, cuts: list[int], pauses_s: list[float], use_v2: bool
) -> None:
    """Invariants 1 and 2 on generated answers: bytes, JSON shapes, sizes
    up to twice the read bound, split and dripped."""

    async def main() -> None:
        async with open_hostile_notary(in_pieces(response, cuts, pauses_s)) as hostile:
            start = trio.current_time()
            report = await ask(hostile.bundle, use_v2=use_v2)
            elapsed = trio.current_time() - start
        (answer,) = report.answers
        assert_one_row(answer)
        assert elapsed <= TIMEOUT_S + 1e-6

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.one_of(_BODIES, _CORPUS), status=st.sampled_from([200, 409, 303, 500]))
def test_judging_any_body_gives_a_row(body: bytes, status: int) -> None:
    """The sans-IO half of the fuzz test, with many more examples: the
    verdict of any body under any status."""
    bundle = bundle_for(443)
    answer = client._judge(bundle, bundle.hosts[0], status, body, FINGERPRINT, None)
    assert answer.verdict is not Verdict.SUCCESS
    assert answer.detail.isprintable()


# -- bundle hosts on the wire ----------------------------------------------------------------


@pytest.mark.parametrize(("bundle_host", "wire"), [
    ("bücher.example", "xn--bcher-kva.example"),
    ("straße.example", "xn--strae-oqa.example"),  # IDNA 2008, not 2003's strasse
    ("BÜCHER.Example.", "xn--bcher-kva.example"),
])
async def test_a_non_ascii_bundle_host_is_asked_by_its_a_label(
    bundle_host: str, wire: str
) -> None:
    async with open_hostile_notary(sends(http(b"", 303)), bundle_host=bundle_host) as hostile:
        report = await ask(hostile.bundle, resolver=static_resolver({wire: [LOCALHOST]}))
    (answer,) = report.answers
    assert answer.verdict is Verdict.INCONCLUSIVE, answer
    (request,) = hostile.requests
    assert f"\r\nHost: {wire}\r\n".encode() in request


async def test_an_ipv6_bundle_host_is_bracketed_in_the_host_header() -> None:
    async with open_hostile_notary(sends(http(b"", 303)), host="::1") as hostile:
        report = await ask(hostile.bundle)
    assert report.answers[0].verdict is Verdict.INCONCLUSIVE
    (request,) = hostile.requests
    assert b"\r\nHost: [::1]\r\n" in request


@pytest.mark.parametrize(("bundle_host", "wire"), [
    ("bücher.example", "xn--bcher-kva.example"),
    ("::1", "[::1]"),
])
async def test_a_bounced_question_names_the_notary_by_its_a_label(
    bundle_host: str, wire: str
) -> None:
    heads: list[bytes] = []

    async def refuse(stream: trio.SocketStream) -> None:
        heads.append(await read_request(stream))
        await stream.send_all(b"HTTP/1.1 404 Unable to connect\r\nContent-Length: 0\r\n\r\n")

    async with open_raw_target(refuse) as relay_server:
        relay = make_bundle(
            name="Relay", location="https://127.0.0.1/relay.notary",
            hosts=[BundleHost(LOCALHOST, 443, relay_server.port, PEM)],
        )
        asked = make_bundle(
            name="Far", location="https://127.0.0.1/far.notary",
            hosts=[BundleHost(bundle_host, 443, 80, PEM), BundleHost("bücher.example", 443, 80, PEM)],
        )
        report = await ask(asked, relay=relay)
    (answer,) = report.answers
    assert (answer.verdict, answer.detail) == (
        Verdict.CONNECTIVITY_FAILURE, "the relay could not reach it")
    (head,) = heads
    assert head.startswith(f"CONNECT {wire}:4242 HTTP/1.1\r\nHost: {wire}\r\n".encode())
    assert b"X-Convergence-Notary: xn--bcher-kva.example+4242\r\n" in head


# -- watch -------------------------------------------------------------------------------------


def _key_document_response() -> bytes:
    raw = crypto.ed25519_public_raw(crypto.generate_ed25519_key())
    return http(v2.key_document([v2.publish_key(raw, not_before=0, not_after=2**40)]))


class _Recording(trio.abc.Stream):
    """``stream``, keeping what it received (the WebSocket handshake)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.received = bytearray()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.stream.receive_some(max_bytes)
        self.received += data
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def watch_server(websocket: Callable[[trio_websocket.WebSocketConnection], Awaitable[None]] | None,
                 ws_requests: list[bytes]) -> Callable[[list[bytes]], Handler]:
    """A v2 notary for `watch`: its first connection is ``GET /v2/key``, its
    second the WebSocket, where ``websocket`` runs (None: no handshake answer)."""
    keys = _key_document_response()

    def make(requests: list[bytes]) -> Handler:
        async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
            if not requests:
                requests.append(await read_request(stream))
                await stream.send_all(keys)
                return
            requests.append(b"ws")
            if websocket is None:
                ws_requests.append(await read_request(stream))
                await trio.sleep_forever()
            recording = _Recording(stream)
            async with trio.open_nursery() as nursery:
                request = await trio_websocket.wrap_server_stream(nursery, recording)
                ws_requests.append(bytes(recording.received))
                ws = await request.accept()
                await websocket(ws)
                nursery.cancel_scope.cancel()

        return handle

    return make


def says(message: str | bytes) -> Callable[[trio_websocket.WebSocketConnection], Awaitable[None]]:
    async def talk(ws: trio_websocket.WebSocketConnection) -> None:
        await ws.send_message(message)
        await ws.aclose()

    return talk


@pytest.mark.parametrize(("message", "expected"), [
    ("[" * 200_000, "bad event (not strict UTF-8 JSON)"),
    ('{"type": "watching", "target": []}', "connection closed"),
    ('{"type": "watching", "target": {"a": 1}}', "connection closed"),
    ('"a string"', "bad event (not an object with a type)"),
    ('{"type": 5}', "bad event (not an object with a type)"),
    ('{"type": "error", "type": "observation"}', "bad event (not strict UTF-8 JSON)"),
    ('{"type": "observation", "statement": 5}', "bad event (malformed v2 answer"),
    ('{"type": "observation", "statement": {"a": NaN}}', "bad event (not strict UTF-8 JSON)"),
    ('{"type": "error", "message": "no\\nway\\u001b[2J' + "x" * 5000 + '"}',
     "the notary refused: no?way?[2J"),
    ('{"type": "error", "message": ["a list"]}', "the notary refused: no reason given"),
    (b"\xff\xfe{}", "bad event (not strict UTF-8 JSON)"),
], ids=["nested", "list-target", "object-target", "string", "type-number", "repeated-key",
        "statement-number", "nan", "error-lines", "error-not-text", "not-utf8"])
async def test_a_hostile_watch_message_ends_the_watch_on_one_line(
    message: str | bytes, expected: str, autojump_clock: trio.testing.MockClock
) -> None:
    ws_requests: list[bytes] = []
    async with open_hostile_notary(handler=watch_server(says(message), ws_requests)) as hostile:
        with trio.fail_after(1000), pytest.raises(client.WatchFailed) as failed:
            await client.watch(hostile.bundle, [Target("127.0.0.9", 443)], on_event=print,
                               resolver=static_resolver({}), timeout_s=TIMEOUT_S)
    text = str(failed.value)
    assert text.startswith("Hostile: ") and expected in text, text
    assert text.isprintable() and len(text) < 300


async def test_the_watch_handshake_is_under_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ws_requests: list[bytes] = []
    async with open_hostile_notary(handler=watch_server(None, ws_requests)) as hostile:
        start = trio.current_time()
        with trio.fail_after(1000), pytest.raises(client.WatchFailed, match="no WebSocket"):
            await client.watch(hostile.bundle, [Target("127.0.0.9", 443)], on_event=print,
                               resolver=static_resolver({}), timeout_s=TIMEOUT_S)
        assert trio.current_time() - start <= 2 * TIMEOUT_S
    assert len(ws_requests) == 1  # the handshake was sent, never answered


async def test_a_watch_names_a_non_ascii_notary_by_its_a_label(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ws_requests: list[bytes] = []
    server = watch_server(says('{"type": "error", "message": "no"}'), ws_requests)
    async with open_hostile_notary(handler=server, bundle_host="bücher.example") as hostile:
        with trio.fail_after(1000), pytest.raises(client.WatchFailed, match="refused: no"):
            await client.watch(
                hostile.bundle, [Target("127.0.0.9", 443)], on_event=print,
                resolver=static_resolver({"xn--bcher-kva.example": [LOCALHOST]}),
                timeout_s=TIMEOUT_S,
            )
    assert b"\r\nHost: xn--bcher-kva.example\r\n" in hostile.requests[0]
    (handshake,) = ws_requests
    assert handshake.startswith(b"GET /v2/ws HTTP/1.1\r\n")
    assert b"\r\nHost: xn--bcher-kva.example\r\n" in handshake


# -- the table and the CLI -------------------------------------------------------------------


def test_names_and_reasons_cannot_break_the_table() -> None:
    bundle = make_bundle(
        name="Evil\nnotary\x1b[2J", location="https://127.0.0.1/e.notary",
        hosts=[BundleHost(LOCALHOST, 443, 80, PEM)],
    )
    answer = client.NotaryAnswer(bundle.name, Verdict.FAILURE, detail="a\r\nb\x1b[31m")
    report = client.CheckReport(
        target=Target(LOCALHOST, 443), fingerprint=FINGERPRINT, threshold=Threshold.MAJORITY,
        strict=False, answers=(answer,),
        tally=tally([answer.verdict], Threshold.MAJORITY), relays=("Re\nlay",),
    )
    lines = report_table(report, now=0).splitlines()
    assert len(lines) == 4 and all(line.isprintable() for line in lines)
    assert "Evil?notary?[2J" in lines[2] and "a??b?[31m" in lines[2]


async def test_the_cli_counts_a_hostile_notary_as_one_vote(tmp_path: Path) -> None:
    """Before: a RecursionError traceback and exit 1 ("rejected") whatever
    the other notaries said."""
    async with open_tls_target() as site, AsyncExitStack() as stack:
        directory = tmp_path / "notaries"
        for index, host in enumerate(("127.0.0.1", "127.0.0.2")):
            notary = await stack.enter_async_context(open_notary(tmp_path / f"n{index}", host=host))
            pem = crypto.certificate_pem(notary.certificate).decode("ascii")
            store_bundle(directory, make_bundle(
                name=f"Honest {index}", location=f"https://{host}/h.notary",
                hosts=[BundleHost(host, notary.port, 80, pem)],
            ).to_json())
        hostile = await stack.enter_async_context(
            open_hostile_notary(sends(http(b"[" * 200_000)), name="Nested")
        )
        store_bundle(directory, hostile.bundle.to_json())
        done = await trio.run_process(
            [sys.executable, "-m", "notary", "check", f"127.0.0.1:{site.port}", "--notaries",
             str(directory), "--bounce", "off", "--timeout", "10"],
            cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False,
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert (done.returncode, err) == (0, ""), (out, err)
    rows = {line.split("  ")[0]: line for line in out.splitlines()[2:-1]}
    assert "failure" in rows["Nested"] and "malformed answer" in rows["Nested"]
    assert out.splitlines()[-1].startswith("verified: 2 of 3")
