"""Socket-level faults of the servers the notary's own clients talk to
(``tests.support.faults``, issue 30 item 3): the test is the server, and
does each fault of ``ServerFault`` that applies to every connection.

* The prober, end to end: a target that resets, half-closes, drips,
  stalls, never reads or answers an HTTP 1xx instead of TLS. Its queries
  get their 503 within ``[probe] timeout_s``, for the reason the fault
  calls for; a cached site is answered meanwhile; a healthy target never
  probed before is probed and answered afterwards.
* The witnessing client: a witness (HTTPS, pinned) doing each fault,
  1xx, drip and stall included. The task logs a warning and asks again
  (it connects again), the log keeps appending and serving its
  checkpoint (without a cosignature), cache hits are answered.

Nothing is logged at ERROR in any of them. On Trio's autojump clock:
stalls, drips and deadlines cost no real time (where the notary works in
worker threads, the clock jumps only after it has idled a moment in real
time: ``WORKER_THREAD_S``).

PostgreSQL, the fourth client, runs in worker threads on real time:
tests/test_faults_postgres.py.

Covered elsewhere and not repeated: the prober alone against a silent,
garbage or truncating target (tests/test_probe.py); more misbehaving
targets end to end (test_hostile_targets.py); a witness that is
unreachable or answers 1xx after a complete exchange
(test_log_witnesses.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme

from notary.protocol import tlog
from notary.state import crypto
from tests.support.faults import (
    Respond,
    ServerFault,
    http_respond,
    open_faulty_server,
)
from tests.support.notaries import NotaryUnderTest, legacy_query, open_notary
from tests.support.tls_targets import LOCALHOST, open_tls_target
from tests.test_log_serve import get, logged_statement
from tests.test_log_witnesses import OTHER, SITE, WITNESS_NAME, open_log_notary

FRESH = "fresh.example.test"
PROBE_TIMEOUT_S = 5.0
#: Real seconds a worker thread's call may take without the autojump clock
#: running on meanwhile.
WORKER_THREAD_S = 0.002
_RSA_KEY = crypto.generate_rsa_key()


@pytest.fixture(autouse=True)
def one_rsa_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every notary of this module gets the same RSA key (nothing here
    depends on it; generating one costs a fifth of a second)."""
    monkeypatch.setattr(crypto, "generate_rsa_key", lambda *args, **kwargs: _RSA_KEY)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def server_context(name: str = LOCALHOST) -> tuple[ssl.SSLContext, bytes]:
    """A TLS server context for ``name`` and its certificate's DER."""
    issued = trustme.CA().issue_cert(name)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    issued.configure_cert(context)
    return context, ssl.PEM_cert_to_DER_cert(issued.cert_chain_pems[0].bytes().decode())


def tls_flight(context: ssl.SSLContext) -> Respond:
    """A TLS server's first flight (ServerHello to its certificates) for
    the ClientHello received so far: what a prober target answers."""

    def respond(hello: bytes) -> bytes | None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        server = context.wrap_bio(incoming, outgoing, server_side=True)
        incoming.write(hello)
        with contextlib.suppress(ssl.SSLWantReadError):
            server.do_handshake()
        return outgoing.read() or None

    return respond


@asynccontextmanager
async def open_settled_notary(directory: Path, **settings: object) -> AsyncIterator[NotaryUnderTest]:
    """``open_notary`` once its known-targets filter has loaded (until then
    a cache miss reads the store in a worker thread)."""
    async with open_notary(directory, **settings) as notary:  # type: ignore[arg-type]
        await notary.running.stored.settled.wait()
        yield notary


# -- the prober ----------------------------------------------------------------------

#: Why the probe of a target doing each fault fails (``ProbeError.reason``).
PROBE_FAILURES = {
    ServerFault.RESET_ON_ACCEPT: "handshake",
    ServerFault.RESET_MID_HANDSHAKE: "handshake",
    ServerFault.RESET_MID_ANSWER: "handshake",
    ServerFault.HALF_CLOSE_BEFORE_ANSWER: "handshake",
    ServerFault.NEVER_READS: "timeout",
    ServerFault.ANSWER_100: "handshake",  # not TLS
    ServerFault.ANSWER_101: "handshake",
    ServerFault.ANSWER_103: "handshake",
    ServerFault.DRIP: "timeout",
    ServerFault.STALL: "timeout",
}
HOSTILE = [f"h{i}.example.test" for i in range(3)]


@pytest.mark.parametrize("fault", list(ServerFault), ids=lambda fault: fault.value)
async def test_a_faulty_target_fails_its_probe_in_time(
    tmp_path: Path, fault: ServerFault, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    context, _ = server_context("hostile.example.test")
    async with open_tls_target(names=[SITE, FRESH]) as site, open_faulty_server(
        fault, tls_flight(context)
    ) as target:
        names = {SITE: [site.host], FRESH: [site.host], **{h: [target.host] for h in HOSTILE}}
        async with open_settled_notary(
            tmp_path, names=names, probe={"timeout_s": PROBE_TIMEOUT_S},
            answers={"failures_at_deadline": False}, rescan={"enabled": False},
            admin={"listen": (), "metrics_interval_s": 3600.0},
        ) as notary:
            assert (await legacy_query(notary.port, f"{SITE}+{site.port}", None)).status == 200
            answers = {}
            started = trio.current_time()
            async with trio.open_nursery() as nursery:

                async def ask(host: str) -> None:
                    answers[host] = await legacy_query(notary.port, f"{host}+{target.port}", None)

                for host in HOSTILE:
                    nursery.start_soon(ask, host)
                await target.wait_accepted(1)
                cached = await legacy_query(notary.port, f"{SITE}+{site.port}", None)
                assert cached.status == 200
            elapsed = trio.current_time() - started
            failures = notary.running.prober.statistics().failures
            fresh = await legacy_query(notary.port, f"{FRESH}+{site.port}", None)
    assert {host: answer.status for host, answer in answers.items()} == dict.fromkeys(HOSTILE, 503)
    assert elapsed <= PROBE_TIMEOUT_S + 0.01
    assert failures == {PROBE_FAILURES[fault]: len(HOSTILE)}
    assert fresh.status == 200
    assert errors(caplog) == []


# -- the witnessing client -----------------------------------------------------------

#: What the faulty witness would answer whole: a 200 without a cosignature.
WITNESS_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnothing.\n"


@pytest.mark.parametrize("fault", list(ServerFault), ids=lambda fault: fault.value)
async def test_a_faulty_witness_is_asked_again_and_holds_nothing_back(
    tmp_path: Path, fault: ServerFault, caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    autojump_clock.autojump_threshold = WORKER_THREAD_S  # the log's store: worker threads
    caplog.set_level(logging.WARNING)
    key_path = tmp_path / "a.v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(key_path))
    context, der = server_context()
    async with open_faulty_server(
        fault, http_respond(WITNESS_ANSWER), tls=context
    ) as witness, open_tls_target(names=[SITE, OTHER]) as site:
        entry = {"url": f"https://127.0.0.1:{witness.port}/v2/witness",
                 "key": tlog.cosigner_key(WITNESS_NAME, public),
                 "pin": hashlib.sha1(der).hexdigest()}
        async with open_log_notary(
            tmp_path / "a", key_path, site.host, [entry], tmp_path / "a.db"
        ) as notary:
            await logged_statement(notary, (SITE, site.port))
            with trio.fail_after(60):
                await witness.wait_accepted(3)  # asked, failed, asked again (twice)
            await logged_statement(notary, (OTHER, site.port))  # the log goes on
            status, body = await get(notary, "/v2/log/checkpoint")
            cached = await legacy_query(notary.port, f"{SITE}+{site.port}", None)
    assert status == 200 and body.decode().count("\u2014") == 1  # no cosignature
    assert cached.status == 200
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("log: witness")]
    assert len(warned) >= 2
    assert errors(caplog) == []
