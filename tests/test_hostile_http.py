"""Hostile and malformed requests over raw sockets against a running notary.

One notary serves the whole module (in a thread of its own, so that every
test, each in its own Trio run, talks to it over loopback): its HTTPS API,
its plain-HTTP API and its Perspectives port, with a local TLS site to
probe. Each case sends raw bytes and expects a status (or a clean close);
whatever the case, the notary must

* answer a 4xx (505 for an HTTP version it does not speak) or close cleanly,
  never another 5xx, and never more answers than it was sent requests;
* not hang: every exchange runs under ``trio.fail_after``;
* keep serving others: a normal query succeeds while the hostile
  connection is open and after it;
* log no error and no traceback (a handler on the root logger collects
  every record at ERROR or above, from the notary's thread too);
* connect to no address outside loopback (the dialer is wrapped by a guard
  that refuses and records any other address).

Cases already covered elsewhere are not repeated here: the reader's own
parsing limits and malformed lines (tests/protocol/test_http.py), the
target grammar (tests/protocol/test_targets.py), and the first bad-request
table over HTTPS (tests/test_end_to_end.py::test_bad_requests_get_clear_4xx).
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import logging
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from notary.config import Endpoint
from notary.errors import ProbeConnectFailed
from notary.outbound import dialer
from notary.protocol.convergence import format_fingerprint
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, client_context, open_notary
from tests.support.tls_targets import LOCALHOST, TLSTarget, open_tls_target

#: No exchange with the notary may take longer than this.
EXCHANGE_TIMEOUT_S = 10.0
#: The notary's timeouts here: short enough for a case that stalls to end
#: quickly, with slack for a loaded machine.
HTTP_LIMITS = {
    "header_timeout_s": 3.0,
    "keepalive_timeout_s": 2.0,
    "send_timeout_s": 2.0,
    "tls_handshake_timeout_s": 3.0,
}
#: An expected outcome: no answer, the connection closed (FIN or reset).
CLOSE = "close"

SITE = "www.example.test"
#: Names the notary's resolver maps to the local site: the normalised
#: spellings of the valid hostile targets below.
LONG_NAME = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters
RESOLVED_NAMES = (
    SITE,
    "xn--bcher-kva.example.test",
    "xn--pypal-4ve.example.test",  # Latin and Cyrillic mixed: valid IDNA 2008
    "xn--4dbc.example.test",  # right-to-left label
    LONG_NAME,
    # Not public DNS names: refused (400) before any lookup, so the answer
    # their mapping to the site would give (200) is never seen.
    "localhost",
    "www.localhost",
    "printer.local",
    "x.onion",
    "x.invalid",
    "corp.internal",
    "nas.home.arpa",
    "x.alt",
    "intranet",
)


# -- a notary in a thread of its own ----------------------------------------------


class _ErrorRecords(logging.Handler):
    """Every record at ERROR or above, or carrying a traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            with self._lock_records:
                self.records.append(record)

    def count(self) -> int:
        with self._lock_records:
            return len(self.records)

    def since(self, start: int) -> list[str]:
        with self._lock_records:
            return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in self.records[start:]]


@dataclass
class ServedNotary:
    """The module's notary, its site, and what the guards collected."""

    notary: NotaryUnderTest
    site: TLSTarget
    errors: _ErrorRecords
    #: Non-loopback addresses the notary tried to connect to (refused).
    outside_connects: list[str] = field(default_factory=list)

    @property
    def ports(self) -> dict[str, int]:
        running = self.notary.running
        return {
            "https": running.api[0].port,
            "plain": running.plain_api[0].port,
            "perspectives": running.perspectives[0].port,
        }

    @property
    def site_target(self) -> str:
        return f"127.0.0.1+{self.site.port}"

    @property
    def site_sha1(self) -> str:
        return format_fingerprint(hashlib.sha1(self.site.leaf_der()).digest())


class NotaryThread:
    """Runs ``open_notary`` (and a TLS site) in a thread with its own Trio
    loop until ``stop``. ``options`` go to ``open_notary``."""

    def __init__(self, directory: Path, **options: object) -> None:
        self._directory = directory
        self._options = options
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notary", daemon=True)
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self.notary: NotaryUnderTest | None = None
        self.site: TLSTarget | None = None

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the notary did not start")
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported by start/stop
            self._failure = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        async with open_tls_target(names=[SITE]) as site:
            names = {name: [site.host] for name in RESOLVED_NAMES}
            async with open_notary(self._directory, names=names, **self._options) as notary:
                self.site, self.notary = site, notary
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedNotary]:
    directory = tmp_path_factory.mktemp("hostile")
    key_path = directory / "perspectives.key"
    crypto.write_new_file(
        key_path, crypto.private_key_pem(crypto.generate_perspectives_key()), mode=0o600
    )
    errors = _ErrorRecords()
    outside: list[str] = []
    real_open_stream = dialer._open_stream

    async def loopback_only(address: str, port: int) -> trio.SocketStream:
        if not ipaddress.ip_address(address).is_loopback:
            outside.append(address)
            raise ProbeConnectFailed("test guard: only loopback")
        return await real_open_stream(address, port)

    root = logging.getLogger()
    root.addHandler(errors)
    thread = NotaryThread(
        directory / "notary",
        server={"plain_api": (Endpoint(LOCALHOST, 0),)},
        perspectives={"key_file": key_path, "listen": (Endpoint(LOCALHOST, 0),)},
        http=HTTP_LIMITS,
        probe={"timeout_s": 3.0},  # the local site answers in milliseconds; slack for load
    )
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dialer, "_open_stream", loopback_only)
            thread.start()
            assert thread.notary is not None and thread.site is not None
            yield ServedNotary(thread.notary, thread.site, errors, outside)
            thread.stop()
    finally:
        root.removeHandler(errors)
    assert errors.since(0) == []
    assert outside == []


# -- raw exchanges ------------------------------------------------------------------

_sources = itertools.count()


def _next_source() -> str:
    """A fresh loopback source address per connection (127.77.x.y), so that
    no per-address limit of the notary mistakes this module for one client."""
    n = next(_sources) % (250 * 250)
    return f"127.77.{n // 250}.{n % 250 + 1}"


@dataclass(frozen=True)
class Outcome:
    statuses: tuple[int, ...]  # every answer received, in order
    ending: str  # "eof", "reset" or "open" (still open after the answers)
    raw: bytes

    @property
    def first(self) -> int | str:
        return self.statuses[0] if self.statuses else CLOSE


def parse_statuses(data: bytes) -> tuple[tuple[int, ...], bool]:
    """The statuses of the complete responses in ``data`` (every answer of
    the notary has a Content-Length), and whether ``data`` ends on a
    response boundary."""
    statuses = []
    while data:
        head, found, rest = data.partition(b"\r\n\r\n")
        if not found:
            return tuple(statuses), False
        lines = head.split(b"\r\n")
        statuses.append(int(lines[0].split()[1]))
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(rest) < length:
            return tuple(statuses[:-1]), False
        data = rest[length:]
    return tuple(statuses), True


async def open_raw(port: int) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        await sock.bind((_next_source(), 0))
        await sock.connect((LOCALHOST, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


async def open_client(port: int, *, tls: bool) -> trio.abc.Stream:
    tcp = await open_raw(port)
    if not tls:
        return tcp
    stream = trio.SSLStream(tcp, client_context(), server_hostname=None, https_compatible=True)
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream


async def send_quietly(stream: trio.abc.Stream, data: bytes, *, half_close: bool = False) -> None:
    """Send ``data``; the server may refuse and close before it has all."""
    try:
        await stream.send_all(data)
        if half_close and isinstance(stream, trio.SocketStream):
            await stream.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def read_answers(stream: trio.abc.Stream) -> Outcome:
    """Read until the server closes (every case here ends with a close), or
    ``EXCHANGE_TIMEOUT_S`` passed: then the connection is ``open``."""
    data = b""
    ending = "open"
    with trio.move_on_after(EXCHANGE_TIMEOUT_S):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                ending = "reset"
                break
            if not chunk:
                ending = "eof"
                break
            data += chunk
    return Outcome(parse_statuses(data)[0], ending, data)


async def exchange(port: int, data: bytes, *, tls: bool, half_close: bool = False) -> Outcome:
    """One connection: send ``data``, read every answer."""
    with trio.fail_after(EXCHANGE_TIMEOUT_S):
        stream = await open_client(port, tls=tls)
        async with stream:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: send_quietly(stream, data, half_close=half_close and not tls)
                )
                outcome = await read_answers(stream)
                nursery.cancel_scope.cancel()
    return outcome


async def normal_query(served: ServedNotary) -> None:
    """A well-behaved legacy query for the site over HTTPS: 200, signed list."""
    request = f"GET /target/{served.site_target} HTTP/1.0\r\n\r\n".encode()
    outcome = await exchange(served.ports["https"], request, tls=True)
    assert outcome.statuses == (200,), outcome.raw[:300]
    assert b"fingerprintList" in outcome.raw


async def check_hostile(
    served: ServedNotary,
    listener: str,
    data: bytes,
    expected: int | frozenset[int | str] | str,
    *,
    half_close: bool = False,
    max_answers: int = 1,
) -> Outcome:
    """The common checks of every case (see the module docstring)."""
    errors_before = served.errors.count()
    port = served.ports[listener]
    tls = listener == "https"
    with trio.fail_after(EXCHANGE_TIMEOUT_S * 2):
        stream = await open_client(port, tls=tls)
        async with stream:
            await send_quietly(stream, data, half_close=half_close and not tls)
            await normal_query(served)  # while the hostile connection is open
            outcome = await read_answers(stream)
        await normal_query(served)  # and after it
    allowed = expected if isinstance(expected, frozenset) else frozenset({expected})
    assert outcome.first in allowed, (outcome.first, outcome.raw[:300])
    assert all(s < 500 or s == 505 for s in outcome.statuses), outcome.statuses
    assert len(outcome.statuses) <= max_answers, outcome.statuses
    # Every case either breaks HTTP (the notary answers and closes) or asks
    # to close (HTTP/1.0, ``Connection: close``): nothing stays open.
    assert outcome.ending in ("eof", "reset"), outcome
    assert served.errors.since(errors_before) == []
    assert served.outside_connects == []
    return outcome


# -- malformed requests: every listener ---------------------------------------------

LISTENERS = ("https", "plain", "perspectives")


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: n\r\n\r\n"

#: (name, raw bytes, expected): the same on all three listeners.
MALFORMED: list[tuple[str, bytes, int | frozenset[int | str] | str]] = [
    # request lines
    ("method-only", b"GET\r\n\r\n", 400),
    ("lower-case-method", b"get / HTTP/1.1\r\n\r\n", 400),
    ("unknown-method", b"BREW / HTTP/1.1\r\n\r\n", 400),
    ("http-0.9-line", b"GET /\r\n\r\n", 400),
    ("no-version-target", b"GET /target/www.example.test+443\r\n\r\n", 400),
    ("http-1.2", b"GET / HTTP/1.2\r\n\r\n", 505),
    ("lower-case-version", b"GET / http/1.1\r\n\r\n", 400),
    ("junk-after-version", b"GET / HTTP/1.1 extra\r\n\r\n", 400),
    ("version-1.1.1", b"GET / HTTP/1.1.1\r\n\r\n", 400),
    ("space-in-target", b"GET /a b HTTP/1.1\r\n\r\n", 400),
    ("tab-in-target", b"GET /a\tb HTTP/1.1\r\n\r\n", 400),
    ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
    ("tls-client-hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32), 400),
    ("binary-junk", bytes(range(256)), 400),
    # header syntax
    ("obsolete-folding", b"GET / HTTP/1.1\r\nHost: n\r\nX-A: a\r\n folded\r\n\r\n", 400),
    ("obsolete-folding-tab", b"GET / HTTP/1.1\r\nX-A: a\r\n\tfolded\r\nHost: n\r\n\r\n", 400),
    ("space-before-colon", b"GET / HTTP/1.1\r\nHost : n\r\n\r\n", 400),
    ("header-without-colon", b"GET / HTTP/1.1\r\nHost n\r\n\r\n", 400),
    ("bare-lf-line-ends", b"GET / HTTP/1.1\nHost: n\n\n", 400),
    ("bare-cr-in-value", b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", 400),
    ("control-char-in-value", b"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n", 400),
    ("del-in-value", b"GET / HTTP/1.1\r\nX: a\x7fb\r\n\r\n", 400),
    # NUL bytes
    ("nul-in-method", b"G\x00T / HTTP/1.1\r\n\r\n", 400),
    ("nul-in-target", b"GET /target/a\x00+443 HTTP/1.1\r\n\r\n", 400),
    ("nul-in-header-name", b"GET / HTTP/1.1\r\nHo\x00st: n\r\n\r\n", 400),
    ("nul-in-header-value", b"GET / HTTP/1.1\r\nHost: n\x00\r\n\r\n", 400),
    ("nul-in-chunk-extension", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3;\x00\r\nabc\r\n0\r\n\r\n", 400),
    # invalid UTF-8 where only ASCII is allowed
    ("raw-high-bytes-in-target", b"GET /target/b\xc3\xbccher.test+443 HTTP/1.1\r\n\r\n", 400),
    ("invalid-utf8-in-target", b"GET /target/\xff\xfe+443 HTTP/1.1\r\n\r\n", 400),
    # request smuggling: framing that two parsers could read differently
    ("cl-and-te", b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n" + SMUGGLED, 400),
    ("te-and-cl", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n"
     b"0\r\n\r\n" + SMUGGLED, 400),
    ("two-content-lengths", b"POST / HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 37\r\n\r\n"
     + SMUGGLED, 400),
    ("two-equal-content-lengths", b"POST / HTTP/1.1\r\nContent-Length: 3\r\n"
     b"Content-Length: 3\r\n\r\nabc", 400),
    ("content-length-list", b"POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc", 400),
    ("content-length-plus", b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", 400),
    ("content-length-hex", b"POST / HTTP/1.1\r\nContent-Length: 0x3\r\n\r\nabc", 400),
    ("content-length-negative", b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\nabc", 400),
    ("content-length-empty", b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", 400),
    ("content-length-overflow", b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999"
     b"\r\n\r\n", 400),
    ("te-chunked-identity", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n"
     b"0\r\n\r\n" + SMUGGLED, 400),
    ("te-twice", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
     b"Transfer-Encoding: identity\r\n\r\n0\r\n\r\n", 400),
    ("te-identity-and-cl", b"POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n"
     b"Content-Length: 3\r\n\r\nabc", 400),
    ("te-gzip", b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nabc", 400),
    ("te-xchunked", b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400),
    ("te-space-before-colon", b"POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("te-vertical-tab", b"POST / HTTP/1.1\r\nTransfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n", 400),
    ("http10-cl-and-te", b"POST / HTTP/1.0\r\nContent-Length: 5\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("chunk-size-overflow", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"fffffffffffffffffff\r\nabc", 400),
    ("chunk-size-negative", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"-3\r\nabc\r\n0\r\n\r\n", 400),
    ("chunk-bare-lf", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n", 400),
    ("chunk-longer-than-said", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3\r\nabcdef\r\n0\r\n\r\n", 400),
    # sizes
    ("huge-header-value", b"GET / HTTP/1.1\r\nX-Big: " + b"v" * 9000 + b"\r\n\r\n", 431),
    ("huge-header-name", b"GET / HTTP/1.1\r\n" + b"X" * 9000 + b": v\r\n\r\n", 431),
    ("too-many-headers", b"GET / HTTP/1.1\r\n" + b"X-A: 1\r\n" * 65 + b"\r\n", 431),
    ("huge-target", b"GET /target/" + b"a" * 9000 + b"+443 HTTP/1.1\r\n\r\n", 431),
    # a megabyte of header: 431 (the notary lingers, reading what the
    # client still sends, so its close does not reset the answer away)
    ("megabyte-header", b"GET / HTTP/1.1\r\nX-Big: " + b"v" * (1 << 20) + b"\r\n\r\n", 431),
    ("body-over-limit", b"POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"b" * 5000, 413),
    ("chunked-body-over-limit", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"1000\r\n" + b"b" * 4096 + b"\r\n" + b"1000\r\n" + b"b" * 4096 + b"\r\n0\r\n\r\n", 413),
    ("content-length-2^64-1", b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n"
     + b"b" * 5000, 413),
]
# Stalls (a head or a body that never completes, silent TLS clients) are in
# tests/test_hostile_slow.py, on the autojump clock.


@pytest.mark.parametrize("listener", LISTENERS)
@pytest.mark.parametrize(
    ("data", "expected"), [pytest.param(d, e, id=n) for n, d, e in MALFORMED]
)
async def test_malformed_request(
    served: ServedNotary, listener: str, data: bytes, expected: int | frozenset | str
) -> None:
    await check_hostile(served, listener, data, expected)


@pytest.mark.parametrize("listener", ["plain", "perspectives"])
async def test_a_head_cut_by_end_of_file_is_closed_without_answer(
    served: ServedNotary, listener: str
) -> None:
    outcome = await check_hostile(
        served, listener, b"GET / HTTP/1.1\r\nHost: n\r\nX-Cut: ", CLOSE, half_close=True
    )
    assert outcome.ending == "eof"


@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_smuggled_request_is_never_answered(served: ServedNotary, listener: str) -> None:
    """CL+TE with a second request hidden in the body: one 400, and the
    hidden request gets no answer of its own."""
    data = (
        b"POST / HTTP/1.1\r\nHost: n\r\nContent-Length: 42\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\n" + SMUGGLED
    )
    outcome = await check_hostile(served, listener, data, 400)
    assert outcome.statuses == (400,)
    assert outcome.ending in ("eof", "reset")


# -- hostile Convergence targets: the two API listeners ---------------------------------

def get(target: str) -> bytes:
    return f"GET /target/{target} HTTP/1.0\r\n\r\n".encode()


def post(target: str, body: bytes) -> bytes:
    return (
        f"POST /target/{target} HTTP/1.0\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


#: (name, request maker, expected): ``{site}`` is the site's ``127.0.0.1+port``,
#: ``{port}`` its port, ``{fp}`` the SHA-1 of its certificate.
TARGETS: list[tuple[str, str, int]] = [
    # the separator
    ("two-plus-signs", "GET a++443", 400),
    ("leading-plus", "GET +443", 400),
    ("trailing-plus", "GET 127.0.0.1+443+", 400),
    ("encoded-plus-makes-two", "GET 127.0.0.1%2B443+443", 400),
    ("double-encoded-plus", "GET 127.0.0.1%252B443", 400),
    ("empty-segment", "GET ", 400),
    ("dot-dot-segment", "GET ../etc/passwd", 400),
    # ports
    ("port-0-padded", "GET 127.0.0.1+00000", 400),
    ("port-65536", "GET 127.0.0.1+65536", 400),
    ("port-minus-1", "GET 127.0.0.1+-1", 400),
    ("port-abc", "GET 127.0.0.1+abc", 400),
    ("port-six-digits", "GET 127.0.0.1+000443", 400),
    ("port-with-space", "GET 127.0.0.1+4%2043", 400),
    ("port-fullwidth-digits", "GET 127.0.0.1+%EF%BC%94%EF%BC%94%EF%BC%93", 400),
    ("port-encoded-digits", "GET 127.0.0.1+%3{p0}%3{p1}%3{p2}%3{p3}%3{p4}", 200),
    # host lengths
    ("host-253-chars", "GET " + LONG_NAME + "+{port}", 200),
    ("host-254-chars", "GET " + LONG_NAME + "d+{port}", 400),
    ("label-64-chars", "GET " + "a" * 64 + ".example.test+{port}", 400),
    ("segment-over-1024-bytes", "GET " + "a." * 520 + "test+443", 414),
    # percent-encoding junk
    ("lone-percent", "GET a%+443", 400),
    ("bad-percent-digits", "GET a%zz.test+443", 400),
    ("percent-nul", "GET a%00.test+443", 400),
    ("percent-invalid-utf8", "GET %C3%28.test+443", 400),
    ("percent-overlong-dot", "GET a%C0%AEtest+443", 400),
    ("percent-surrogate", "GET a%ED%A0%80.test+443", 400),
    ("percent-slash", "GET a%2Fb.test+443", 400),
    ("percent-percent", "GET a%25.test+443", 400),
    ("underscore", "GET _dmarc.example.test+443", 400),
    ("wildcard", "GET *.example.test+443", 400),
    ("userinfo", "GET user%40example.test+443", 400),
    # internationalised names
    ("idn-u-label", "GET b%C3%BCcher.example.test+{port}", 200),
    ("idn-a-label-upper-case", "GET XN--BCHER-KVA.EXAMPLE.TEST.+{port}", 200),
    ("idn-fullwidth-dot", "GET b%C3%BCcher%EF%BC%8Eexample.test+{port}", 200),
    ("idn-mixed-scripts", "GET p%D0%B0ypal.example.test+{port}", 200),
    ("idn-right-to-left", "GET %D7%90%D7%91.example.test+{port}", 200),
    ("idn-bidi-violation", "GET a%D7%90.example.test+443", 400),
    ("idn-invalid-xn", "GET xn--zz.example.test+443", 400),
    ("idn-empty-xn", "GET xn--.example.test+443", 400),
    ("idn-xn-not-idna2008", "GET xn--ls8h.example.test+443", 400),
    ("idn-zero-width-joiner", "GET ex%E2%80%8Dample.test+443", 400),
    ("idn-emoji", "GET %F0%9F%98%80.example.test+443", 400),
    # names that are not public DNS names
    ("name-localhost", "GET localhost+{port}", 400),
    ("name-localhost-upper-case-dot", "GET LOCALHOST.+{port}", 400),
    ("name-under-localhost", "GET www.localhost+{port}", 400),
    ("name-mdns", "GET printer.local+{port}", 400),
    ("name-onion", "GET x.onion+{port}", 400),
    ("name-onion-post", "POST x.onion+{port} fingerprint={fp}", 400),
    ("name-invalid", "GET x.invalid+{port}", 400),
    ("name-internal", "GET corp.internal+{port}", 400),
    ("name-home-arpa", "GET nas.home.arpa+{port}", 400),
    ("name-home-arpa-fullwidth-dots", "GET nas%E3%80%82home%EF%BC%8Earpa+{port}", 400),
    ("name-alt", "GET x.alt+{port}", 400),
    ("name-single-label", "GET intranet+{port}", 400),
    ("name-single-label-dot", "GET intranet.+{port}", 400),
    # IP literals
    ("ipv4-short", "GET 127.1+443", 400),
    ("ipv4-hex", "GET 0x7f.0.0.1+443", 400),
    ("ipv4-integer", "GET 2130706433+443", 400),
    ("ipv4-octal", "GET 0127.0.0.1+443", 400),
    ("ipv4-five-parts", "GET 127.0.0.1.1+443", 400),
    ("ipv6-loopback-refused", "GET %5B::1%5D+{port}", 403),
    ("ipv6-unspecified-refused", "GET [::]+{port}", 403),
    ("ipv6-v4-mapped-loopback", "GET [::ffff:127.0.0.1]+{port}", 200),
    ("ipv6-v4-mapped-hex", "GET [0:0:0:0:0:ffff:7f00:1]+{port}", 200),
    ("ipv6-v4-mapped-private-refused", "GET [::ffff:10.0.0.1]+443", 403),
    ("ipv6-zone-id", "GET [fe80::1%25eth0]+443", 400),
    ("ipv6-loopback-zone-id", "GET [::1%25lo]+443", 400),
    ("ipv6-unclosed", "GET [::1+443", 400),
    ("ipv6-nested-brackets", "GET [[::1]]+443", 400),
    ("ipv6-with-port-colon", "GET [::1]:443", 400),
    ("ipv6-bad-group", "GET [::g]+443", 400),
    # the site itself, spelt oddly but validly
    ("trailing-ip-segment-ignored", "GET {site}/10.0.0.1", 200),
    ("query-string-ignored", "GET {site}?%%%zz", 200),
    # fingerprints
    ("fingerprint-oversize", "POST {site} fingerprint=" + "AA:" * 500 + "AA", 413),
    ("fingerprint-21-bytes", "POST {site} fingerprint=" + ":".join(["AB"] * 21), 400),
    ("fingerprint-19-bytes", "POST {site} fingerprint=" + ":".join(["AB"] * 19), 400),
    ("fingerprint-not-hex", "POST {site} fingerprint=" + ":".join(["ZZ"] * 20), 400),
    ("fingerprint-nul", "POST {site} fingerprint=%00" + ":".join(["AB"] * 20), 400),
    ("fingerprint-twice", "POST {site} fingerprint={fp}&fingerprint={fp}", 400),
    ("fingerprint-empty", "POST {site} fingerprint=", 400),
    ("fingerprint-many-fields", "POST {site} " + "a=1&" * 200 + "fingerprint={fp}", 400),
    ("fingerprint-body-binary", "POST {site} \\xff\\xfe\\x00", 400),
    ("fingerprint-other-certificate", "POST {site} fingerprint=" + ":".join(["AB"] * 20), 409),
    ("fingerprint-encoded-colons", "POST {site} fingerprint={fp_encoded}", 200),
    # methods and paths around /target/
    ("head-method", "HEAD {site}", 405),
    ("trace-method", "TRACE {site}", 405),
    ("options-method", "OPTIONS {site}", 405),
    ("target-without-slash", "GETPATH /target", 404),
    ("websocket-without-v2", "GETPATH /v2/ws", 404),
]


def target_request(spec: str, served: ServedNotary) -> bytes:
    method, _, rest = spec.partition(" ")
    port = str(served.site.port).rjust(5, "0")
    fields = {
        "site": served.site_target,
        "port": served.site.port,
        "fp": served.site_sha1,
        "fp_encoded": served.site_sha1.replace(":", "%3A"),
        **{f"p{i}": digit for i, digit in enumerate(port)},
    }
    if method == "POST":
        target, _, body = rest.partition(" ")
        raw_body = body.format(**fields).encode("latin-1").decode("unicode_escape").encode(
            "latin-1"
        )
        return post(target.format(**fields), raw_body)
    if method == "GETPATH":
        path = rest.format(**fields)
        extra = "Connection: Upgrade\r\nUpgrade: websocket\r\n" if path == "/v2/ws" else ""
        return f"GET {path} HTTP/1.1\r\nHost: n\r\n{extra}Connection: close\r\n\r\n".encode()
    target = rest.format(**fields)
    if method == "GET":
        return get(target)
    return f"{method} /target/{target} HTTP/1.0\r\n\r\n".encode()


@pytest.mark.parametrize("listener", ["https", "plain"])
@pytest.mark.parametrize(
    ("spec", "expected"), [pytest.param(s, e, id=n) for n, s, e in TARGETS]
)
async def test_hostile_target(
    served: ServedNotary, listener: str, spec: str, expected: int
) -> None:
    outcome = await check_hostile(served, listener, target_request(spec, served), expected)
    if expected == 200:
        assert b"fingerprintList" in outcome.raw


# -- hostile Perspectives queries: the Perspectives port and the HTTPS API ------------

#: (name, query string after ``/?``, expected)
PERSPECTIVES: list[tuple[str, str, int]] = [
    ("empty-host", "host=&port=443&service_type=2", 400),
    ("repeated-host", "host=a.test&host=b.test&service_type=2", 400),
    ("unknown-parameter", "host=a.test&evil=1", 400),
    ("service-type-1", "host=a.test&port=443&service_type=1", 400),
    ("port-0", "host=a.test&port=0", 400),
    ("port-65536", "host=a.test&port=65536", 400),
    ("port-minus-1", "host=a.test&port=-1", 400),
    ("port-abc", "host=a.test&port=abc", 400),
    ("host-nul", "host=a%00.test&port=443", 400),
    ("host-invalid-utf8", "host=%FF.test&port=443", 400),
    ("host-plus-is-space", "host=a+b.test&port=443", 400),
    ("host-254-chars", "host=" + LONG_NAME + "d&port=443", 400),
    ("label-64-chars", "host=" + "a" * 64 + ".test&port=443", 400),
    ("host-invalid-xn", "host=xn--zz.test&port=443", 400),
    ("host-zone-id", "host=%5Bfe80::1%25eth0%5D&port=443", 400),
    ("host-ipv4-short", "host=127.1&port=443", 400),
    ("host-localhost", "host=localhost&port=443&service_type=2", 400),
    ("host-onion", "host=x.onion&port=443", 400),
    ("host-home-arpa", "host=nas.home.arpa", 400),
    ("host-single-label", "host=intranet&port=443", 400),
    ("too-many-parameters", "&".join(["host=a.test"] + ["x=1"] * 20), 400),
    ("query-over-limit", "host=" + "a" * 5000, 414),
    ("bad-percent-name", "%zz=1", 400),
    # refused by policy: unknown (404) and probed in the background, where the
    # policy refuses it without a connection
    ("host-ipv6-loopback", "host=%5B::1%5D&port=443&service_type=2", 404),
    ("host-v4-mapped-private", "host=%5B::ffff:10.0.0.1%5D&port=443", 404),
]


@pytest.mark.parametrize("listener", ["perspectives", "https"])
@pytest.mark.parametrize(
    ("query", "expected"), [pytest.param(q, e, id=n) for n, q, e in PERSPECTIVES]
)
async def test_hostile_perspectives_query(
    served: ServedNotary, listener: str, query: str, expected: int
) -> None:
    data = f"GET /?{query} HTTP/1.0\r\n\r\n".encode()
    await check_hostile(served, listener, data, expected)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"POST /?host=a.test HTTP/1.0\r\nContent-Length: 0\r\n\r\n", 405, id="post"),
        pytest.param(b"GET /target/a.test+443 HTTP/1.0\r\n\r\n", 404, id="convergence-path"),
        pytest.param(b"GET /../../etc/passwd HTTP/1.0\r\n\r\n", 404, id="traversal"),
    ],
)
async def test_perspectives_port_refuses_other_requests(
    served: ServedNotary, data: bytes, expected: int
) -> None:
    await check_hostile(served, "perspectives", data, expected)


# -- TLS-level junk on the HTTPS listener -----------------------------------------------

TLS_JUNK: Sequence[tuple[str, bytes]] = [
    ("plain-http", b"GET /target/a.test+443 HTTP/1.0\r\n\r\n"),
    # SSLv2 CLIENT-HELLO: 46 bytes of body, 7 cipher specs, a 16-byte challenge
    ("sslv2-client-hello", bytes.fromhex("802e" "01" "0301" "0015" "0000" "0010")
     + bytes.fromhex("010080" "030080" "0700c0" "060040" "020080" "040080" "000004")
     + bytes(16)),
    ("record-of-16-megabytes", b"\x16\x03\x01\xff\xff" + b"\x01\xff\xff\xff" + bytes(4000)),
    ("alert-then-junk", b"\x15\x03\x03\x00\x02\x02\x28" + bytes(100)),
    ("random-bytes", bytes(range(256)) * 8),
]


@pytest.mark.parametrize(("data"), [pytest.param(d, id=n) for n, d in TLS_JUNK])
async def test_tls_junk_is_closed_without_answer(served: ServedNotary, data: bytes) -> None:
    errors_before = served.errors.count()
    with trio.fail_after(EXCHANGE_TIMEOUT_S):
        stream = await open_raw(served.ports["https"])
        async with stream:
            await send_quietly(stream, data)
            await normal_query(served)
            outcome = await read_answers(stream)
    await normal_query(served)
    assert outcome.statuses == ()
    assert not outcome.raw.startswith(b"HTTP/")  # a TLS alert at most
    assert outcome.ending in ("eof", "reset")
    assert served.errors.since(errors_before) == []
