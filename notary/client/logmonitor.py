"""Auditing and watching a notary's transparency log (issue 22; docs/log.md,
"Watching a notary's log"): ``notary log verify`` and ``notary log watch``.

An I/O edge (Trio), over :class:`~notary.client.logfetch.LogFetcher`
(pinned TLS to the bundle's first host that answers, one keep-alive
connection, every request under ``timeout_s``, every response bounded);
the checks themselves are :mod:`notary.protocol.v2.logaudit`'s.

* :func:`verify_log` reads the newest signed checkpoint, then the whole log
  as entry bundles, streaming each entry into a compact range (O(log n)
  memory: one entry bundle and one tile per tile level at a time), checks
  every entry (a statement entry signed by the bundle's v2 key, promising
  this log), every hash tile of the tree against the entries, and the
  recomputed root against the checkpoint's. It stops at ``max_problems``
  problems, and reads at most ``max_entries`` (the first ones, then
  proven the start of the signed tree).
* :func:`poll_log` is one round of a monitor: it compares the newest
  checkpoint with the one kept in a state file (one per notary), checks
  that the new tree extends the old one (``proof/consistency``; a proof
  that fails is settled from the entries), reads and checks the new
  entries against the new root, gives those about a domain to the caller,
  and keeps the new checkpoint. :func:`watch_log` polls until cancelled.

With a ``WitnessChoice`` (``notary.client.witnesses``), the served
checkpoint must carry the cosignatures its policy for the bundle requires
(``--witness``, ``--min-witnesses``; by default the bundle's
``min_witnesses``) before anything else is read: a checkpoint without them
is :class:`Unwitnessed`, and a watch keeps its old state.

What the notary is trusted for: nothing but its v2 key (the bundle's
``v2_key``, or its ``log`` member's key) and its TLS pin; every size, hash
and entry it serves is checked against checkpoints that key signed. A
bundle with a ``log`` member pins the log's origin too: a checkpoint of
another origin is that notary's problem (``wrong log``), and a watch's
state kept for another origin a usage error. Without the member, the
origin is the checkpoint's own (verify) or the first one a watch saw, as
:attr:`VerifyReport.pinned` and :attr:`PollResult.pinned` say.

Resource handling: each call opens and closes its own connection; the
state file is replaced atomically (a new file beside it, created
exclusively under an unpredictable name, then renamed); evidence files are
new files beside it, created exclusively.

Error handling: a bundle without a v2 key, an unreadable or damaged state
file are ``UsageError``; a log that cannot be read (no host answers,
timeouts, HTTP errors other than a 404 for something a signed checkpoint
covers, oversized responses) is :class:`LogUnreachable`; what a checked
log gets wrong is a :class:`LogProblem` in :class:`VerifyReport` (verify)
or :class:`LogInconsistent` (watch); a consistency proof that fails is
settled from the entries: a faulty answer (:class:`FaultyProof`) when
they show the checkpoints consistent, else two signed checkpoints of
different histories, :class:`Equivocation`, with the evidence saved.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from notary.client.check import DEFAULT_TIMEOUT_S, default_notary_dir, one_line
from notary.client.logfetch import LogFetcher, LogUnreachable
from notary.client.witnesses import WitnessChoice
from notary.errors import BadTarget, NotaryError, UsageError
from notary.model.targets import Target, normalise_host
from notary.outbound.dialer import Resolver, system_resolver
from notary.protocol import tlog
from notary.protocol.bundle import Bundle, BundleHost
from notary.protocol.v2.logaudit import (
    MAX_PROOF_BODY_BYTES,
    LogEntryError,
    LogReplay,
    check_log_entry,
    log_origin,
    open_log_checkpoint,
    parse_consistency_proof,
    public_key_of,
)
from notary.protocol.v2.parsing import ParsedStatement
from notary.protocol.v2.verification import VerificationError
from notary.state import crypto

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_PROBLEMS",
    "Equivocation",
    "FaultyProof",
    "LogInconsistent",
    "LogProblem",
    "LogUnreachable",
    "LoggedEntry",
    "PollResult",
    "VerifyReport",
    "bundle_v2_key",
    "default_state_path",
    "matches_domain",
    "normalise_domain",
    "poll_log",
    "verify_log",
    "watch_log",
]

#: Seconds between two polls of ``notary log watch``.
DEFAULT_INTERVAL_S = 60.0
#: Entries a watch reads before it proves them part of the signed tree (a
#: consistency proof) and reports their matches: a multiple of the tile
#: width; it bounds the matches held unreported.
WATCH_CHUNK_ENTRIES = 64 * 1024
#: Problems after which a check stops reading (``--max-problems``): a
#: hostile log of junk is reported at once, not read to its claimed end.
DEFAULT_MAX_PROBLEMS = 100
#: Entries ``notary log verify`` reads at most (``--max-entries``; 0: no
#: bound): a checkpoint claiming more is checked as far as that, the
#: entries read proven the start of its tree, the rest reported unread.
DEFAULT_MAX_ENTRIES = 100_000_000
#: The largest state file read.
MAX_STATE_BYTES = 1024 * 1024
#: Names tried for a set of evidence files (``-2``, ``-3``... when taken).
MAX_EVIDENCE_NAMES = 100
STATE_TYPE = "notary.log-monitor"
STATE_VERSION = 1

# Kinds of LogProblem besides logaudit's entry kinds.
BAD_CHECKPOINT = "bad checkpoint signature"
ROOT_MISMATCH = "root mismatch"
TILE_MISMATCH = "tile mismatch"
MISSING = "missing"
MALFORMED_BUNDLE = "malformed entry bundle"
FAULTY_PROOF = "faulty consistency proof"
WRONG_LOG = "wrong log"


# -- results ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogProblem:
    """One thing a log gets wrong: its ``kind`` (``bad signature``,
    ``malformed entry``, ``wrong origin``, ``root mismatch``, ``tile
    mismatch``, ``missing``, ``malformed entry bundle``, ``bad checkpoint
    signature``, ``faulty consistency proof``, ``wrong log``), the entry
    ``index`` it is about (None: the whole log), and one line of
    ``detail``."""

    kind: str
    index: int | None
    detail: str

    def line(self) -> str:
        where = f" at index {self.index}" if self.index is not None else ""
        return one_line(f"{self.kind}{where}: {self.detail}", limit=240)


@dataclass
class _Problems:
    """The problems found, up to ``limit``: a check stops reading once it
    is :attr:`full` (the problems kept are bounded by ``limit``)."""

    limit: int = DEFAULT_MAX_PROBLEMS
    kept: list[LogProblem] = field(default_factory=list)
    count: int = 0

    def add(self, kind: str, index: int | None, detail: str, *, last: bool = False) -> None:
        """Count a problem, and keep it while fewer than ``limit`` are kept
        (``last``: the one conclusion added after reading stopped, kept in
        any case)."""
        self.count += 1
        if len(self.kept) < self.limit or last:
            self.kept.append(LogProblem(kind, index, detail))

    @property
    def full(self) -> bool:
        """Whether ``limit`` problems were found: stop reading."""
        return self.count >= self.limit


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify_log` found. ``size`` and ``root`` are the signed
    checkpoint's (None when it did not verify), ``computed_root`` the root
    of the entries served (None unless all of them were read).
    ``stopped``: the check stopped at ``max_problems`` problems, the rest
    of the log unread; ``entries_limit``: the checkpoint claims more
    entries than ``max_entries``, and only this many (the first) were read
    (None: all of them); ``pinned``: the bundle pins the log (origin and
    key: its ``log`` member), else the origin is the checkpoint's own."""

    notary: str
    host: str
    origin: str
    size: int | None
    root: bytes | None
    computed_root: bytes | None
    entries_checked: int
    tiles_checked: int
    problems: tuple[LogProblem, ...]
    problem_count: int
    stopped: bool = False
    entries_limit: int | None = None
    pinned: bool = False
    #: What the witness policy found on the checkpoint (None: none required).
    witnessing: tlog.Witnessing | None = None

    @property
    def consistent(self) -> bool:
        """No problem in what was checked (:attr:`complete` says whether
        that is the whole log)."""
        return self.problem_count == 0

    @property
    def complete(self) -> bool:
        """Whether every entry the checkpoint covers was checked."""
        return self.entries_limit is None and not self.stopped


@dataclass(frozen=True, slots=True)
class LoggedEntry:
    """A verified log entry about the watched domain: its ``index``, the
    statement's ``target``, the SHA-256 of its newest observation (by
    ``last_seen``; None without observations) and ``signed_at``."""

    index: int
    target: Target
    sha256: bytes | None
    signed_at: int


@dataclass(frozen=True, slots=True)
class PollResult:
    """One poll: the log's size before and now (``old_size`` 0 on a first
    run), the entries checked, those about the domain, whether the
    notary serves a log at all yet (``empty``), and whether its bundle
    pins the log (``pinned``; else the origin is the first one seen)."""

    origin: str
    old_size: int
    new_size: int
    entries_checked: int
    matched: int
    empty: bool = False
    pinned: bool = False
    witnessing: tlog.Witnessing | None = None


class Unwitnessed(NotaryError):
    """The served checkpoint lacks the cosignatures the witness policy
    requires (``witnessing`` says what it found)."""

    def __init__(self, notary: str, witnessing: tlog.Witnessing) -> None:
        super().__init__(f"{notary}: its checkpoint is not witnessed: {witnessing.describe()}")
        self.witnessing = witnessing


def require_witnesses(
    bundle: Bundle, body: bytes, witnesses: WitnessChoice | None
) -> tlog.Witnessing | None:
    """The policy's judgement of the served checkpoint ``body`` (None: no
    cosignature required). :class:`Unwitnessed` when too few witnesses
    cosigned; the policy's ``UsageError`` when it cannot be met."""
    if witnesses is None:
        return None
    policy = witnesses.policy_for(bundle)
    if not policy.required:
        return None
    try:
        judged = policy.judge(body.decode("utf-8"), now=int(time.time()))
    except (UnicodeDecodeError, tlog.NoteError):  # signature lines no witness could have made
        judged = tlog.Witnessing((), (), 0, policy.minimum)
    if not judged.witnessed:
        raise Unwitnessed(bundle.name, judged)
    return judged


class LogInconsistent(NotaryError):
    """The log the notary serves contradicts its signed checkpoint (entries,
    signatures, root), or the checkpoint does not verify. ``stopped``: the
    check stopped at its ``max_problems``."""

    def __init__(
        self, message: str, problems: tuple[LogProblem, ...] = (), count: int = 0,
        stopped: bool = False,
    ) -> None:
        super().__init__(message)
        self.problems = problems
        self.count = count or len(problems)
        self.stopped = stopped


class Equivocation(NotaryError):
    """Two checkpoints signed by the notary's key that are not of one
    history: a smaller tree, a same-size tree with another root, or a
    larger tree that neither a consistency proof nor the entries it serves
    show to extend the kept one. ``old_note`` and ``new_note`` are the
    signed checkpoints; ``evidence`` the files they were saved to."""

    def __init__(
        self, reason: str, old_note: str, new_note: str, evidence: tuple[Path, ...]
    ) -> None:
        super().__init__(f"equivocation: {reason}")
        self.reason = reason
        self.old_note = old_note
        self.new_note = new_note
        self.evidence = evidence


class FaultyProof(NotaryError):
    """A consistency proof the notary served does not verify (or it serves
    none), yet the entries it serves, hashed onto the kept tree's right
    edge, give its signed root: its checkpoints are consistent, the proof
    is a faulty answer, not equivocation. Nothing is saved as evidence and
    the state keeps the old checkpoint. ``reason``: what was wrong with
    the proof."""

    def __init__(self, reason: str, old_size: int, new_size: int) -> None:
        super().__init__(
            f"faulty consistency proof: {reason}; the entries it serves from {old_size} to "
            f"{new_size} lead from the kept root to the signed one, so its checkpoints are "
            "consistent (a faulty answer, not equivocation)"
        )
        self.reason = reason


# -- the bundle's key ---------------------------------------------------------------


def bundle_v2_key(bundle: Bundle, host: BundleHost | None = None) -> bytes:
    """The v2 key that signs the log of ``bundle``'s notary: its ``log``
    member's key if it has one (which the hosts' ``v2_key``, if any, must
    be: ``notary.protocol.bundle`` checks it), else ``host``'s ``v2_key``
    if it has one, else the one key the bundle's hosts carry.

    Error handling: ``UsageError`` for a bundle without ``v2_key`` nor
    ``log``, or with several v2 keys and no ``host`` that carries one.
    """
    if bundle.log is not None:
        return bundle.log.public_raw
    if host is not None and host.v2_key is not None:
        return _decode_key(bundle, host.v2_key)
    keys = {h.v2_key for h in bundle.hosts if h.v2_key is not None}
    if not keys:
        raise UsageError(
            f"bundle {bundle.name!r} has no v2_key: its log cannot be checked "
            "(ask its operator for a bundle written with `notary bundle ... --v2-key`)"
        )
    if len(keys) > 1:
        raise UsageError(f"bundle {bundle.name!r} names several v2 keys")
    return _decode_key(bundle, keys.pop())


def _open_checkpoint(
    bundle: Bundle, body: bytes | str, public_raw: bytes, *, origin: str | None = None
) -> tuple[tlog.Checkpoint, str]:
    """The served checkpoint, verified with ``public_raw``, of the log the
    bundle pins (its ``log`` member's origin) or else of ``origin`` (a
    watch's kept one; None: the checkpoint's own). Raises
    :class:`_Refused` with the kind of problem."""
    pinned = bundle.log.origin if bundle.log is not None else None
    claimed = log_origin(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)
    if pinned is not None and claimed != pinned:
        raise _Refused(WRONG_LOG, (
            f"the checkpoint names log {one_line(claimed, 80)!r}; the bundle pins "
            f"{one_line(pinned, 80)!r}"
        ))
    try:
        return open_log_checkpoint(body, public_raw, origin=pinned or origin)
    except VerificationError as exc:
        raise _Refused(BAD_CHECKPOINT, str(exc)) from None


class _Refused(Exception):
    """A served checkpoint that is refused: the ``kind`` of problem, and why."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _decode_key(bundle: Bundle, text: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
        public_key_of(raw)
    except (binascii.Error, ValueError):
        raise UsageError(f"bundle {bundle.name!r}: v2_key is not an Ed25519 key") from None
    return raw


# -- verify -------------------------------------------------------------------------


async def verify_log(
    bundle: Bundle, *, timeout_s: float = DEFAULT_TIMEOUT_S,
    resolver: Resolver = system_resolver, max_problems: int = DEFAULT_MAX_PROBLEMS,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    on_progress: Callable[[int, int, int], None] | None = None,
    witnesses: WitnessChoice | None = None,
) -> VerifyReport:
    """Read and check the whole log of ``bundle``'s notary (see the module
    docstring), stopping at ``max_problems`` problems, and reading at most
    ``max_entries`` entries (0: no bound; rounded down to whole entry
    bundles): the first ones, then proven the start of the signed tree by
    a consistency proof. ``on_progress(checked, size, limit)`` is called
    once the checkpoint is verified (``checked`` 0) and after each entry
    bundle: entries checked, the checkpoint's size, and how many will be
    read.

    Raises ``UsageError`` for a bundle without v2 key,
    :class:`LogUnreachable` when the log cannot be read and
    :class:`Unwitnessed` when ``witnesses`` require cosignatures its
    checkpoint lacks; every defect of the log is a problem of the report."""
    bundle_v2_key(bundle)  # a usage error before any connection
    if witnesses is not None:
        witnesses.policy_for(bundle)
    problems = _Problems(max_problems)
    async with LogFetcher(bundle, timeout_s=timeout_s, resolver=resolver) as fetcher:
        host = await fetcher.connect()
        public_raw = bundle_v2_key(bundle, host)
        body = await _checkpoint_body(fetcher)
        if body is None:
            raise LogUnreachable(f"{bundle.name}: it serves no checkpoint (its log is empty)")
        try:
            checkpoint, _note = _open_checkpoint(bundle, body, public_raw)
        except _Refused as refused:
            problems.add(refused.kind, None, refused.detail)
            origin = one_line(body[:200].decode("utf-8", "replace").split("\n", 1)[0], 80)
            return VerifyReport(
                bundle.name, host.host, origin, None, None, None, 0, 0,
                tuple(problems.kept), problems.count, pinned=bundle.log is not None,
            )
        witnessing = require_witnesses(bundle, body, witnesses)
        size = checkpoint.size
        limit = size
        if max_entries and size > max_entries:
            limit = max(tlog.TILE_WIDTH, max_entries - max_entries % tlog.TILE_WIDTH)
        if on_progress is not None:
            on_progress(0, size, limit)
        replay = LogReplay(size, expect_tiles=True)
        audit = _Audit(fetcher, checkpoint, public_raw, problems, on_progress=on_progress,
                       limit=limit)
        complete = await audit.read_entries(replay, on_entry=None, until=limit)
        computed = replay.root() if complete and limit == size else None
        if computed is not None and computed != checkpoint.root:
            problems.add(ROOT_MISMATCH, None, (
                f"the entries hash to {_b64(computed)}, the checkpoint signs "
                f"{_b64(checkpoint.root)}"
            ), last=True)
        elif complete and limit < size and not problems.count:
            fault = await _consistency(fetcher, limit, size, replay.root(), checkpoint.root)
            if fault is not None:
                problems.add(FAULTY_PROOF, None, (
                    f"the first {limit} entries are not proven the start of the signed "
                    f"tree: {fault.reason}"
                ))
    return VerifyReport(
        bundle.name, host.host, checkpoint.origin, checkpoint.size, checkpoint.root,
        computed, audit.entries_checked, audit.tiles_checked, tuple(problems.kept),
        problems.count, stopped=problems.full and replay.next_index < limit,
        entries_limit=limit if limit < size else None, pinned=bundle.log is not None,
        witnessing=witnessing,
    )


async def _checkpoint_body(fetcher: LogFetcher) -> bytes | None:
    """The served checkpoint's bytes; None for a 404 (no log yet)."""
    response = await fetcher.get("checkpoint", max_bytes=tlog.MAX_NOTE_BYTES)
    if response.status == 404:
        return None
    if response.status != 200:
        raise LogUnreachable(f"{fetcher.host_name}: HTTP {response.status} for its checkpoint")
    return response.body


class _Audit:
    """Reads entries (and tiles) of the tree of ``checkpoint`` and checks
    them; counts what it checked, adds what is wrong to ``problems``."""

    def __init__(
        self, fetcher: LogFetcher, checkpoint: tlog.Checkpoint, public_raw: bytes,
        problems: _Problems, *, on_progress: Callable[[int, int, int], None] | None = None,
        limit: int | None = None,
    ) -> None:
        self._fetcher = fetcher
        self._checkpoint = checkpoint
        self._public_key, self._key_id = public_key_of(public_raw)
        self._problems = problems
        self._on_progress = on_progress
        self._limit = checkpoint.size if limit is None else limit
        self.entries_checked = 0
        self.tiles_checked = 0

    async def read_entries(
        self, replay: LogReplay,
        on_entry: Callable[[int, ParsedStatement], None] | None,
        until: int | None = None,
    ) -> bool:
        """Feed ``replay`` the entries from its next index to ``until`` (a
        multiple of the tile width, or the checkpoint's size: the default),
        checking each (and each tile it completes); ``on_entry`` gets each
        entry that checks. False when an entry bundle is missing or
        malformed, so the tree cannot be recomputed, or when the problems
        are :attr:`_Problems.full` (the check stops there)."""
        size = self._checkpoint.size
        end = size if until is None else min(until, size)
        first_bundle = replay.next_index // tlog.TILE_WIDTH
        last_bundle = -(-end // tlog.TILE_WIDTH)
        for bundle_index in range(first_bundle, last_bundle):
            first = bundle_index * tlog.TILE_WIDTH
            width = min(tlog.TILE_WIDTH, size - first)
            path = tlog.entries_path(bundle_index, width)
            response = await self._fetcher.get(
                path, max_bytes=width * (2 + tlog.MAX_ENTRY_BYTES)
            )
            if response.status == 404:
                self._problems.add(MISSING, first, (
                    f"{path} is not served (HTTP 404), yet the checkpoint covers "
                    f"{size} entries"
                ))
                return False
            self._expect_ok(response.status, path)
            try:
                entries = tlog.decode_entry_bundle(response.body, width=width)
            except tlog.TileError as exc:
                self._problems.add(MALFORMED_BUNDLE, first, f"{path}: {exc}")
                return False
            for offset, entry in enumerate(entries):
                index = first + offset
                if index < replay.next_index:
                    continue  # checked before (a watch's previous tree)
                self._check_entry(index, entry, on_entry)
                for tile in replay.add(entry):
                    await self._check_tile(tile.level, tile.index, tile.width, tile.hashes)
                if self._problems.full:
                    return False
            if self._on_progress is not None:
                self._on_progress(self.entries_checked, size, self._limit)
        return True

    def _check_entry(
        self, index: int, entry: bytes,
        on_entry: Callable[[int, ParsedStatement], None] | None,
    ) -> None:
        self.entries_checked += 1
        try:
            parsed = check_log_entry(
                entry, origin=self._checkpoint.origin, public_key=self._public_key,
                key_id=self._key_id, index=index,
            )
        except LogEntryError as exc:
            self._problems.add(exc.kind, index, exc.detail)
            return
        if on_entry is not None:
            on_entry(index, parsed)

    async def _check_tile(self, level: int, index: int, width: int, expected: bytes) -> None:
        path = tlog.tile_path(level, index, width)
        response = await self._fetcher.get(path, max_bytes=width * tlog.HASH_SIZE)
        first_leaf = (index * tlog.TILE_WIDTH) << (tlog.TILE_HEIGHT * level)
        if response.status == 404:
            self._problems.add(MISSING, first_leaf, f"hash tile {path} is not served (HTTP 404)")
            return
        self._expect_ok(response.status, path)
        self.tiles_checked += 1
        served = response.body
        if len(served) != len(expected):
            self._problems.add(TILE_MISMATCH, first_leaf, (
                f"hash tile {path} is {len(served)} bytes, not {width} hashes"
            ))
            return
        if served != expected:
            position = next(
                i for i in range(width)
                if served[i * tlog.HASH_SIZE:(i + 1) * tlog.HASH_SIZE]
                != expected[i * tlog.HASH_SIZE:(i + 1) * tlog.HASH_SIZE]
            )
            leaf = (index * tlog.TILE_WIDTH + position) << (tlog.TILE_HEIGHT * level)
            self._problems.add(TILE_MISMATCH, leaf, (
                f"hash tile {path} differs from the hashes of the entries (hash {position})"
            ))

    def _expect_ok(self, status: int, path: str) -> None:
        if status != 200:
            raise LogUnreachable(f"{self._fetcher.host_name}: HTTP {status} for {path}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# -- watch: the state file ------------------------------------------------------------


def default_state_path(bundle: Bundle) -> Path:
    """Where ``notary log watch`` keeps a notary's last verified checkpoint:
    ``logs/<name>-<hash>.json`` in the client's config directory (beside
    ``notaries/``), one file per notary name."""
    slug = (re.sub(r"[^a-z0-9]+", "-", bundle.name.lower()).strip("-") or "notary")[:60]
    digest = hashlib.sha256(bundle.name.encode("utf-8")).hexdigest()[:8]
    return default_notary_dir().parent / "logs" / f"{slug}-{digest}.json"


@dataclass(frozen=True, slots=True)
class _State:
    """A verified checkpoint (its note) and the right edge of its tree."""

    note: str
    checkpoint: tlog.Checkpoint
    edge: tlog.CompactRange


def _read_state(path: Path, public_raw: bytes, origin: str | None = None) -> _State | None:
    """The state kept in ``path`` (None: no file yet), checked: the key it
    was kept for is ``public_raw``, the checkpoint verifies with it and is
    of log ``origin`` (the one the bundle pins; None: any), and the edge's
    root is the checkpoint's. ``UsageError`` otherwise."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read the state file {path}: {exc.strerror}") from None
    damaged = f"the state file {path} is damaged (remove it to start again from size 0)"
    try:
        if len(data) > MAX_STATE_BYTES:
            raise ValueError
        document = json.loads(data)
        if document.get("type") != STATE_TYPE or document.get("version") != STATE_VERSION:
            raise ValueError
        kept_key = base64.b64decode(document["v2_key"], validate=True)
        note = document["checkpoint"]
        edge_hashes = [base64.b64decode(h, validate=True) for h in document["edge"]]
        if not isinstance(note, str):
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        raise UsageError(damaged) from None
    if kept_key != public_raw:
        raise UsageError(
            f"the state file {path} was kept for another v2 key than the bundle's "
            "(a new key: remove the file to start again)"
        )
    try:
        checkpoint, note = open_log_checkpoint(note, public_raw)
    except VerificationError:
        raise UsageError(damaged) from None
    if origin is not None and checkpoint.origin != origin:
        raise UsageError(
            f"the state file {path} was kept for log {one_line(checkpoint.origin, 80)!r}, "
            f"the bundle pins {one_line(origin, 80)!r} (remove the file to start again)"
        )
    subtrees = iter(edge_hashes)
    try:
        edge = tlog.CompactRange.from_tree(checkpoint.size, lambda _level, _index: next(subtrees))
        if next(subtrees, None) is not None or edge.root() != checkpoint.root:
            raise ValueError
    except (StopIteration, ValueError, RuntimeError):
        raise UsageError(damaged) from None
    return _State(note, checkpoint, edge)


def _write_state(path: Path, bundle: Bundle, public_raw: bytes, note: str,
                 edge: tlog.CompactRange) -> None:
    """Replace ``path`` with the new state, atomically (a new file beside
    it, created exclusively under an unpredictable name, then renamed).
    ``UsageError`` when it cannot be written."""
    document = {
        "type": STATE_TYPE,
        "version": STATE_VERSION,
        "notary": bundle.name,
        "v2_key": _b64(public_raw),
        "checkpoint": note,
        "edge": [_b64(digest) for _level, _index, digest in edge.subtrees()],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise UsageError(f"cannot write the state file {path}: {exc.strerror}") from None
    # A new file of its own (mkstemp: O_EXCL, an unpredictable name, mode
    # 0600) renamed over the old one: nothing planted in the directory is
    # written through, and a crash leaves the old state or the new one.
    crypto.write_new_file(
        path, (json.dumps(document, indent=1) + "\n").encode("utf-8"), mode=0o600, force=True
    )


def _save_evidence(state_path: Path, old_note: str, new_note: str,
                   proof: bytes | None) -> tuple[Path, ...]:
    """Write the two checkpoints (and the proof served, if any) as new files
    beside the state file; their paths. Each file is created exclusively
    (a name taken, even by a symlink, is never written through: the next
    free ``-N`` name is used); files that cannot be written are left out
    (the checkpoints are printed too)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    contents = [("old.checkpoint", old_note.encode("utf-8")),
                ("new.checkpoint", new_note.encode("utf-8"))]
    if proof is not None:
        contents.append(("consistency-proof", proof))
    with contextlib.suppress(OSError):
        state_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for attempt in range(1, MAX_EVIDENCE_NAMES + 1):
        base = f"{state_path.stem}.equivocation-{stamp}" + (f"-{attempt}" if attempt > 1 else "")
        paths = [state_path.with_name(f"{base}.{suffix}") for suffix, _data in contents]
        if not any(os.path.lexists(path) for path in paths):
            break
    written = []
    for path, (_suffix, data) in zip(paths, contents, strict=True):
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
        except OSError:
            continue
        written.append(path)
    return tuple(written)


# -- watch: polling -------------------------------------------------------------------


def matches_domain(host: str, domain: str) -> bool:
    """Whether ``host`` (a statement's target host, normalised) is
    ``domain`` (normalised) or a name under it."""
    return host == domain or host.endswith("." + domain)


def normalise_domain(text: str) -> str:
    """``--domain`` as statements name hosts (lower case, A-labels);
    ``UsageError`` for something that is not a host name."""
    try:
        return normalise_host(text.strip().rstrip("."))
    except BadTarget as exc:
        raise UsageError(f"--domain {text!r}: {exc}") from None


async def poll_log(
    bundle: Bundle, *, domain: str, state_path: Path, on_entry: Callable[[LoggedEntry], None],
    timeout_s: float = DEFAULT_TIMEOUT_S, resolver: Resolver = system_resolver,
    max_problems: int = DEFAULT_MAX_PROBLEMS, witnesses: WitnessChoice | None = None,
) -> PollResult:
    """One round of ``notary log watch`` (see the module docstring):
    ``on_entry`` gets each new, verified entry whose target host is
    ``domain`` (normalised) or under it, in log order, once the entries up
    to it are proven part of the signed tree (every ``WATCH_CHUNK_ENTRIES``
    entries, and at the end); the
    state file then keeps the new checkpoint (not when anything failed).
    A chunk with problems ends the poll before any proof is asked for, and
    reading stops at ``max_problems`` problems.

    A consistency proof that fails is settled from the entries before
    anyone is accused: consistent, it is :class:`FaultyProof`; a kept
    tree the entries do not extend to the signed root is
    :class:`Equivocation`.

    Error handling: ``UsageError`` (bundle, state file),
    :class:`LogUnreachable`, :class:`LogInconsistent`, :class:`FaultyProof`,
    :class:`Equivocation` (its evidence saved beside the state file),
    :class:`Unwitnessed` (the state unchanged).
    """
    bundle_v2_key(bundle)
    if witnesses is not None:
        witnesses.policy_for(bundle)
    async with LogFetcher(bundle, timeout_s=timeout_s, resolver=resolver) as fetcher:
        public_raw = bundle_v2_key(bundle, await fetcher.connect())
        pinned = bundle.log is not None
        state = _read_state(state_path, public_raw, bundle.log.origin if bundle.log else None)
        old_size = state.checkpoint.size if state is not None else 0
        body = await _checkpoint_body(fetcher)
        if body is None:
            if old_size:
                raise LogUnreachable(
                    f"{bundle.name}: it serves no checkpoint, though it signed one of "
                    f"{old_size} entries"
                )
            return PollResult("", 0, 0, 0, 0, empty=True, pinned=pinned)
        try:
            checkpoint, note = _open_checkpoint(
                bundle, body, public_raw,
                origin=state.checkpoint.origin if state is not None else None,
            )
        except _Refused as refused:
            raise LogInconsistent(
                f"the checkpoint {bundle.name} serves is refused",
                (LogProblem(refused.kind, None, refused.detail),),
            ) from None
        witnessing = require_witnesses(bundle, body, witnesses)
        fault: _Fault | None = None
        if state is not None:
            fault = await _check_extends(fetcher, state, checkpoint, note, state_path)
            if checkpoint.size == old_size:
                return PollResult(
                    checkpoint.origin, old_size, old_size, 0, 0, pinned=pinned,
                    witnessing=witnessing,
                )
        edge = state.edge if state is not None else tlog.CompactRange()
        replay = LogReplay(checkpoint.size, start=edge)
        problems = _Problems(max_problems)
        audit = _Audit(fetcher, checkpoint, public_raw, problems)
        matched = 0
        # Matching entries are held until the entries read so far are proven
        # part of the signed tree, then reported: nothing unverified is
        # printed, and at most a chunk's matches are held.
        held: list[LoggedEntry] = []
        # A consistency proof that failed: from the kept tree (``fault``) or
        # of the entries read so far (``chunk_fault``). Nobody is accused on
        # a proof alone: the entries settle it. They are all read (no more
        # proofs asked, nothing reported) and their root, grown from the
        # kept tree's right edge, compared with the signed one.
        chunk_fault: _Fault | None = None

        def keep(index: int, parsed: ParsedStatement) -> None:
            if fault is None and chunk_fault is None and matches_domain(
                parsed.target.host, domain
            ):
                newest = max(parsed.observations, key=lambda o: o.last_seen, default=None)
                held.append(LoggedEntry(
                    index, parsed.target, newest.sha256 if newest else None, parsed.signed_at
                ))

        while not replay.complete:
            until = (replay.next_index // WATCH_CHUNK_ENTRIES + 1) * WATCH_CHUNK_ENTRIES
            if not await audit.read_entries(replay, on_entry=keep, until=until):
                break
            if fault is not None or chunk_fault is not None or replay.complete:
                continue
            # A chunk with problems is reported as such: no proof is asked
            # for it (a log of junk is not "unreachable" for want of one).
            if problems.count:
                break
            chunk_fault = await _consistency(
                fetcher, replay.next_index, checkpoint.size, replay.root(), checkpoint.root
            )
            if chunk_fault is None:
                matched += len(held)
                for entry in held:
                    on_entry(entry)
            held.clear()
        unsettled = fault or chunk_fault
        if replay.complete:
            computed = replay.root()
            if computed != checkpoint.root:
                if fault is not None and state is not None:
                    raise _equivocation(state, note, state_path, (
                        f"no consistency from {old_size} to {checkpoint.size} entries: "
                        f"{fault.reason}, and the entries it serves from {old_size} on do not "
                        "lead from the kept root to the new one"
                    ), fault.body)
                problems.add(ROOT_MISMATCH, None, (
                    f"the entries hash to {_b64(computed)}, the checkpoint signs "
                    f"{_b64(checkpoint.root)}"
                ), last=True)
            elif unsettled is not None and not problems.count:
                raise FaultyProof(unsettled.reason, old_size, checkpoint.size)
            elif unsettled is not None:
                problems.add(FAULTY_PROOF, None, (
                    f"{unsettled.reason} (its entries show the checkpoints consistent)"
                ), last=True)
        elif unsettled is not None:
            problems.add(FAULTY_PROOF, None, (
                f"{unsettled.reason} (not settled: its entries could not all be read)"
            ), last=True)
        if problems.count or not replay.complete:
            raise LogInconsistent(
                f"the log of {bundle.name} is inconsistent ({problems.count} problems)",
                tuple(problems.kept), problems.count, stopped=problems.full,
            )
        matched += len(held)
        for entry in held:
            on_entry(entry)
    _write_state(state_path, bundle, public_raw, note, replay.edge)
    return PollResult(
        checkpoint.origin, old_size, checkpoint.size, audit.entries_checked, matched,
        pinned=pinned, witnessing=witnessing,
    )


@dataclass(frozen=True, slots=True)
class _Fault:
    """A consistency proof that does not verify, or is not served: why
    (``reason``, one line) and the body served (None: none)."""

    reason: str
    body: bytes | None


async def _consistency(
    fetcher: LogFetcher, old_size: int, new_size: int, old_root: bytes, new_root: bytes
) -> _Fault | None:
    """Ask for ``proof/consistency?old=&new=`` and verify it between the two
    roots: None when it does; a :class:`_Fault` when it does not, is
    malformed or is not served (404: both sizes are within a signed tree,
    so the notary owes it). Other statuses are :class:`LogUnreachable`."""
    path = f"proof/consistency?old={old_size}&new={new_size}"
    response = await fetcher.get(path, max_bytes=MAX_PROOF_BODY_BYTES)
    if response.status == 404:
        return _Fault(f"{path} is not served (HTTP 404)", None)
    if response.status != 200:
        raise LogUnreachable(f"{fetcher.host_name}: HTTP {response.status} for {path}")
    try:
        proof = parse_consistency_proof(response.body)
        tlog.verify_consistency(old_size, new_size, old_root, new_root, proof)
    except tlog.ProofError as exc:
        return _Fault(f"{path} does not verify: {exc}", response.body)
    return None


def _equivocation(
    state: _State, note: str, state_path: Path, reason: str, proof: bytes | None = None
) -> Equivocation:
    """:class:`Equivocation` between the kept checkpoint and ``note``, its
    evidence saved beside the state file."""
    evidence = _save_evidence(state_path, state.note, note, proof)
    return Equivocation(reason, state.note, note, evidence)


async def _check_extends(
    fetcher: LogFetcher, state: _State, checkpoint: tlog.Checkpoint, note: str, state_path: Path
) -> _Fault | None:
    """Raise :class:`Equivocation` when the new checkpoint's tree cannot
    extend the kept one's: it is smaller, or of the same size with another
    root (two signed checkpoints say so, nothing else needed). Otherwise
    check the notary's consistency proof between the two: None when it
    verifies (or there is nothing to prove), the :class:`_Fault` when it
    does not or is not served, for the caller to settle from the entries."""
    old = state.checkpoint
    if checkpoint.size < old.size:
        raise _equivocation(
            state, note, state_path, f"the log shrank from {old.size} to {checkpoint.size} entries"
        )
    if checkpoint.size == old.size:
        if checkpoint.root != old.root:
            raise _equivocation(state, note, state_path, f"two different trees of {old.size} entries")
        return None
    if old.size == 0:
        return None  # every tree extends the empty one
    return await _consistency(fetcher, old.size, checkpoint.size, old.root, checkpoint.root)


async def watch_log(
    bundle: Bundle, *, domain: str, state_path: Path, on_entry: Callable[[LoggedEntry], None],
    on_poll: Callable[[PollResult], None], on_unreachable: Callable[[LogUnreachable], None],
    interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = DEFAULT_TIMEOUT_S,
    resolver: Resolver = system_resolver, max_problems: int = DEFAULT_MAX_PROBLEMS,
    witnesses: WitnessChoice | None = None,
    on_unwitnessed: Callable[[Unwitnessed], None] | None = None,
) -> None:
    """:func:`poll_log` every ``interval_s`` until cancelled; a poll that
    cannot read the log goes to ``on_unreachable``, one whose checkpoint
    lacks the cosignatures ``witnesses`` require to ``on_unwitnessed`` (None:
    it ends the watch), and the watch goes on. :class:`LogInconsistent`,
    :class:`FaultyProof`, :class:`Equivocation` and ``UsageError`` end it
    (they propagate)."""
    while True:
        try:
            result = await poll_log(
                bundle, domain=domain, state_path=state_path, on_entry=on_entry,
                timeout_s=timeout_s, resolver=resolver, max_problems=max_problems,
                witnesses=witnesses,
            )
        except LogUnreachable as exc:
            on_unreachable(exc)
        except Unwitnessed as exc:
            if on_unwitnessed is None:
                raise
            on_unwitnessed(exc)
        else:
            on_poll(result)
        await trio.sleep(interval_s)
