"""The query service: answers "which certificate does this target serve?"
from the cache, the store and the prober, and keeps signed answers ready.

Invariants
1. A cache hit touches no database, and no signer but the first time its
   protocol is asked after the target's list changed: it returns bytes that
   were signed then.
2. A target's answer in each protocol is signed at most once per change of
   its list, by the first query that needs it (``TargetRecord``): refreshes
   (``notary.service.records``, once per probe) and store loads sign nothing, so rescans of targets nobody asks about, and
   the protocols nobody asks a target in, cost no signature.
3. A record loaded from the store never replaces a record already in the
   cache (the cached one is at least as new).
4. A cache miss for a target the stored-targets filter has never seen reads
   no database: the store cannot hold it (see ``notary.service.stored_targets``;
   a node's workers share the store and have no filter: every miss reads).
5. A cache hit that can be answered at once (``convergence.answer_status``)
   is decided with one cache lookup and one clock read, without awaiting,
   and ``answer_at_once`` returns the complete HTTP response made with the record
   (``TargetRecord.http_responses``): no response bytes are built per query.
   A limited client's query costs one token-bucket admission more (a dict
   lookup and a few float operations, ``notary.model.ratelimit``).
6. Limits (``notary.service.abuse``): every query of a limited client
   (``client`` not None: its prefix key) is admitted by its query bucket
   first, once, whichever path answers it; a refusal raises ``RateLimited``
   (429), or is the 429 response on the fast path. A probe a query would
   start (not one it joins: ``_probing``) is admitted by the client's and
   the target's probe budgets; the prober admits every connection of a
   probe (each address, each sample) by the budget of the address prefix
   it connects to (after resolution). A throttled query (the
   target's or its prefix's budget) is answered from the target's newest
   observation when it is more recent than the target's probe spacing (as
   within ``reprobe_after_s``: 200 or 409), else as a failed probe (a GET
   with history: 200 with it; else 503).
7. Probe failures leak little: refused by policy or opt-out is 403 (v2:
   ``refused``); every other failure (name does not resolve, connection
   refused, unreachable, not TLS, timed out, throttled by rule 6) is one
   503 with one message (v2: ``unreachable``), answered, when
   ``failure_delay_s`` is set, no sooner than that long after the query
   decided to probe: the time a probe that times out takes, so the answer's
   timing does not tell a refused port from a filtered one.
8. A query makes the rescan scheduler track its target (``note_query``)
   only once it was admitted (not 429) and its target is real: it was
   answered from an observation, or the probe it needed (started or joined)
   was admitted and reached the target (a certificate, or a connection or
   handshake failure at an address the policy allows). A query refused, or
   whose probe was refused, throttled with nothing observed, stopped at the
   name lookup or timed out, registers nothing, so junk queries cannot fill
   the scheduler's table or make it probe their targets for a week.
9. A fingerprint that is not vouched for (never seen for the target, or not
   fresh) makes a query probe whenever the target's probe budget
   (``[limits] probes_per_minute_per_target``) allows, however recently the
   target was probed: a site that just rotated its certificate is confirmed,
   not contradicted, by a notary that probed it a minute earlier. Only when
   that budget is spent is the last probe the answer (409). Without a
   per-target budget, ``reprobe_after_s`` plays its part.
10. With DANE among ``[verify] backends`` (issue 20), a record answers
   only with a DANE verdict it may still reuse (``DaneVerdict.reuse_until``:
   the TLSA records' TTL, capped); without one, the query refreshes the
   target (a probe and a TLSA lookup together). Where DANE decides
   (``notary.model.dane.deciding_backend``) Convergence answers 200 for
   each certificate DANE vouches for (a site serving several at once has
   each judged on its own: ``DaneVerdict.vouches_for``; and a GET when it
   vouches for any), 409 for another one or
   when no record vouches, 303 (inconclusive) for no TLSA or an unsigned
   zone (DANE alone), 503 for bogus DNSSEC or a silent resolver; v2 says
   ``match``, ``mismatch``, ``unknown``, ``unreachable`` alike (a match
   only for a certificate the statement's evidence shows vouched for,
   ``v2.stated_vouched``, and its observations carry; ``unknown`` for
   another one DANE vouches for: docs/v2.md S6). Where the
   perspective decides, rules 1-9 apply as they stand. A query answered
   after its probe (made, joined, or throttled with a recent observation:
   rule 6) uses the verdict made with that probe even past its reuse time:
   the verdict is as recent as the observation answered from, so a short
   TTL cannot turn a vouched-for certificate into a 503. A DNSSEC failure
   found without a certificate (the name's own lookup failed validation or
   got no answer: ``Records`` keeps the failure's verdict, on a record
   without observations for a target never observed) is answered as DANE's
   failure: Convergence's 503 with DANE's message, v2 ``unreachable`` with
   a statement whose evidence says why; Perspectives still answers only
   from observations (404 without), and such a record registers nothing
   (rule 8). Perspectives
   answers, a history without a verdict, are the same under every backend.
11. A v2 result's statement is the record's (``TargetRecord.v2_statement_at``;
   with a log, not signed again for every change: ``notary.service.records``).
   The bytes of the log entry of a statement signed for a limited client's
   query are charged to its log budget (``AbuseControls.charge_log``); a
   client over it is refused probes (invariant 6: 429), no change is signed
   for it (the statement kept is served) and a target with no statement yet
   is answered without one (``unknown``). A match or mismatch is given only
   with a statement that backs it (V5): one signed for what the record
   knows, or differing by sightings within their lag, or whose own
   observations (its DANE evidence, where DANE decides) give the same
   verdict; otherwise ``unknown``.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import trio

from notary.errors import (
    ProbeConnectFailed,
    ProbeError,
    ProbeHandshakeFailed,
    ProbeRefused,
    ProbeThrottled,
    ProbeTimeout,
    StoreError,
)
from notary.model.dane import CONVERGENCE_STATUS, DaneOutcome, deciding_backend
from notary.model.ratelimit import RateLimited, retry_after_s
from notary.model.targets import Target
from notary.outbound.writer import Storage
from notary.protocol import convergence, http, perspectives, v2
from notary.protocol.convergence import Decision, answer_status
from notary.service.abuse import AbuseControls
from notary.service.records import Records, StatementRefused, TargetRecord
from notary.service.scheduler import RescanScheduler
from notary.state.cache import LRUCache
from notary.state.crypto import Ed25519Signer

log = logging.getLogger(__name__)

#: The protocols queries are counted by (``QueryService.answered``).
QUERY_PROTOCOLS = ("convergence", "perspectives", "v2", "websocket")


#: The body of every 503 of a failed probe (rule 7), and of a 403.
UNOBSERVED_MESSAGE = b"could not observe the target's certificate\n"
REFUSED_MESSAGE = b"target refused by this notary's policy\n"
#: Distinct 429 responses kept ready (one per Retry-After and keep-alive).
TOO_MANY_RESPONSES = 256
#: The bodies of the Convergence answers DANE gives without the signed list
#: (invariant 10).
DANE_MESSAGES = {
    DaneOutcome.NO_TLSA: b"inconclusive: the site publishes no TLSA records (DNSSEC-proven)\n",
    DaneOutcome.INSECURE: b"inconclusive: the site's DNS zone is not signed (no DANE)\n",
    DaneOutcome.BOGUS: b"the site's TLSA records failed DNSSEC validation\n",
    DaneOutcome.RESOLVER_FAILURE: b"could not look up the site's TLSA records now\n",
}
#: The body of a 503 when no DANE verdict could be made in time.
UNCHECKED_MESSAGE = b"could not check the site's TLSA records in time\n"
#: The same, as complete responses, by (outcome, keep-alive).
_DANE_RESPONSES = {
    (outcome, alive): http.response(
        CONVERGENCE_STATUS[outcome], body, content_type=b"text/plain; charset=utf-8",
        keep_alive=alive,
    )
    for outcome, body in DANE_MESSAGES.items() for alive in (False, True)
}


#: Waits until the statements given (None: no statement) are proven against a
#: cosigned checkpoint, or a bound passes (``CosignedCheckpoints.wait_witnessed``).
WaitWitnessed = Callable[[Iterable["v2.SignedStatement | None"]], Awaitable[None]]


class QueryDeadline(ProbeTimeout):
    """The query stopped waiting for its probe (``query_timeout_s``); the
    probe itself goes on, and its outcome is noted when it ends."""


#: Failures that are no probe's outcome (the scheduler is not told of them).
_NOT_PROBE_OUTCOMES = (QueryDeadline, ProbeThrottled)
#: Probe failures after which the query still makes its target known to the
#: scheduler (invariant 8): the name resolved to an address the policy
#: allows and a connection was tried there.
_REACHED_FAILURES = (ProbeConnectFailed, ProbeHandshakeFailed)


def too_many_response(retry_after: int, keep_alive: bool, cache: dict) -> bytes:
    """The 429 answer to a query over its rate, made once per
    ``(retry_after, keep_alive)`` and kept in ``cache`` (bounded by clearing)."""
    key = (retry_after, keep_alive)
    response = cache.get(key)
    if response is None:
        if len(cache) >= TOO_MANY_RESPONSES:
            cache.clear()
        response = cache[key] = http.response(
            429, b"too many queries; retry later\n", content_type=b"text/plain; charset=utf-8",
            keep_alive=keep_alive, extra_headers=((b"Retry-After", b"%d" % retry_after),),
        )
    return response


def response_index(status: int, keep_alive: bool) -> int:
    """Where the response for ``status`` (200 or 409) is in
    ``TargetRecord.http_responses``."""
    return (2 if status == 409 else 0) + (1 if keep_alive else 0)


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer before its HTTP framing: status, body, content type and
    the headers it needs beyond those ``http.response`` writes.

    ``prepared``: the complete response, made already for the request's
    keep-alive (the shared bytes of an immutable log page,
    ``notary.server.logapi``), which ``response`` returns as it is.
    ``release``: to call once the response is sent or its connection ended
    (the bytes it holds for a slow reader are counted until then)."""

    status: int
    body: bytes
    content_type: bytes = convergence.CONTENT_TYPE
    headers: tuple[tuple[bytes, bytes], ...] = ()
    prepared: bytes | None = None
    release: Callable[[], None] | None = None

    def response(self, keep_alive: bool) -> bytes:
        """The complete HTTP response."""
        if self.prepared is not None:
            return self.prepared
        return http.response(
            self.status, self.body, content_type=self.content_type, keep_alive=keep_alive,
            extra_headers=self.headers,
        )


class Outcome(enum.Enum):
    """How a query's probe went, for each protocol to answer in its terms."""

    #: The probe saw a certificate: ``ProbeOutcome.record`` is the new record.
    OBSERVED = "observed"
    #: Throttled (invariant 6), but the target's newest observation is more
    #: recent than its probe spacing: answered from it, as if just probed.
    RECENT = "recent"
    #: The address policy or an opt-out refused the target (invariant 7: 403).
    REFUSED = "refused"
    #: Any other failure, throttled with nothing recent, or the query's
    #: deadline (invariant 7: one 503).
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """What ``QueryService.probe_for_query`` gives each protocol: the
    ``outcome``, the ``record`` to answer from (the refreshed one, or the
    newest known; None: nothing observed) and when the query decided to
    probe (``started``, Trio time, for invariant 7's delay)."""

    outcome: Outcome
    record: TargetRecord | None
    started: float


#: The v2 verdict of a failed probe, by outcome (none: answered from the record).
_V2_FAILURES = {Outcome.REFUSED: v2.VERDICT_REFUSED, Outcome.UNREACHABLE: v2.VERDICT_UNREACHABLE}
#: The v2 verdict of each DANE outcome but a match (invariant 10).
_V2_DANE_VERDICTS = {
    DaneOutcome.MISMATCH: v2.VERDICT_MISMATCH, DaneOutcome.NO_TLSA: v2.VERDICT_UNKNOWN,
    DaneOutcome.INSECURE: v2.VERDICT_UNKNOWN, DaneOutcome.BOGUS: v2.VERDICT_UNREACHABLE,
    DaneOutcome.RESOLVER_FAILURE: v2.VERDICT_UNREACHABLE,
}
#: The DANE outcomes of a DNSSEC failure: answered with DANE's message
#: whether or not a probe saw a certificate (invariant 10).
_DANE_FAILURES = frozenset({DaneOutcome.BOGUS, DaneOutcome.RESOLVER_FAILURE})
#: What "check now" says of each outcome (as v2 verdicts say it).
_CHECK_OUTCOMES = {
    Outcome.OBSERVED: "observed", Outcome.RECENT: "observed",
    Outcome.REFUSED: v2.VERDICT_REFUSED, Outcome.UNREACHABLE: v2.VERDICT_UNREACHABLE,
}


class _NoRescans:
    """The scheduler of a notary that does not rescan: told nothing."""

    def note_query(self, target: Target, key: str | None = None) -> None:
        pass

    def note_probe(self, *args: object) -> None:
        pass


class QueryService:
    """Answers Convergence, Perspectives and v2 queries, and the web page's
    lookups and checks (see the invariants above).

    Resource handling: borrows the records (which refresh targets), the
    cache (read on the fast path), the store writer (``note_asked``), the
    v2 signer (answer envelopes) and the scheduler; owns nothing.

    ``abuse``: the limits of invariant 6 (None: none). ``failure_delay_s``:
    invariant 7 (0: failures are answered at once).

    Error handling: probe failures become 503 (403 when the policy refused
    the target) with a short unsigned message; store read failures are
    logged and treated as "nothing known" so answers keep coming from memory
    and probes. A limited client over its rate gets ``RateLimited`` raised
    (the handlers answer 429), counted by the handlers, not here.
    """

    def __init__(
        self,
        *,
        records: Records,
        cache: LRUCache,
        storage: Storage,
        fresh_for_s: int,
        reprobe_after_s: int,
        query_timeout_s: float,
        clock: Callable[[], float],
        perspectives: bool = False,
        v2_signer: Ed25519Signer | None = None,
        abuse: AbuseControls | None = None,
        scheduler: RescanScheduler | None = None,
        failure_delay_s: float = 0.0,
        backends: tuple[str, ...] = ("perspective",),
        wait_witnessed: WaitWitnessed | None = None,
    ) -> None:
        self._records = records
        #: With ``[log] min_cosignatures``: waits for the statements of an
        #: answer to be proven against a cosigned checkpoint (bounded).
        self._wait_witnessed = wait_witnessed
        self._cache = cache
        self._storage = storage
        self._fresh_for_s = fresh_for_s
        self._reprobe_after_s = reprobe_after_s
        self._query_timeout_s = query_timeout_s
        self._clock = clock
        self._perspectives = perspectives
        self._v2_signer = v2_signer
        #: The limits of invariant 6 (a null object when there are none).
        self._abuse = abuse if abuse is not None else AbuseControls.unlimited()
        #: The query bucket of invariant 6, read on the fast path.
        self._query_buckets = self._abuse.queries
        self._failure_delay_s = failure_delay_s
        #: ``[verify] backends`` (invariant 10); ``_dane``: DANE is one.
        self._backends = backends
        self._dane = "dane" in backends
        #: How recently the target must have been probed for a query with a
        #: fingerprint not vouched for to be answered without a probe
        #: (invariant 9).
        self._mismatch_reprobe_after_s = (
            0 if self._abuse.target_spacing_s > 0 else reprobe_after_s
        )
        #: How old a DANE verdict may be and still answer a query whose probe
        #: was just made (within the query's deadline) or throttled as too
        #: recent (within the target's probe spacing): invariant 10.
        self._final_grace_s = max(self._abuse.target_spacing_s, query_timeout_s)
        #: Targets whose probe a query started, with how many queries wait
        #: for it: a query joining one is not charged (invariant 6).
        self._probing: dict[str, int] = {}
        self._too_many: dict[tuple[int, bool], bytes] = {}
        #: The scheduler told of queries and probe outcomes (None: no rescans).
        self.scheduler = scheduler
        self._rescans: RescanScheduler | _NoRescans = (
            scheduler if scheduler is not None else _NoRescans()
        )
        #: Queries answered, by protocol (``QUERY_PROTOCOLS``) then HTTP
        #: status, cumulative (requests refused before reaching the service
        #: are counted by the handlers). Plain counters on the query path;
        #: ``notary.server.metrics`` reads them. Plain dicts: a
        #: ``collections.Counter`` increment costs about three times more.
        self.answered: dict[str, dict[int, int]] = {name: {} for name in QUERY_PROTOCOLS}
        self._convergence_answered = self.answered["convergence"]

    def _count(self, protocol: str, status: int) -> None:
        answered = self.answered[protocol]
        answered[status] = answered.get(status, 0) + 1

    def _admit(self, client: bytes | None, queries: int = 1) -> None:
        """Invariant 6: ``queries`` queries of the client prefix ``client``.
        Raises ``RateLimited``."""
        self._abuse.admit_query(client, self._clock(), queries)

    # -- the fast path (invariant 5)

    def answer_at_once(
        self, target: Target, fingerprint: bytes | None, keep_alive: bool,
        client: bytes | None = None,
    ) -> bytes | None:
        """The complete HTTP response (``keep_alive`` or ``Connection:
        close``) made with the cached record when the cache alone answers
        (invariant 5), the query counted; else None, the query neither
        counted nor charged: the caller then awaits ``answer``. A limited
        ``client`` over its query rate gets the 429 response (invariant 6).
        Synchronous, for the connection loop's fast path."""
        key = target.key
        record = self._cache.get(key)
        if record is None:
            return None
        now = self._clock()
        status = self._status(record, fingerprint, int(now))
        if status is None:
            return None
        if client is not None and self._query_buckets is not None:
            wait = self._query_buckets.take(client, now)
            if wait:
                self._count("convergence", 429)
                return too_many_response(retry_after_s(wait), keep_alive, self._too_many)
        answered = self._convergence_answered
        answered[status] = answered.get(status, 0) + 1
        if status == 200 or status == 409:
            self._storage.note_asked(target, key)
            if self.scheduler is not None:  # invariant 8: answered from an observation
                self.scheduler.note_query(target, key)
            return record.http_responses[response_index(status, keep_alive)]
        assert record.dane is not None  # the other statuses are DANE's
        self._note_answered(target, record)
        return _DANE_RESPONSES[record.dane.outcome, keep_alive]

    def answer_perspectives_at_once(
        self, target: Target, keep_alive: bool, client: bytes | None = None
    ) -> bytes | None:
        """``answer_perspectives``'s complete HTTP response when the cache
        alone answers (a record with observations: its signed XML), the
        query counted; else None, nothing counted nor charged, and the
        caller awaits ``answer_perspectives``. A limited ``client`` over its
        query rate gets the 429 response (invariant 6). Synchronous, for the
        connection loop's fast path, as ``answer_at_once``."""
        if not self._perspectives:
            return None
        record = self._cache.get(target.key)
        if record is None or not record.timeline.observations:
            return None
        body = record.perspectives_body
        if body is None:
            return None
        if client is not None and self._query_buckets is not None:
            wait = self._query_buckets.take(client, self._clock())
            if wait:
                self._count("perspectives", 429)
                return too_many_response(retry_after_s(wait), keep_alive, self._too_many)
        self._note_query(target)  # invariant 8: answered from an observation
        self._count("perspectives", 200)
        return http.response(
            200, body, content_type=perspectives.CONTENT_TYPE, keep_alive=keep_alive
        )

    def _status(self, record: TargetRecord, fingerprint: bytes | None, now: int) -> int | None:
        """The status the cached ``record`` answers with at ``now`` (None:
        it cannot answer without a probe)."""
        if self._dane:
            return self._dane_status(record, fingerprint, now)
        return answer_status(
            record.timeline, fingerprint, now, self._fresh_for_s, self._mismatch_reprobe_after_s
        )

    def _dane_decides(
        self, record: TargetRecord, now: int, *, final: bool = False
    ) -> bool | None:
        """Whether DANE decides ``record``'s answers (invariant 10); None:
        its DANE verdict is missing or too old to reuse. ``final``: the
        query's probe was made, joined or throttled as too recent: a verdict
        checked within ``_final_grace_s`` is the one of that probe, and
        answers with its observation even when its TTL ran out."""
        dane = record.dane
        if dane is None:
            return None
        if dane.reuse_until < now and not (
            final and dane.lookup.checked_at >= now - self._final_grace_s
        ):
            return None
        return deciding_backend(self._backends, dane.outcome) == "dane"

    def _dane_status(
        self, record: TargetRecord, fingerprint: bytes | None, now: int, *, final: bool = False
    ) -> int | None:
        """Convergence's status under invariant 10; None: refresh first
        (``final``: the refresh was made, or could not be: answer anyway)."""
        decides = self._dane_decides(record, now, final=final)
        if decides is None:
            return 503 if final else None
        if not decides:
            if final:
                return convergence.status_of(
                    record.timeline, fingerprint, now=now, fresh_for_s=self._fresh_for_s
                )
            return convergence.answer_status(
                record.timeline, fingerprint, now, self._fresh_for_s,
                self._mismatch_reprobe_after_s,
            )
        dane = record.dane
        assert dane is not None
        if dane.outcome is not DaneOutcome.MATCH:
            return CONVERGENCE_STATUS[dane.outcome]
        if fingerprint is None or dane.vouches_for(None, fingerprint):
            return 200
        # Another certificate than those DANE vouched for: probe again
        # (the site may have just rotated it), as invariant 9 says.
        if final or self._probed_within(record, self._mismatch_reprobe_after_s, now):
            return 409
        return None

    def _probed_within(self, record: TargetRecord, seconds: int, now: int) -> bool:
        newest = record.timeline.newest
        return newest is not None and newest.last_seen >= now - seconds

    def _answer_of(self, record: TargetRecord, status: int) -> Answer:
        """The Convergence answer of ``status`` for ``record``: its signed
        list (200, 409) or DANE's unsigned message."""
        if status == 200 or status == 409:
            return Answer(status, record.convergence_body)
        dane = record.dane
        message = DANE_MESSAGES.get(dane.outcome) if dane is not None else None
        return Answer(status, message or UNCHECKED_MESSAGE, b"text/plain; charset=utf-8")

    # -- one probe for a query, whatever the protocol

    def _note_query(self, target: Target) -> None:
        """An admitted query of a real target (invariant 8)."""
        self._storage.note_asked(target)
        self._rescans.note_query(target)

    def _note_answered(self, target: Target, record: TargetRecord) -> None:
        """An admitted query answered from ``record``: noted (invariant 8)
        unless the record holds no observation (the verdict of a DNSSEC
        failure kept for a target never observed: its query stopped at the
        name lookup)."""
        if record.timeline.observations:
            self._note_query(target)

    async def probe_for_query(
        self, target: Target, record: TargetRecord | None, client: bytes | None,
        address_hint: str | None = None,
    ) -> ProbeOutcome:
        """Probe ``target`` for a query of the client prefix ``client``
        (``record``: what is known of it): admitted by the limits (invariant
        6), under the query deadline, the query and the outcome noted for
        the scheduler (invariant 8). Each protocol answers the outcome in
        its terms and applies invariant 7's delay (``failure_deadline``).
        ``address_hint``: the address the client's own connection reached
        (a v2 entry's ``address``), probed too when the prober's rule allows
        it (``Records.refresh``).

        Error handling: ``RateLimited`` when the client's probe budget is
        spent (nothing probed, nothing noted); probe failures are outcomes."""
        started = trio.current_time()
        try:
            refreshed = await self._refresh_for(target, record, client, address_hint)
        except ProbeError as exc:
            self._note_probe_outcome(target, record, None, exc)
            newest = self._cache.peek(target.key) or record  # refreshed meanwhile?
            if isinstance(exc, ProbeThrottled) and self._probed_lately(newest):
                return ProbeOutcome(Outcome.RECENT, newest, started)
            if isinstance(exc, ProbeRefused):
                return ProbeOutcome(Outcome.REFUSED, newest, started)
            return ProbeOutcome(Outcome.UNREACHABLE, newest, started)
        self._note_probe_outcome(target, record, refreshed, None)
        return ProbeOutcome(Outcome.OBSERVED, refreshed, started)

    async def _refresh_for(
        self, target: Target, record: TargetRecord | None, client: bytes | None,
        address_hint: str | None = None,
    ) -> TargetRecord:
        """Refresh ``target`` under the query deadline, admitted by the
        limits unless it joins a probe a query started (invariant 6).

        Error handling: ``RateLimited`` (the client's probe budget), a
        ``ProbeError`` for a probe that failed, was throttled
        (``ProbeThrottled``) or did not finish in time (``QueryDeadline``)."""
        key = target.key
        probing = self._probing
        charged = key not in probing
        if charged:
            self._abuse.admit_probe(client, key, self._clock())
        probing[key] = probing.get(key, 0) + 1
        try:
            with trio.fail_after(self._query_timeout_s):
                refreshed = await self._records.refresh(target, address_hint=address_hint)
        except trio.TooSlowError:
            raise QueryDeadline("probe did not finish in time") from None
        except ProbeRefused:
            if charged:
                self._abuse.refund_probe(key)
            raise
        finally:
            waiting = probing[key] - 1
            if waiting:
                probing[key] = waiting
            else:
                del probing[key]
        if charged and refreshed.last_report is not None:
            known = set() if record is None else {
                o.certificate.sha256 for o in record.timeline.observations
            }
            new = sum(1 for leaf in refreshed.last_report.leaves if leaf.sha256 not in known)
            self._abuse.charge_new_certificates(client, self._clock(), new)
        return refreshed

    def _note_probe_outcome(
        self, target: Target, record: TargetRecord | None,
        refreshed: TargetRecord | None, failure: ProbeError | None,
    ) -> None:
        """Tell the scheduler of a query whose probe ended with the record
        ``refreshed`` or ``failure`` (``record``: what was known before): the
        query when invariant 8 lets it register the target, then the probe's
        outcome (the scheduler ignores outcomes of targets it does not know;
        a probe the scheduler joined is noted by both, and counts once)."""
        result = refreshed.last_probe if refreshed is not None else None
        registers = result is not None or isinstance(failure, _REACHED_FAILURES) or (
            record is not None and bool(record.timeline.observations)
            and not isinstance(failure, ProbeRefused)
        )
        if registers:
            self._note_query(target)
        if result is not None:
            assert refreshed is not None
            self._rescans.note_probe(target, result, None, refreshed.last_probe_changed)
        elif failure is not None and not isinstance(failure, _NOT_PROBE_OUTCOMES):
            self._rescans.note_probe(target, None, failure.reason, False)

    def _probed_lately(self, record: TargetRecord | None) -> bool:
        """Whether ``record``'s newest observation is more recent than the
        spacing of the target's probes (invariant 6): then a throttled query
        is answered from it, as within ``reprobe_after_s``."""
        newest = record.timeline.newest if record is not None else None
        if newest is None:
            return False
        # Observations are dated in whole seconds (rounded down): compare
        # at that grain, or a spacing under a second is never "lately".
        return newest.last_seen >= math.floor(self._clock() - self._abuse.target_spacing_s)

    async def failure_deadline(self, probed: ProbeOutcome) -> None:
        """Return ``failure_delay_s`` after the query decided to probe:
        invariant 7."""
        if self._failure_delay_s > 0:
            await trio.sleep_until(probed.started + self._failure_delay_s)

    # -- Convergence

    async def answer(
        self, target: Target, fingerprint: bytes | None, client: bytes | None = None
    ) -> Answer:
        """The answer to ``GET`` (``fingerprint`` None) or ``POST`` for
        ``target``, asked by the client prefix ``client`` (None: unlimited).

        Error handling: ``RateLimited`` when the client is over its query or
        probe rate (invariant 6)."""
        self._admit(client)
        record = self._cache.get(target.key)
        status = None if record is None else self._status(record, fingerprint, int(self._clock()))
        if record is not None and status is not None:
            self._note_answered(target, record)
            self._count("convergence", status)
            return self._answer_of(record, status)
        if self._dane:
            answer = await self._answer_with_dane(target, fingerprint, record, client)
        else:
            answer = await self._answer_slowly(target, fingerprint, record, client)
        self._count("convergence", answer.status)
        return answer

    async def _answer_slowly(
        self, target: Target, fingerprint: bytes | None, record: TargetRecord | None,
        client: bytes | None = None,
    ) -> Answer:
        """``answer`` when the cache alone could not: ``record`` is the cached
        one (stale for this query), or None after a cache miss."""
        if record is None:
            record = await self._records.load(target)
        decision = convergence.decide(
            record.timeline if record is not None else None,
            fingerprint,
            now=int(self._clock()),
            fresh_for_s=self._fresh_for_s,
            reprobe_after_s=self._mismatch_reprobe_after_s,
        )
        if decision is not Decision.PROBE:
            self._note_query(target)
            return self._answer_from(record, fingerprint)
        probed = await self.probe_for_query(target, record, client)
        if probed.outcome in (Outcome.OBSERVED, Outcome.RECENT):
            assert probed.record is not None
            return self._answer_from(probed.record, fingerprint)
        answer = self._failed(probed, fingerprint)
        if answer.status == 503:
            await self.failure_deadline(probed)
        return answer

    async def _answer_with_dane(
        self, target: Target, fingerprint: bytes | None, record: TargetRecord | None,
        client: bytes | None,
    ) -> Answer:
        """``answer`` under invariant 10 when the cache alone could not."""
        if record is None:
            record = await self._records.load(target)
        status = None
        if record is not None:
            status = self._dane_status(record, fingerprint, int(self._clock()))
        if status is not None:
            assert record is not None
            self._note_answered(target, record)
            return self._answer_of(record, status)
        probed = await self.probe_for_query(target, record, client)
        if probed.outcome in (Outcome.OBSERVED, Outcome.RECENT):
            assert probed.record is not None
            status = self._dane_status(probed.record, fingerprint, int(self._clock()), final=True)
            assert status is not None
            return self._answer_of(probed.record, status)
        known = probed.record
        decides = self._dane_decides(known, int(self._clock())) if known is not None else None
        if decides is False:
            answer = self._failed(probed, fingerprint)  # the perspective's rules
        elif probed.outcome is Outcome.REFUSED:
            answer = Answer(403, REFUSED_MESSAGE, b"text/plain")
        elif decides and known is not None and known.dane is not None and (
            known.dane.outcome in _DANE_FAILURES
        ):  # DNSSEC failed (the name's own lookup, or beside the failed probe): say so
            answer = self._answer_of(known, CONVERGENCE_STATUS[known.dane.outcome])
        else:
            answer = Answer(503, UNOBSERVED_MESSAGE, b"text/plain")
        if answer.status == 503:
            await self.failure_deadline(probed)
        return answer

    def _answer_from(self, record: TargetRecord | None, fingerprint: bytes | None) -> Answer:
        assert record is not None
        status = convergence.status_of(
            record.timeline, fingerprint, now=int(self._clock()), fresh_for_s=self._fresh_for_s
        )
        return Answer(status, record.convergence_body)

    def _failed(self, probed: ProbeOutcome, fingerprint: bytes | None) -> Answer:
        record = probed.record
        timeline = record.timeline if record is not None else None
        if convergence.status_after_failed_probe(timeline, fingerprint) == 200 and record:
            return Answer(200, record.convergence_body)
        if probed.outcome is Outcome.REFUSED:
            return Answer(403, REFUSED_MESSAGE, b"text/plain")
        return Answer(503, UNOBSERVED_MESSAGE, b"text/plain")

    # -- Perspectives

    async def answer_perspectives(self, target: Target, client: bytes | None = None) -> Answer:
        """The Perspectives answer for ``target``: 200 and the signed XML made
        when its history last changed; 404 for a service never observed, with
        a probe started in the background (the client asks again) when the
        limits allow one; 503 when the store cannot be read and nothing is
        cached.

        Error handling: ``RateLimited`` when the client prefix ``client`` is
        over its query or probe rate (invariant 6)."""
        assert self._perspectives, "Perspectives is not configured"
        self._admit(client)
        try:
            record = await self._records.lookup(target, strict=True)
        except StoreError as exc:
            log.error("store read failed for a Perspectives query: %s", exc)
            self._count("perspectives", 503)
            return Answer(503, b"observation store unavailable\n", b"text/plain")
        if record is None or record.perspectives_body is None or not record.timeline.observations:
            started = self._refresh_in_background(target, client)
            message = b"unknown service; probing it now, ask again\n" if started else (
                b"unknown service; too many probes in progress, ask again later\n"
            )
            self._count("perspectives", 404)
            return Answer(404, message, b"text/plain")
        self._note_query(target)  # invariant 8: answered from an observation
        self._count("perspectives", 200)
        return Answer(200, record.perspectives_body, perspectives.CONTENT_TYPE)

    def _refresh_in_background(self, target: Target, client: bytes | None) -> bool:
        """Start a refresh nobody waits for, admitted by the probe budgets
        (invariant 6; nothing spent when none could start). Raises
        ``RateLimited``."""
        try:
            self._abuse.admit_probe(client, target.key, self._clock())
        except ProbeThrottled:
            return False
        started = self._records.refresh_soon(target)
        if not started:  # the records are full: nothing spent
            self._abuse.refund_probe(target.key)
        return started

    # -- v2

    async def answer_v2_bytes(
        self, request: v2.QueryRequest, client: bytes | None = None
    ) -> bytes:
        """The ``/v2/query`` answer document (for WebSocket ``query``).

        Error handling: as ``answer_v2``."""
        answer = await self._answer_v2(request, client)
        self._count("websocket", answer.status)
        return answer.body

    async def answer_v2(self, request: v2.QueryRequest, client: bytes | None = None) -> Answer:
        """The signed ``/v2/query`` answer: every entry looked up (and probed
        if need be) concurrently, each under the query deadline; one
        envelope signature for the whole request (see ``notary.protocol.v2``).

        Error handling: ``RateLimited`` when the client prefix ``client`` is
        over its query rate, a query costing one per target (invariant 6).
        An entry whose probe the client's probe budget does not cover is
        answered from what is known, unprobed (``unknown`` when nothing)."""
        answer = await self._answer_v2(request, client)
        self._count("v2", answer.status)
        return answer

    async def _answer_v2(self, request: v2.QueryRequest, client: bytes | None) -> Answer:
        signer = self._v2_signer
        assert signer is not None, "v2 is not configured"
        self._admit(client, len(request.targets))
        results: list[v2.QueryResult | None] = [None] * len(request.targets)
        now = int(self._clock())
        waiting = []
        for index, query in enumerate(request.targets):
            # A cache hit that needs no probe is answered here; only the rest
            # get a task (store read, probe) of their own.
            results[index] = self._v2_result_at_once(query, now, client)
            if results[index] is None:
                waiting.append((index, query))

        async def answer_one(index: int, query: v2.TargetQuery) -> None:
            results[index] = await self._v2_result(query, client)

        if waiting:
            async with trio.open_nursery() as nursery:
                for index, query in waiting:
                    nursery.start_soon(answer_one, index, query)
        if self._wait_witnessed is not None:
            await self._wait_witnessed(r.statement for r in results if r is not None)
        body = v2.answer_bytes(
            [r for r in results if r is not None],
            nonce=request.nonce,
            signed_at=int(self._clock()),
            key_id=signer.key_id,
            sign=signer.sign,
        )
        return Answer(200, body, v2.CONTENT_TYPE)

    def _v2_result_at_once(
        self, query: v2.TargetQuery, now: int, client: bytes | None
    ) -> v2.QueryResult | None:
        """The query's result when the cache answers it without a probe
        (counted for the scheduler), else None."""
        target = query.target
        key = target.key
        record = self._cache.get(key)
        if record is None:
            return None
        if self._dane:
            verdict = self._v2_dane_verdict(record, query, now)
            if verdict is None:
                return None
        elif v2.decide(
            record.timeline, query.sha256, query.sha1,
            now=now, fresh_for_s=self._fresh_for_s,
            reprobe_after_s=self._mismatch_reprobe_after_s, spki_sha256=query.spki_sha256,
        ) is Decision.PROBE:
            return None
        else:
            verdict = v2.verdict_of(
                record.timeline, query.sha256, query.sha1, now=now, fresh_for_s=self._fresh_for_s,
                spki_sha256=query.spki_sha256,
            )
        if record.timeline.observations:  # invariant 8: answered from an observation
            self._storage.note_asked(target, key)
            self._rescans.note_query(target, key)
        return self._v2_stated_result(query, record, verdict, now, client)

    def _v2_dane_verdict(
        self, record: TargetRecord, query: v2.TargetQuery, now: int, *, final: bool = False
    ) -> str | None:
        """The v2 verdict under invariant 10 (None: refresh first; ``final``
        as for ``_dane_status``)."""
        decides = self._dane_decides(record, now, final=final)
        if decides is None:
            return v2.VERDICT_UNREACHABLE if final else None
        if not decides:
            if not final and v2.decide(
                record.timeline, query.sha256, query.sha1, now=now,
                fresh_for_s=self._fresh_for_s, reprobe_after_s=self._mismatch_reprobe_after_s,
                spki_sha256=query.spki_sha256,
            ) is Decision.PROBE:
                return None
            return v2.verdict_of(
                record.timeline, query.sha256, query.sha1, now=now, fresh_for_s=self._fresh_for_s,
                spki_sha256=query.spki_sha256,
            )
        dane = record.dane
        assert dane is not None
        outcome = dane.outcome
        if outcome is DaneOutcome.MATCH:
            if query.sha256 is None and query.sha1 is None:
                return v2.VERDICT_UNKNOWN  # nothing submitted to judge (V1), or a key alone (V6)
            vouched = [
                j.sha256 for j in dane.vouched(query.sha256, query.sha1)
                if query.spki_sha256 is None or any(
                    o.certificate.sha256 == j.sha256
                    and o.certificate.spki_sha256 == query.spki_sha256
                    for o in record.timeline.observations
                )
            ]
            if vouched:
                # A match its statement does not back is none to give (V5,
                # S6): the evidence must show the certificate vouched for
                # (not so for a site vouched for by more records than a
                # statement holds), and its observations the certificate
                # (not so for one beyond a statement's 64).
                shown = {dane.leaf_sha256} if not dane.others else v2.stated_vouched(dane)
                stated = {
                    o.certificate.sha256
                    for o in record.timeline.observations[:v2.MAX_STATEMENT_OBSERVATIONS]
                }
                if any(sha256 in shown and sha256 in stated for sha256 in vouched):
                    return v2.VERDICT_MATCH
                return v2.VERDICT_UNKNOWN
            if final or self._probed_within(record, self._mismatch_reprobe_after_s, now):
                return v2.VERDICT_MISMATCH
            return None
        return _V2_DANE_VERDICTS[outcome]

    async def _v2_result(self, query: v2.TargetQuery, client: bytes | None) -> v2.QueryResult:
        """The result of a query ``_v2_result_at_once`` could not answer:
        store read and probe as needed."""
        target = query.target
        record = await self._records.lookup(target)
        now = int(self._clock())
        if self._dane:
            answerable = record is not None and self._v2_dane_verdict(record, query, now)
            decision = Decision.ANSWER if answerable else Decision.PROBE
        else:
            decision = v2.decide(
                record.timeline if record is not None else None, query.sha256, query.sha1,
                now=now, fresh_for_s=self._fresh_for_s,
                reprobe_after_s=self._mismatch_reprobe_after_s, spki_sha256=query.spki_sha256,
            )
        failure = None
        if decision is not Decision.PROBE:
            if record is None or record.timeline.observations:
                self._note_query(target)
        else:
            try:
                probed = await self.probe_for_query(
                    # The v2 entry's ``address`` (issue 31, item 4), once parsed.
                    target, record, client, address_hint=query.address,
                )
            except RateLimited:  # answered from what is known, unprobed; not registered
                record = self._cache.peek(target.key) or record
            else:
                record = probed.record
                failure = _V2_FAILURES.get(probed.outcome)
                if probed.outcome is Outcome.UNREACHABLE:
                    await self.failure_deadline(probed)
        if record is None:
            return v2.QueryResult(target, failure or v2.VERDICT_UNKNOWN)
        if self._dane:
            verdict = self._v2_dane_verdict(record, query, int(self._clock()), final=True)
            assert verdict is not None
            if failure is not None and self._dane_decides(record, now) is not False:
                verdict = failure  # DANE vouches only for what a probe just saw
        else:
            verdict = v2.verdict_of(
                record.timeline, query.sha256, query.sha1, now=now, fresh_for_s=self._fresh_for_s,
                spki_sha256=query.spki_sha256,
            )
        if failure is not None and verdict == v2.VERDICT_UNKNOWN:
            verdict = failure
        return self._v2_stated_result(query, record, verdict, now, client)

    def _v2_stated_result(
        self, query: v2.TargetQuery, record: TargetRecord, verdict: str, now: int,
        client: bytes | None,
    ) -> v2.QueryResult:
        """The result of ``verdict`` on ``record``, with the statement to
        answer with (invariant 11): signed now when the record's signer
        says so, its log entry charged to the client prefix ``client``; a
        match or mismatch its statement does not back is ``unknown``; with
        no statement signed for the client (over its log budget), none."""
        wait = self._abuse.log_wait_s(client, now)
        try:
            statement, cost = record.v2_statement_at(now, may_sign=not wait)
        except StatementRefused:
            if verdict == v2.VERDICT_MATCH or verdict == v2.VERDICT_MISMATCH:
                verdict = v2.VERDICT_UNKNOWN
            return v2.QueryResult(query.target, verdict)
        if cost:
            self._abuse.charge_log(client, now, cost)
        if (verdict == v2.VERDICT_MATCH or verdict == v2.VERDICT_MISMATCH) and not record.stands(
            now
        ):
            verdict = self._stated_verdict(query, record, verdict, now)
        return v2.QueryResult(
            query.target, verdict, statement, v2.matched_by(query, verdict)
        )

    def _stated_verdict(
        self, query: v2.TargetQuery, record: TargetRecord, verdict: str, now: int
    ) -> str:
        """``verdict`` (a match or mismatch judged on ``record``) when the
        statement kept, signed for what the record knew before, backs it
        (V5): its DANE evidence is alike and DANE decides, or what it says
        gives the same verdict; else ``unknown``."""
        stated, _ = record.stated
        if self._dane:
            if not record.dane_as_stated():
                return v2.VERDICT_UNKNOWN
            if self._dane_decides(record, now):
                return verdict
        if stated is None or v2.verdict_of(
            stated, query.sha256, query.sha1, now=now, fresh_for_s=self._fresh_for_s,
            spki_sha256=query.spki_sha256,
        ) != verdict:
            return v2.VERDICT_UNKNOWN
        return verdict

    async def record_of(self, target: Target, client: bytes | None = None) -> TargetRecord | None:
        """What is known of ``target`` for the web page: its cached or
        stored record (None: never observed), without a probe. Costs the
        client prefix ``client`` one query (invariant 6); not counted in
        ``answered`` (no protocol answer is made).

        Error handling: ``RateLimited`` over the client's query rate;
        ``StoreError`` when nothing is cached and the store cannot be read."""
        self._admit(client)
        return await self._records.lookup(target, strict=True)

    def backend_of(self, record: TargetRecord | None) -> str | None:
        """Which backend decides ``record``'s answers now (invariant 10);
        None when DANE is not among the backends (the page says nothing)."""
        if not self._dane:
            return None
        dane = record.dane if record is not None else None
        return deciding_backend(self._backends, dane.outcome if dane is not None else None)

    async def check_now(self, target: Target, client: bytes | None = None) -> str:
        """Probe ``target`` now, however fresh what is known (the web page's
        "check now"), and say how it went: ``"observed"``, ``"refused"``
        (the policy) or ``"unreachable"`` (any other failure, or throttled
        with no observation within the target's probe spacing), as v2
        verdicts say. The probe goes through the same limits as a query's
        (invariant 6: one query, then the client's, the target's and the
        target prefix's probe budgets; joining a probe a query started is
        free) and the query deadline; a failure is answered no sooner than
        invariant 7 says. The outcome is in the cache before this returns.

        Error handling: ``RateLimited`` over the client's query or probe
        rate; probe failures are outcomes, never raised."""
        self._admit(client)
        record = await self._records.lookup(target)
        probed = await self.probe_for_query(target, record, client)
        if probed.outcome is Outcome.UNREACHABLE:
            await self.failure_deadline(probed)
        return _CHECK_OUTCOMES[probed.outcome]
