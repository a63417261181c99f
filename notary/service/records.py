"""Target records: what the notary knows of each target, with its signed
answers, and the one way to learn more: :meth:`Records.refresh`.

A record (``TargetRecord``) is a target's timeline plus the answer of each
protocol, signed on first use and kept (a cache hit costs no signature).
``Records`` finds a target's record in the cache, else in the store (never
for a target the stored-targets filter has never seen), and refreshes it: a
probe of every address of the target (``Prober.probe``: a ``ProbeReport``),
each address sampled several times when the target was seen serving more
than one certificate within ``fresh_for_s`` (``samples_per_address``),
every result merged into the timeline at once (one new record), cached,
queued for the store as one item (one write batch, one change in the
feed) and published to the target's watchers (through the store's change
feed, which also brings what the node's other workers committed:
``apply_change``), once per probe however many callers wait for it. With DANE among the backends a
refresh also checks the target's TLSA records (``notary.service.dane``), in
parallel with the probe, and keeps the verdict on the record
(``TargetRecord.dane``, in memory only: each node checks for itself).
When DNSSEC fails before the probe sees a certificate (the name's own
lookup fails validation or gets no answer, or the probe fails beside a
failed TLSA lookup) that failure's verdict is kept the same way, on a
record without observations when the target has none, so answers say why.
The record it returns says what the probe saw (``last_report``, and
``last_probe``, the result that stands for it: ``ProbeReport.primary``)
and whether it saw something new (``last_probe_changed``: a certificate
outside the target's current set, ``notary.model.observations.is_change``,
so a site serving several certificates is not "changing" at every probe):
callers tell the rescan scheduler themselves, so data goes one way (the
scheduler calls ``refresh``, never the reverse). DANE judges every chain a
probe saw, before the record drops them, and the record keeps a judgement
per certificate of the target's current set (``DaneVerdict.judgements``:
those of the latest probe, and those of the current certificates it did
not see, carried from the verdict before while the TLSA records are the
same: ``DaneVerdict.carrying``), so that each answer judges the certificate
asked about by its own verdict, whichever address answered first.

With a log (docs/log.md; issue 30 item 5), every v2
statement signed is appended for good, so ``RecordSigner`` signs one again
only when needed (``RecordSigner.serve_statement``), keeping the one signed
last, carried from record to record of a target, until then:

1. a target's first statement (none kept), and a renewal (it expires within
   ``[v2] renew_before_s``), are always signed;
2. one that differs from the target's observations by sightings only (the
   same certificates and first sightings, later last sightings and other
   addresses: ``v2.sightings_deadline``) stands while each sighting it
   leaves out is more recent than ``SIGHTINGS_LAG_SHARE`` of ``[answers]
   fresh_for_s``: until then it gives every verdict a new one would, so a
   stable target probed often costs no entry per probe (a DANE verdict
   made again with the same outcome, records (in whatever order the
   resolver gave them) and judged certificates is a sighting too);
3. any other change (a new certificate, one dropped, a new DANE outcome)
   and a sightings change past its lag is signed when the target's budget
   allows (``[log] statements_per_target_per_hour``, a token bucket per
   target of that many tokens an hour and as many at most, in a table of
   ``[limits] max_tracked``), and when the client whose query needs it is
   not over its log budget (``may_sign``); otherwise the statement signed
   last is served, and the query service judges verdicts by what it says
   (V5: ``TargetRecord.stands``, ``TargetRecord.stated``).

Another worker's change drops the cached record (``apply_change``); its
statement is kept aside (``MAX_CARRIED_STATEMENTS``, ``MAX_CARRIED_BYTES``)
for the record loaded again, so workers follow these rules too.

Resource handling: ``Records`` is an async context manager that owns a
nursery in which every refresh runs, never in a caller's task: a caller that
stops waiting (its own deadline) does not stop the refresh, whose probe is
still merged. Leaving the context manager cancels refreshes in progress;
their waiters get a ``ProbeError``. ``Records`` borrows the cache, the store
writer, the stored-targets filter, the prober and the watch hub.

Error handling: a failed probe is the refresh's ``ProbeError`` (each waiter
gets its own copy); a store read failure is logged and treated as "nothing
known" (or raised, ``strict``); an unexpected exception while merging is
logged, and the waiters get the record merged in memory.
"""

from __future__ import annotations

import copy
import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import trio

from notary.config import V2Config
from notary.errors import (
    ProbeError,
    ProbeRefused,
    ProbeResolverFailed,
    ProbeThrottled,
    StoreError,
)
from notary.model.dane import DaneVerdict, DnssecStatus, TlsaLookup, deciding_backend
from notary.model.observations import (
    ProbeReport,
    ProbeResult,
    Timeline,
    TimelineLimits,
    is_change,
    samples_per_address,
)
from notary.model.ratelimit import TokenBuckets
from notary.model.targets import Target
from notary.outbound.probe import Prober
from notary.outbound.writer import Storage
from notary.protocol import convergence, http, perspectives, v2
from notary.protocol.v2.evidence import verification
from notary.service.claims import NodeProber, Probed
from notary.service.dane import FAILED, DaneChecker, needs_chain
from notary.service.stored_targets import StoredTargets
from notary.service.watch import WatchHub
from notary.state.cache import LRUCache
from notary.state.crypto import ConvergenceSigner, Ed25519Signer, PerspectivesSigner
from notary.state.feed import Change

__all__ = [
    "BACKGROUND_REFRESHES_PER_PROBE_SLOT", "SIGHTINGS_LAG_SHARE", "RecordSigner", "Records",
    "RecordsStatistics", "StatementRefused", "TargetRecord",
]

log = logging.getLogger(__name__)

#: Background refreshes (:meth:`Records.refresh_soon`) start only while fewer
#: than this many times the prober's ``max_concurrent`` refreshes run.
BACKGROUND_REFRESHES_PER_PROBE_SLOT = 4

#: Probe failures after which the TLSA lookup beside the probe is not waited
#: for: the policy refused the target, it was throttled, or the name's own
#: lookup already said how DNSSEC failed.
_NOT_WAITING_FOR_TLSA = (ProbeRefused, ProbeThrottled, ProbeResolverFailed)

#: Rough per-record bytes beyond the bodies and certificates (objects, hashes).
RECORD_OVERHEAD_BYTES = 512
#: What the latest probe's report adds to a record, per handshake result
#: and per failed address (small objects sharing the timeline's
#: certificates; the chains are left out).
REPORT_BYTES_PER_RESULT = 128
REPORT_BYTES_PER_FAILURE = 96
#: Upper estimates of a fully signed record's answers (every protocol, the
#: four Convergence responses): per certificate observed, per run of one,
#: and for the rest (signatures, headers; plus the host name's length).
#: ``tests/test_query_fastpath.py`` checks them against real answers.
#: The v2 statement's ``consistency`` (docs/v2.md, S8) adds to both: a
#: current certificate's hash and its addresses once more, and the
#: member's frame (96 and 64 of the figures below).
SIGNED_BYTES_PER_OBSERVATION = 1248
SIGNED_BYTES_PER_RUN = 48
SIGNED_BYTES_BASE = 3136
#: What a logged statement's inclusion adds to the record (the answer's
#: entry with its proof and checkpoint: a proof of up to 40 hashes in
#: base64, a signed note; rule S7).
LOGGED_STATEMENT_BYTES = 2304
#: The same for a DANE verdict's evidence in the v2 statement: its base, and
#: per TLSA record (twice its data, as hex); per certificate judged beyond
#: the first (a site serving several: its judgement in memory, about 190
#: bytes with its match, and its entry of the statement's ``judged``, 94
#: bytes in the statement's bytes and again in its answer entry, docs/v2.md
#: S6; ``tests/test_query_fastpath.py`` measures it).
DANE_EVIDENCE_BYTES = 256
DANE_EVIDENCE_BYTES_PER_RECORD = 16
DANE_EVIDENCE_BYTES_PER_JUDGEMENT = 384
#: What a record carrying a statement signed for an earlier timeline keeps
#: of that timeline, per observation (``v2.stated_timeline``: hashes and
#: times, sharing the hashes' bytes with the certificates).
STATED_BYTES_PER_OBSERVATION = 256

#: Rule 2 of the module docstring: a statement that differs from the
#: target's observations by sightings only stands while each sighting it
#: leaves out is within this share of ``[answers] fresh_for_s`` (a quarter
#: of a day at the default: a stable target probed often costs about four
#: entries a day, each verdict the same as a new statement's).
SIGHTINGS_LAG_SHARE = 0.25
#: Statements of records another worker's change dropped, kept for the
#: record loaded again: at most this many, and bytes.
MAX_CARRIED_STATEMENTS = 4096
MAX_CARRIED_BYTES = 8 * 1024 * 1024
#: Seconds per hour (``statements_per_target_per_hour``).
HOUR_S = 3600.0


class StatementRefused(Exception):
    """A first statement for a target was needed and its client may not
    sign one now (over its log budget): the caller answers without one."""


class RecordSigner:
    """Makes a timeline's signed answer for each protocol served; shared by
    the records of one ``QueryService`` (and owned by it).

    Error handling: a signer's exception propagates (a broken key is a bug
    the first query shows, not something to answer around)."""

    __slots__ = ("_backends", "_budget", "_clock", "_convergence", "_fresh_for_s", "_lag_s", "_log",
                 "_perspectives", "_v2", "_v2_config", "deferred_client", "deferred_target",
                 "logged_bytes", "refused_client", "statements_signed")

    def __init__(
        self,
        convergence_signer: ConvergenceSigner,
        perspectives_signer: PerspectivesSigner | None,
        v2_signer: Ed25519Signer | None,
        v2_config: V2Config,
        clock: Callable[[], float],
        backends: tuple[str, ...] = ("perspective",),
        log: StatementLog | None = None,
        *,
        fresh_for_s: int = 86400,
        statements_per_target_per_hour: float = 0.0,
        max_tracked: int = 16384,
    ) -> None:
        self._convergence = convergence_signer
        #: The transparency log every v2 statement goes to (None: none kept).
        self._log = log
        self._perspectives = perspectives_signer
        self._v2 = v2_signer
        self._v2_config = v2_config
        self._clock = clock
        #: ``[verify] backends``: with DANE among them, statements say which
        #: backend decided, with the DANE evidence (rule S6).
        self._backends = backends
        #: Rule 2: how far behind a statement's sightings may be.
        self._lag_s = int(fresh_for_s * SIGHTINGS_LAG_SHARE)
        #: What the statements' consistency calls current (docs/v2.md, S8).
        self._fresh_for_s = fresh_for_s
        #: Rule 3: statements per target (None: no budget).
        per_hour = statements_per_target_per_hour
        self._budget = (
            TokenBuckets(per_hour / HOUR_S, max(1.0, per_hour), max_entries=max_tracked)
            if per_hour > 0 else None
        )
        #: v2 statements signed, and the bytes of their log entries.
        self.statements_signed = 0
        self.logged_bytes = 0
        #: Statements not signed again (rule 3): for the target's budget,
        #: for the client's; first statements refused for the client's.
        self.deferred_target = 0
        self.deferred_client = 0
        self.refused_client = 0

    @property
    def budget_entries(self) -> int:
        """Targets in the budget's table."""
        return len(self._budget) if self._budget is not None else 0

    @property
    def logs(self) -> bool:
        """Whether the v2 statements it signs go to a log (and carry an inclusion)."""
        return self._log is not None and self._v2 is not None

    def convergence_body(self, timeline: Timeline) -> bytes:
        payload = convergence.signed_payload(convergence.entries_of(timeline))
        return convergence.answer_body(payload, self._convergence.sign(payload))

    def perspectives_body(self, timeline: Timeline) -> bytes | None:
        """The signed Perspectives XML; None when Perspectives is not served."""
        if self._perspectives is None:
            return None
        keys = perspectives.keys_of(timeline)
        blob = perspectives.signed_blob(perspectives.service_id(timeline.target), keys)
        return perspectives.reply_xml(keys, self._perspectives.sign(blob))

    def v2_statement(
        self, timeline: Timeline, dane: DaneVerdict | None = None
    ) -> v2.SignedStatement | None:
        """The v2 statement, signed now, with the evidence of ``dane`` (the
        target's DANE verdict) when DANE is among the backends; None when v2
        is not served."""
        signer = self._v2
        if signer is None:
            return None
        evidence = None
        if "dane" in self._backends:
            backend = deciding_backend(self._backends, dane.outcome if dane else None)
            evidence = verification(backend, dane)
        signed_at = int(self._clock())
        statement_log = self._log
        made = v2.statement(
            timeline,
            key_id=signer.key_id,
            signed_at=signed_at,
            valid_for_s=self._v2_config.statement_valid_for_s,
            verification=evidence,
            log=statement_log.promise(signed_at) if statement_log is not None else None,
            fresh_for_s=self._fresh_for_s,
        )
        signed = v2.sign_statement(made, signer.sign)
        if statement_log is not None:
            statement_log.submit(signed)
        return signed

    def serve_statement(
        self, record: TargetRecord, now: int, *, may_sign: bool = True
    ) -> tuple[v2.SignedStatement | None, int]:
        """The v2 statement ``record`` answers with at ``now`` (None: v2 is
        not served), signed now when the rules of the module docstring say
        so, and the bytes of the log entry signing it appended (0: none
        signed, or no log). ``may_sign`` False: the client asking is over
        its log budget: a change is not signed (rule 3), a first statement
        raises ``StatementRefused``; a renewal is signed whatever it says.

        Error handling: ``StatementRefused``; the log's ``LogBacklogged``
        (503) from ``submit``."""
        statement = record._v2_statement
        if statement is None:
            return None, 0
        if statement is _UNSIGNED:
            if self._v2 is None:
                record._v2_statement = None
                return None, 0
            if not may_sign and self.logs:
                self.refused_client += 1
                raise StatementRefused("the client is over its log budget")
            return self._sign(record)
        if v2.statement_due(statement, now=now, renew_before_s=self._v2_config.renew_before_s):
            return self._sign(record)
        if record._v2_stated is record.timeline and record._v2_dane is record.dane:
            return statement, 0
        if not self.logs:
            return self._sign(record)  # not logged: signed for every change, as ever
        if record.stands(now):
            return statement, 0
        if not may_sign:
            self.deferred_client += 1
            return statement, 0
        budget = self._budget
        if budget is not None and budget.take(record.timeline.target.key, now):
            self.deferred_target += 1
            return statement, 0
        return self._sign(record)

    def _sign(self, record: TargetRecord) -> tuple[v2.SignedStatement, int]:
        """Sign ``record``'s statement now and keep it on the record."""
        signed = self.v2_statement(record.timeline, record.dane)
        assert signed is not None
        record._v2_statement = signed
        record._v2_stated = record.timeline
        record._v2_dane = record.dane
        record._v2_stands_until = None
        self.statements_signed += 1
        cost = len(signed.entry) if self.logs else 0
        self.logged_bytes += cost
        return signed, cost

    def stands_until(self, record: TargetRecord) -> float:
        """Until when ``record``'s statement, signed for another timeline or
        DANE verdict, gives the verdicts a new one would (rule 2; -inf: it
        does not)."""
        if _dane_substance(record._v2_dane) != _dane_substance(record.dane):
            return -math.inf
        stated = record._v2_stated
        if stated is None:  # nothing signed yet: nothing stands
            return -math.inf
        deadline = v2.sightings_deadline(stated, record.timeline, self._lag_s)
        return -math.inf if deadline is None else deadline

    def now(self) -> int:
        return int(self._clock())


class StatementLog(Protocol):
    """Where signed v2 statements go to be logged
    (``notary.outbound.logappender.LogAppender``)."""

    def promise(self, signed_at: int) -> dict[str, object]:
        """The ``log`` member of a statement signed at ``signed_at`` (rule S7)."""

    def submit(self, signed: v2.SignedStatement) -> None:
        """Queue ``signed``; a ``ProtocolError`` (503) when the log is backlogged."""


#: Not signed yet (``TargetRecord``'s lazily made answers).
_UNSIGNED: Any = object()


class TargetRecord:
    """What the cache holds for a target: its timeline and, made on first
    use and kept, the signed answer of each protocol (invariant 2).

    A probe that changes the timeline makes a new record and signs nothing:
    the first query of each protocol signs once for it. Rescans of targets
    nobody asks about, and the protocols a target is not asked in, cost no
    signature. ``size`` is fixed at construction: an upper estimate of the
    record fully signed (the cache's byte accounting cannot drift as answers
    are made)."""

    __slots__ = (
        "_convergence_body",
        "_http_responses",
        "_perspectives_body",
        "_signer",
        "_v2_dane",
        "_v2_stands_until",
        "_v2_stated",
        "_v2_statement",
        "dane",
        "last_probe",
        "last_probe_changed",
        "last_report",
        "size",
        "timeline",
    )

    def __init__(
        self, timeline: Timeline, signer: RecordSigner, carried: TargetRecord | None = None,
    ) -> None:
        self.timeline = timeline
        #: The latest probe's report: every handshake's result, every
        #: address probed, the failures; the chains left out and the leaves
        #: the timeline's own (the cache's byte accounting counts no chain).
        #: None: not probed since loaded.
        self.last_report: ProbeReport | None = None
        #: The result that stands for the latest probe
        #: (``last_report.primary``), for who needs one (the scheduler).
        self.last_probe: ProbeResult | None = None
        #: Whether the latest probe saw a certificate outside the target's
        #: current set before it (``notary.model.observations.is_change``;
        #: False for a target's first probe).
        self.last_probe_changed = False
        #: The DANE verdict on the latest probe: a judgement per certificate
        #: it saw, and per certificate of the current set it did not see
        #: whose judgement on the same records was kept (None: DANE is not
        #: among the backends, or the target was not probed since it was
        #: loaded).
        self.dane: DaneVerdict | None = None
        self._signer = signer
        self._convergence_body: bytes = _UNSIGNED
        self._http_responses: tuple[bytes, bytes, bytes, bytes] = _UNSIGNED
        self._perspectives_body: bytes | None = _UNSIGNED
        self._v2_statement: v2.SignedStatement | None = _UNSIGNED
        #: What the statement was signed for: the timeline (this record's
        #: own, or what a statement of an earlier one says:
        #: ``v2.stated_timeline``) and the DANE verdict; and, when they are
        #: not this record's, until when the statement stands for it (None:
        #: not worked out yet).
        self._v2_stated: Timeline | None = None
        self._v2_dane: DaneVerdict | None = None
        self._v2_stands_until: float | None = None
        observations = timeline.observations
        self.size = (
            sum(len(o.certificate.der) + SIGNED_BYTES_PER_RUN * len(o.runs) for o in observations)
            + SIGNED_BYTES_PER_OBSERVATION * len(observations)
            + SIGNED_BYTES_BASE + 3 * len(timeline.target.host) + RECORD_OVERHEAD_BYTES
            + (LOGGED_STATEMENT_BYTES if signer.logs else 0)
        )
        if carried is not None and signer.logs:
            self._carry(carried)

    def _carry(self, earlier: TargetRecord | _Carried) -> None:
        """Keep the statement ``earlier`` (a record of the same target, or
        what was kept of one) was answering with, to serve until the
        signer's rules say to sign again."""
        statement = earlier._v2_statement
        if statement is _UNSIGNED or statement is None:
            return
        stated = earlier._v2_stated
        if isinstance(earlier, TargetRecord) and stated is earlier.timeline:
            stated = v2.stated_timeline(earlier.timeline)
        assert stated is not None
        self._v2_statement = statement
        self._v2_stated = stated
        self._v2_dane = earlier._v2_dane
        self.size += (
            STATED_BYTES_PER_OBSERVATION * len(stated.observations) + _dane_bytes(self._v2_dane)
        )

    @property
    def convergence_body(self) -> bytes:
        body = self._convergence_body
        if body is _UNSIGNED:
            body = self._convergence_body = self._signer.convergence_body(self.timeline)
        return body

    @property
    def http_responses(self) -> tuple[bytes, bytes, bytes, bytes]:
        """The complete Convergence HTTP responses carrying
        ``convergence_body``, made once: indexed by ``response_index``."""
        responses = self._http_responses
        if responses is _UNSIGNED:
            body = self.convergence_body
            responses = self._http_responses = tuple(  # type: ignore[assignment]
                http.response(
                    status, body, content_type=convergence.CONTENT_TYPE, keep_alive=alive
                )
                for status in (200, 409)
                for alive in (False, True)
            )
        return responses

    @property
    def perspectives_body(self) -> bytes | None:
        """The signed Perspectives XML (None: Perspectives is not served)."""
        body = self._perspectives_body
        if body is _UNSIGNED:
            body = self._perspectives_body = self._signer.perspectives_body(self.timeline)
        return body

    @property
    def v2_statement(self) -> v2.SignedStatement | None:
        """The v2 statement to answer with now (None: v2 is not served):
        ``v2_statement_at`` with the signer's clock, for nobody's query."""
        return self._signer.serve_statement(self, self._signer.now())[0]

    def v2_statement_at(
        self, now: int, *, may_sign: bool = True
    ) -> tuple[v2.SignedStatement | None, int]:
        """The v2 statement to answer with at ``now`` and the log bytes
        signing it cost (``RecordSigner.serve_statement``, which see)."""
        return self._signer.serve_statement(self, now, may_sign=may_sign)

    def stands(self, now: int) -> bool:
        """Whether the statement kept (signed) gives at ``now`` every
        verdict one signed for this record would: it was signed for it, or
        differs by sightings within their lag (rule 2). Otherwise verdicts
        are judged by what it says (``stated``)."""
        if self._v2_stated is self.timeline and self._v2_dane is self.dane:
            return True
        until = self._v2_stands_until
        if until is None:
            until = self._v2_stands_until = self._signer.stands_until(self)
        return now < until

    def dane_as_stated(self) -> bool:
        """Whether the statement kept carries evidence of a DANE verdict
        alike to this record's (but when it was checked)."""
        return _dane_substance(self._v2_dane) == _dane_substance(self.dane)

    @property
    def stated(self) -> tuple[Timeline | None, DaneVerdict | None]:
        """What the statement kept says: the observations (as
        ``v2.stated_timeline``, or this record's timeline) and the DANE
        verdict it carries evidence of; ``(None, None)`` before one is signed."""
        return self._v2_stated, self._v2_dane

    def signed_bytes(self) -> int:
        """Bytes of the answers made so far (what ``size`` estimates)."""
        total = 0
        if self._convergence_body is not _UNSIGNED:
            total += len(self._convergence_body)
        if self._http_responses is not _UNSIGNED:
            total += sum(len(r) for r in self._http_responses)
        if self._perspectives_body not in (_UNSIGNED, None):
            total += len(self._perspectives_body)
        if self._v2_statement not in (_UNSIGNED, None):
            total += len(v2.answer_item(self._v2_statement))
        return total

    def _copy(self) -> TargetRecord:
        made = TargetRecord.__new__(TargetRecord)
        for name in TargetRecord.__slots__:
            setattr(made, name, getattr(self, name))
        return made

    def with_probe(
        self, report: ProbeReport, changed: bool, dane: DaneVerdict | None = None
    ) -> TargetRecord:
        """This record (answers made so far included) as made by the probe
        ``report`` (``last_report``, ``last_probe``, ``last_probe_changed``)
        and the DANE verdict ``dane`` on it, if one was made (the v2
        statement, which carries its evidence, is then signed again on use)."""
        made = self._copy()
        kept = _compact(report, self.timeline)
        earlier = self.last_report
        made.last_report = kept
        made.last_probe = kept.primary
        made.last_probe_changed = changed
        made.size += _report_bytes(kept) - _report_bytes(earlier)
        if dane is not None:
            made._judged(dane)
        return made

    def with_dane(self, dane: DaneVerdict) -> TargetRecord:
        """This record with the DANE verdict ``dane`` made without a probe
        (a DNSSEC failure: ``DaneChecker.failed``); its v2 statement, which
        carries the evidence, is signed again on use."""
        made = self._copy()
        made._judged(dane)
        return made

    def _judged(self, dane: DaneVerdict) -> None:
        """Take ``dane`` as this (new, copied) record's DANE verdict."""
        earlier = self.dane
        self.dane = dane
        self._v2_stands_until = None
        self.size += _dane_bytes(dane) - _dane_bytes(earlier)
        if self._v2_dane is not None and self._v2_dane is earlier:
            # The statement kept carries the evidence of the verdict
            # before until signed again: counted apart from now on.
            self.size += _dane_bytes(self._v2_dane)


class _Carried:
    """What ``Records`` keeps of a dropped record for the one loaded again:
    its statement and what that says (``TargetRecord._carry``)."""

    __slots__ = ("_v2_dane", "_v2_stated", "_v2_statement", "size")

    def __init__(self, record: TargetRecord) -> None:
        self._v2_statement = record._v2_statement
        stated = record._v2_stated
        if stated is record.timeline:
            stated = v2.stated_timeline(record.timeline)
        self._v2_stated = stated
        self._v2_dane = record._v2_dane
        statement = record._v2_statement
        entry = len(statement.entry) if isinstance(statement, v2.SignedStatement) else 0
        observations = len(stated.observations) if stated is not None else 0
        self.size = (
            2 * entry + LOGGED_STATEMENT_BYTES + STATED_BYTES_PER_OBSERVATION * observations
            + _dane_bytes(record._v2_dane)
        )


def _dane_substance(dane: DaneVerdict | None) -> tuple | None:
    """What a statement says of ``dane`` but when it was checked: two
    verdicts alike in this give the same answers (rule 2): the outcome, the
    records, and each certificate judged with the record that vouched for
    it (whatever the order its probe saw the certificates in, or the
    resolver gave the records in: unbound rotates an RRset)."""
    if dane is None:
        return None
    judged = frozenset(
        (j.sha256, j.matched.record if j.matched is not None else None) for j in dane.judgements
    )
    return (dane.outcome, dane.lookup.status, frozenset(dane.lookup.records), judged)


def _compact(report: ProbeReport, timeline: Timeline) -> ProbeReport:
    """``report`` as a record keeps it: no chains, each leaf the timeline's
    own certificate object (one DER in memory), or without its DER when the
    timeline does not hold it."""
    certificates = {o.certificate.sha256: o.certificate for o in timeline.observations}
    results = []
    for result in report.results:
        leaf = certificates.get(result.leaf.sha256)
        if leaf is None:
            leaf = replace(result.leaf, der=b"")
        results.append(replace(result, leaf=leaf, chain=()))
    return replace(report, results=tuple(results))


def _report_bytes(report: ProbeReport | None) -> int:
    """What ``report`` adds to a record's size (0: none)."""
    if report is None:
        return 0
    return (
        REPORT_BYTES_PER_RESULT * len(report.results)
        + REPORT_BYTES_PER_FAILURE * len(report.failures)
    )


def _dane_bytes(dane: DaneVerdict | None) -> int:
    """What ``dane``'s evidence adds to a record's size (0: none)."""
    if dane is None:
        return 0
    data = sum(len(record.data) for record in dane.lookup.records)
    return (
        DANE_EVIDENCE_BYTES + 2 * data
        + DANE_EVIDENCE_BYTES_PER_RECORD * len(dane.lookup.records)
        + DANE_EVIDENCE_BYTES_PER_JUDGEMENT * len(dane.others)
    )


@dataclass(frozen=True, slots=True)
class RecordsStatistics:
    """``refreshes``: refreshes started; ``coalesced``: ``refresh`` calls
    that joined the refresh already running for their target; ``running``:
    refreshes running now. The v2 statements (``RecordSigner``): signed,
    the bytes of their log entries, not signed again for the target's
    budget and for the client's, first ones refused for the client's;
    targets in the budget's table; statements kept aside for records
    dropped (``carried``)."""

    refreshes: int
    coalesced: int
    running: int
    statements_signed: int = 0
    logged_bytes: int = 0
    deferred_target: int = 0
    deferred_client: int = 0
    refused_client: int = 0
    budget_entries: int = 0
    carried: int = 0


@dataclass(slots=True)
class _Refresh:
    """One running refresh and what its waiters need."""

    done: trio.Event = field(default_factory=trio.Event)
    record: TargetRecord | None = None
    error: ProbeError | None = None


class Records:
    """The records of every target; see the module docstring. Refreshes
    need it entered (``async with Records(...) as records``)."""

    def __init__(
        self,
        *,
        cache: LRUCache,
        storage: Storage,
        stored: StoredTargets,
        signer: RecordSigner,
        prober: Prober,
        merge_window_s: int,
        timeline_limits: TimelineLimits | None,
        max_background: int,
        watch_hub: WatchHub | None = None,
        node_prober: NodeProber | None = None,
        dane: DaneChecker | None = None,
        fresh_for_s: int = 86400,
        samples_per_address: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._nursery: trio.Nursery | None = None
        #: ``[answers] fresh_for_s``: a target's current set (what a change
        #: is judged against, and whether its probes sample).
        self._fresh_for_s = fresh_for_s
        #: ``[probe] samples_per_address``: handshakes per address at most
        #: for a target seen serving several certificates lately.
        self._samples_per_address = samples_per_address
        #: Unix time, for the sampling decision (the signer's by default).
        self._clock = clock if clock is not None else signer.now
        self._exit_stack = AsyncExitStack()
        self._cache = cache
        self._storage = storage
        self._stored = stored
        self._signer = signer
        self.prober = prober
        #: Probes once per node when the store is shared (None: one process).
        self._node_prober = node_prober
        #: Checks TLSA records beside each probe (None: DANE is not a backend).
        self.dane = dane
        self._merge_window_s = merge_window_s
        self._timeline_limits = timeline_limits
        self._max_background = max_background
        self._watch_hub = watch_hub
        self._refreshes: dict[Target, _Refresh] = {}
        self._started = 0
        self._coalesced = 0
        #: Statements of records another worker's change dropped, by target
        #: key, oldest first, for the record loaded again (bounded:
        #: ``MAX_CARRIED_STATEMENTS``, ``MAX_CARRIED_BYTES``).
        self._carried: OrderedDict[str, _Carried] = OrderedDict()
        self._carried_bytes = 0

    async def __aenter__(self) -> Records:
        if self._nursery is not None:
            raise RuntimeError("these Records are open already")
        self._nursery = await self._exit_stack.enter_async_context(trio.open_nursery())
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        return await self._exit_stack.__aexit__(*exc_info)

    def make(self, timeline: Timeline, earlier: TargetRecord | None = None) -> TargetRecord:
        """A record of ``timeline``; nothing is signed yet. With a log, the
        v2 statement of ``earlier`` (the target's record before) is kept
        for it until the signer's rules say to sign again."""
        return TargetRecord(timeline, self._signer, carried=earlier)

    def statistics(self) -> RecordsStatistics:
        signer = self._signer
        return RecordsStatistics(
            self._started, self._coalesced, len(self._refreshes),
            statements_signed=signer.statements_signed, logged_bytes=signer.logged_bytes,
            deferred_target=signer.deferred_target, deferred_client=signer.deferred_client,
            refused_client=signer.refused_client, budget_entries=signer.budget_entries,
            carried=len(self._carried),
        )

    async def lookup(self, target: Target, *, strict: bool = False) -> TargetRecord | None:
        """The cached or stored record of ``target`` (None: never observed).
        A store read failure is logged and treated as "nothing known", or
        raised as ``StoreError`` when ``strict``."""
        record = self._cache.get(target.key)
        if record is not None:
            return record
        return await self.load(target, strict=strict)

    async def load(self, target: Target, *, strict: bool = False) -> TargetRecord | None:
        """``lookup`` after a cache miss: the stored record, cached on the
        way; a record cached meanwhile (a refresh finished) is kept, being
        at least as new."""
        if not self._stored.may_contain(target.key):
            return None
        try:
            timeline = await self._storage.load_timeline(target)
        except StoreError as exc:
            if strict:
                raise
            log.error("store read failed, answering from probes: %s", exc)
            return None
        if not timeline.observations:
            return None
        cached = self._cache.peek(target.key)
        if cached is not None:
            return cached
        record = self.make(timeline)
        carried = self._carried.pop(target.key, None)
        if carried is not None:
            self._carried_bytes -= carried.size
            record._carry(carried)
        self._cache.put(target.key, record, record.size)
        return record

    async def refresh(
        self, target: Target, *, address_hint: str | None = None
    ) -> TargetRecord:
        """Probe ``target`` now and return its record with what the probe
        saw (``last_report``, ``last_probe``). Joins the refresh already
        running for ``target``, if any. Cancelling the caller stops only its
        wait.

        ``address_hint``: the address a client's own connection reached,
        added to the probe when the prober's rule allows it
        (``notary.outbound.probe``, rule 5); a refresh joined as it runs
        keeps the addresses it probes (the hint is not added to it).

        Error handling: the probe's ``ProbeError`` (a copy per caller), a
        plain ``ProbeError`` for anything else the refresh raised (a bug,
        logged with its traceback: it ends that refresh, never the
        records); ``RuntimeError`` unless the records are open."""
        running = self._refreshes.get(target)
        if running is None:
            running = self._start(target, () if address_hint is None else (address_hint,))
        else:
            self._coalesced += 1
        await running.done.wait()
        if running.record is not None:
            return running.record
        assert running.error is not None
        raise copy.copy(running.error) from None

    def refresh_soon(self, target: Target) -> bool:
        """Start a refresh of ``target`` in the background (or join the one
        running) without waiting for it. Returns False, starting nothing,
        when ``max_background`` refreshes already run (callers that never
        wait cannot pile up tasks)."""
        if target in self._refreshes:
            self._coalesced += 1
            return True
        if len(self._refreshes) >= self._max_background:
            return False
        self._start(target)
        return True

    def _start(self, target: Target, hints: tuple[str, ...] = ()) -> _Refresh:
        running = _Refresh()
        if self._nursery is None:
            raise RuntimeError("Records used before it was entered")
        # start_soon first: it raises RuntimeError once the nursery is closed
        self._nursery.start_soon(self._run, target, running, hints, name=f"refresh {target}")
        self._refreshes[target] = running
        self._started += 1
        return running

    async def _run(self, target: Target, running: _Refresh, hints: tuple[str, ...]) -> None:
        try:
            # The cached record decides the sampling (a query looked it up
            # and cached it; one not cached is probed once per address):
            # no store read before the probe.
            known = self._cache.peek(target.key)
            samples = samples_per_address(
                known.timeline if known is not None else None, int(self._clock()),
                self._fresh_for_s, self._samples_per_address,
            )
            dane = None
            if self.dane is None:
                probed = await self._probe(target, samples, hints)
            else:
                probed, dane = await self._probe_and_check(target, self.dane, samples, hints)
            report = probed.report
            try:
                running.record = await self._merge(report, stored=probed.stored, dane=dane)
            except Exception:
                log.exception("merging the probe of %s failed", target)
                running.record = self._merged_in_memory(report, dane)
        except ProbeError as exc:
            running.error = exc
        except Exception:
            # A bug in one target's refresh (its DANE check, say) fails that
            # refresh only, never the records every query shares.
            log.exception("refreshing %s failed unexpectedly", target)
            running.error = ProbeError("refresh failed")
        finally:
            if running.record is None and running.error is None:  # cancelled: closing
                running.error = ProbeError("notary is shutting down")
            if self._refreshes.get(target) is running:
                del self._refreshes[target]
            running.done.set()

    async def _probe(
        self, target: Target, samples: int = 1, hints: tuple[str, ...] = ()
    ) -> Probed:
        if self._node_prober is not None:
            return await self._node_prober.probe(
                target, samples_per_address=samples, extra_addresses=hints
            )
        return Probed(await self.prober.probe(
            target, samples_per_address=samples, extra_addresses=hints
        ))

    async def _probe_and_check(
        self, target: Target, checker: DaneChecker, samples: int = 1,
        hints: tuple[str, ...] = (),
    ) -> tuple[Probed, DaneVerdict]:
        """The probe and, at the same time, the TLSA lookup; the verdict on
        every chain the probe saw (each certificate of a site serving
        several at once judged on its own). Another worker's probe (its
        leaves only) for a certificate of which DANE-TA might vouch through
        the chain is made again here.

        Error handling: the probe's ``ProbeError``. When DNSSEC failed
        first (the name's own addresses failed validation or got no answer
        from the resolvers: ``ProbeResolverFailed``; or the probe failed
        and the TLSA lookup, waited for, failed too), that failure's verdict
        is counted and kept on the target's record before the error is
        raised (``_keep_failure``), so the answers say why."""
        found: list[TlsaLookup] = []

        async def look_up() -> None:
            found.append(await checker.lookup(target))

        failed: ProbeError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(look_up)
            try:
                probed = await self._probe(target, samples, hints)
            except ProbeError as exc:  # raised past the nursery, not in a group
                failed = exc
                if isinstance(exc, _NOT_WAITING_FOR_TLSA):
                    nursery.cancel_scope.cancel()
                # else the lookup (bounded by [dns] timeout_s) may say why
        if failed is not None:
            status = None
            if isinstance(failed, ProbeResolverFailed):
                status = DnssecStatus(failed.dnssec)
            elif found and found[0].status in FAILED:
                status = found[0].status
            if status is not None:
                await self._keep_failure(target, checker.failed(target, status))
            raise failed
        judged = checker.judge(found[0], probed.report)
        if needs_chain(judged, probed.report):
            probed = Probed(await self.prober.probe(
                target, samples_per_address=samples, extra_addresses=hints
            ))
            judged = checker.judge(found[0], probed.report)
        return probed, judged

    async def _keep_failure(self, target: Target, failure: DaneVerdict) -> None:
        """Keep the DNSSEC failure's verdict ``failure`` on ``target``'s
        record (cached, or read from the store; one with no observation
        when there is none: the target may never have been observed), so
        that the answers until its reuse time say why, without probing
        again. An unexpected exception is logged: the caller raises the
        probe's error all the same."""
        try:
            record = await self.lookup(target)
            if record is None:
                record = self.make(Timeline(target))
            record = record.with_dane(failure)
            self._cache.put(target.key, record, record.size)
        except Exception:
            log.exception("keeping the DANE failure of %s failed", target)

    async def _merge(
        self, report: ProbeReport, *, stored: bool = False, dane: DaneVerdict | None = None
    ) -> TargetRecord:
        """Merge ``report`` (every result) into the target's record (a new
        record only if the timeline changed: nothing is signed here), with
        the DANE verdict ``dane`` on it (carrying the judgements of the
        verdict before on current certificates the probe did not see),
        cache it and queue its sightings for the store as one item (one
        batch, one change in the feed, which tells the watchers) unless
        they are ``stored`` already (another worker's probe)."""
        target = report.target
        record = await self.lookup(target)
        old = record.timeline if record is not None else Timeline(target)
        timeline = old.merged(report, self._merge_window_s, self._timeline_limits)
        changed = is_change(old, report, self._fresh_for_s)
        dane = self._carried_dane(dane, record, timeline, report)
        if record is None or timeline != old:
            record = self.make(timeline, record)
        record = record.with_probe(report, changed, dane)
        self._cache.put(target.key, record, record.size)
        self._stored.add(target.key)
        if not stored:
            await self._storage.record(*report.sightings)
        return record

    async def apply_change(self, change: Change) -> None:
        """A change the store committed (its feed, ``notary.service.feed``):
        another writer's makes the cached record stale (dropped) and the
        target known to the stored-targets filter; a new certificate is
        published to the target's watchers, signed here only when someone
        watches. Store read errors are logged (``lookup``)."""
        key = change.target.key
        if change.origin != self._storage.origin:
            self._keep_statement(key)
            self._cache.invalidate(key)
            self._stored.add(key)
        hub = self._watch_hub
        if change.changed and hub is not None and hub.watched(key):
            record = await self.lookup(change.target)
            statement = record.v2_statement if record is not None else None
            # Over the target's budget the statement kept says nothing new.
            if statement is not None and record is not None and record.stands(
                self._signer.now()
            ):
                hub.publish(change.target, statement.entry)

    def _keep_statement(self, key: str) -> None:
        """Keep aside the statement of ``key``'s cached record, about to be
        dropped, for the record loaded again (with a log only)."""
        if not self._signer.logs:
            return
        record = self._cache.peek(key)
        if record is None or not isinstance(record._v2_statement, v2.SignedStatement):
            return
        carried = _Carried(record)
        previous = self._carried.pop(key, None)
        if previous is not None:
            self._carried_bytes -= previous.size
        self._carried[key] = carried
        self._carried_bytes += carried.size
        while self._carried and (
            len(self._carried) > MAX_CARRIED_STATEMENTS or self._carried_bytes > MAX_CARRIED_BYTES
        ):
            _, dropped = self._carried.popitem(last=False)
            self._carried_bytes -= dropped.size

    def forget_everything(self) -> None:
        """The feed went on without this process (pruned unread): every
        cached record may be stale, and the stored-targets filter may lack
        targets. The cache is emptied; the filter is switched off (every
        lookup reads the store from now on)."""
        log.warning("change feed: fell behind its pruned end; cache dropped, "
                    "stored-targets filter off")
        self._cache.clear()
        self._carried.clear()
        self._carried_bytes = 0
        self._stored.switch_off()

    def _merged_in_memory(
        self, report: ProbeReport, dane: DaneVerdict | None = None
    ) -> TargetRecord:
        cached = self._cache.peek(report.target.key)
        old = cached.timeline if cached is not None else Timeline(report.target)
        merged = old.merged(report, self._merge_window_s, self._timeline_limits)
        changed = is_change(old, report, self._fresh_for_s)
        dane = self._carried_dane(dane, cached, merged, report)
        return self.make(merged, cached).with_probe(report, changed, dane)

    def _carried_dane(
        self, dane: DaneVerdict | None, record: TargetRecord | None, timeline: Timeline,
        report: ProbeReport,
    ) -> DaneVerdict | None:
        """``dane`` (the verdict on ``report``) with the judgements of
        ``record``'s verdict (the target's before) on the certificates of
        the current set of ``timeline`` (merged with ``report``) the probe
        did not see (``DaneVerdict.carrying``): at most the current set."""
        if dane is None or record is None or record.dane is None:
            return dane
        current = {
            o.certificate.sha256
            for o in timeline.current(report.observed_at, self._fresh_for_s)
        }
        return dane.carrying(record.dane, current)
