"""``notary check --v2`` and the notaries' logs (issue 22, docs/v2.md rule
S7): the answer's statement is checked against its log (its inclusion
proof, or its promise while unsequenced) and, with a ``CheckpointBook``,
the notary's log is held consistent with the checkpoint it showed this
client before; a log that forked or shrank is that notary's failure, both
signed checkpoints kept as evidence (``notary.client.checkpoints``).

With a ``WitnessChoice`` (``notary.client.witnesses``), the checkpoint the
statement's inclusion leads to must carry the cosignatures the policy
requires; a statement not yet logged, or logged under a checkpoint without
them, is that notary's failure (its promise is still pending: the row says
until when). The client then asks its other notaries what they witnessed
of that log: a witness holding a checkpoint the shown one is not
consistent with (another root at the same size, or no consistency proof
from the notary) is equivocation, both checkpoints kept as evidence.

Error handling: ``LogFailed`` carries the verdict (``FAILURE`` for a log
that does not hold, ``CONNECTIVITY_FAILURE`` when a proof cannot be had
or the client's own memory of the log cannot be read or written) and a
short detail for the notary's row.
"""

from __future__ import annotations

import base64
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.client import witnesses as witnessing
from notary.client.checkpoints import CheckpointBook, CheckpointUnreadable
from notary.client.reach import NotaryFailed, exchange, http_request
from notary.client.witnesses import WitnessChoice
from notary.errors import UsageError
from notary.outbound.dialer import Resolver
from notary.protocol import tlog, v2
from notary.protocol.bundle import Bundle
from notary.protocol.voting import Verdict

__all__ = ["MAX_PROOF_HASHES", "LogFailed", "check_log", "consistency_proof"]


#: Hashes in a consistency proof, at most (two per level of a 2**63-leaf tree).
MAX_PROOF_HASHES = 128


class LogFailed(Exception):
    """A notary's log did not hold: its answer is that notary's failure."""

    def __init__(self, detail: str, verdict: Verdict = Verdict.FAILURE) -> None:
        super().__init__(detail)
        self.detail = detail
        self.verdict = verdict


async def check_log(
    bundle: Bundle, relay: Bundle | None, resolver: Resolver, parsed: v2.ParsedAnswer,
    keys: dict[str, Ed25519PublicKey], checkpoints: CheckpointBook | None,
    witnesses: WitnessChoice | None = None,
) -> str | None:
    """Check the log member of the (verified) answer's statement: its
    inclusion proof or its promise (rule S7) and, with ``checkpoints``,
    the consistency of the notary's log with the checkpoint it showed this
    client before. When ``bundle`` pins the log (its ``log`` member), the
    statement must promise that log, and its checkpoint must be signed by
    the key the bundle pins; a bundle without it keeps to the statement's
    own promise and key, and the row says so. With ``witnesses``, the
    checkpoint must be cosigned as their policy for ``bundle`` requires.
    Returns the words for the notary's row (None: the notary keeps no log
    and its bundle pins none). ``LogFailed`` when the log does not hold."""
    wanted = parsed.results[0].statement_signature if parsed.results else None
    statement = next((s for s in parsed.statements if s.signature == wanted), None)
    if statement is None:
        return None
    pinned = bundle.log
    promise = statement.log
    if promise is None:
        if pinned is None:
            return None
        raise LogFailed(f"the statement promises no log; its bundle pins {pinned.origin!r}")
    if pinned is not None and promise.origin != pinned.origin:
        raise LogFailed(
            f"the statement promises log {promise.origin[:80]!r}; its bundle pins "
            f"{pinned.origin!r}"
        )
    # The key its checkpoints are signed with: the bundle's, else the one
    # that signed the statement (its v2 key).
    public_raw = (
        pinned.public_raw if pinned is not None else keys[statement.key_id].public_bytes_raw()
    )
    unpinned = "" if pinned is not None else " (its bundle pins no log)"
    try:
        logged = v2.verify_logged(statement, public_raw, now=int(time.time()))
    except v2.VerificationError as exc:
        pinned_key = " with the key its bundle pins" if pinned is not None else ""
        raise LogFailed(f"{exc}{pinned_key}") from None
    assert logged is not None
    policy = None
    if witnesses is not None:
        try:
            policy = witnesses.policy_for(bundle)
        except witnessing.WitnessesUnmet as exc:
            raise LogFailed(str(exc), Verdict.CONNECTIVITY_FAILURE) from None
    pending = f"its log promise runs until {_when(promise.merge_by)}"
    if logged.checkpoint is None or logged.note is None:
        if policy is not None and policy.required:
            raise LogFailed(f"not witnessed yet: the statement is not in its log ({pending})")
        return f"log: promised by {promise.merge_by}{unpinned}"
    words = f"logged at {logged.index} of {logged.checkpoint.size}"
    try:
        if policy is not None and policy.required:
            assert statement.inclusion is not None
            words += await _require_witnesses(
                bundle, relay, resolver, checkpoints, witnesses, policy, promise.origin,
                public_raw, statement.inclusion.checkpoint, logged, pending,
            )
        if checkpoints is None:
            return words + unpinned
        return words + await _hold_consistent(
            bundle, relay, resolver, checkpoints, promise.origin, public_raw, logged
        ) + unpinned
    except CheckpointUnreadable as exc:
        raise LogFailed(
            f"the checkpoint this client kept of its log is unreadable ({exc.reason}): "
            f"remove {exc.path}", Verdict.CONNECTIVITY_FAILURE,
        ) from None
    except UsageError as exc:  # the client's own directory cannot be written
        raise LogFailed(str(exc), Verdict.CONNECTIVITY_FAILURE) from None


def _when(timestamp: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


async def _require_witnesses(
    bundle: Bundle, relay: Bundle | None, resolver: Resolver,
    checkpoints: CheckpointBook | None, witnesses: WitnessChoice | None,
    policy: tlog.WitnessPolicy, origin: str, public_raw: bytes, served_note: str,
    logged: v2.LoggedStatement, pending: str,
) -> str:
    """The words for a checkpoint the policy finds witnessed; ``LogFailed``
    otherwise, after asking the other notaries what they witnessed (a fork
    they show is equivocation, its evidence kept)."""
    assert logged.checkpoint is not None and logged.note is not None
    try:
        judged = policy.judge(served_note, now=int(time.time()))
    except tlog.NoteError as exc:
        raise LogFailed(f"its checkpoint's signature lines are malformed ({exc})") from None
    if judged.witnessed:
        return f", witnessed by {', '.join(judged.cosigned)}"
    peers = [p for p in (witnesses.peers if witnesses else ()) if p.name != bundle.name]
    seen = await witnessing.views(peers, origin, public_raw, policy, relay, resolver)
    for view in seen:
        await _hold_view(bundle, relay, resolver, checkpoints, origin, public_raw, logged, view)
    held = "".join(
        f"; {', '.join(v.witnesses)} (at {v.peer}) hold size {v.checkpoint.size}" for v in seen
    )
    raise LogFailed(f"its checkpoint is not witnessed: {judged.describe()} ({pending}){held}")


async def _hold_view(
    bundle: Bundle, relay: Bundle | None, resolver: Resolver,
    checkpoints: CheckpointBook | None, origin: str, public_raw: bytes,
    logged: v2.LoggedStatement, view: witnessing.WitnessView,
) -> None:
    """``LogFailed`` (equivocation, both checkpoints kept) when the shown
    checkpoint and the witness's view are not one history: another root at
    one size, or no verifying consistency proof from the notary."""
    assert logged.checkpoint is not None and logged.note is not None
    shown, held = logged.checkpoint, view.checkpoint
    who = f"{', '.join(view.witnesses)} (asked at {view.peer})"
    if shown.size == held.size:
        if shown.root == held.root:
            return
        problem = f"witness {who} holds another checkpoint of size {shown.size}"
    else:
        small, large = (shown, held) if shown.size < held.size else (held, shown)
        proof = await consistency_proof(bundle, relay, resolver, small.size, large.size)
        try:
            if proof is None:
                raise tlog.ProofError("no proof")
            tlog.verify_consistency(small.size, large.size, small.root, large.root, proof)
            return
        except tlog.ProofError:
            problem = (
                f"witness {who} holds a checkpoint of size {held.size} it cannot prove its "
                f"size {shown.size} consistent with"
            )
    where = ""
    if checkpoints is not None:
        older, newer = (view.note, logged.note) if held.size <= shown.size else (
            logged.note, view.note
        )
        where = f" (both kept in {checkpoints.keep_evidence(origin, public_raw, older, newer)})"
    raise LogFailed(f"equivocating: {problem}{where}")


async def _hold_consistent(
    bundle: Bundle, relay: Bundle | None, resolver: Resolver, checkpoints: CheckpointBook,
    origin: str, public_raw: bytes, logged: v2.LoggedStatement,
) -> str:
    """Hold the checkpoint of ``logged`` consistent with the one kept for
    the log (and keep the larger); the words to add to the row.
    ``LogFailed`` for a log that forked or shrank; the book's
    ``UsageError`` propagates."""
    assert logged.checkpoint is not None and logged.note is not None
    stored = checkpoints.last(origin, public_raw)
    if stored is None:
        checkpoints.remember(origin, public_raw, logged.note)
        return ""
    seen, shown = stored.checkpoint, logged.checkpoint
    older, newer = (stored.note, logged.note) if seen.size <= shown.size else (
        logged.note, stored.note
    )
    small, large = (seen, shown) if seen.size <= shown.size else (shown, seen)
    if small.size == large.size:
        if small.root != large.root:  # two signed trees of one size: proof enough
            evidence = checkpoints.keep_evidence(origin, public_raw, older, newer)
            raise LogFailed(
                f"equivocating: two checkpoints of size {small.size} with other roots "
                f"(both kept in {evidence})"
            )
    else:
        proof = await consistency_proof(bundle, relay, resolver, small.size, large.size)
        if proof is None:  # it signed a larger log than it now has
            evidence = checkpoints.keep_evidence(origin, public_raw, older, newer)
            raise LogFailed(
                f"truncated: it signed a log of size {large.size}, now has fewer entries "
                f"(both checkpoints kept in {evidence})"
            )
        try:
            tlog.verify_consistency(small.size, large.size, small.root, large.root, proof)
        except tlog.ProofError:
            # A faulty proof or a forked log: only the entries tell, which
            # a check does not download (``notary log watch`` does).
            evidence = checkpoints.keep_evidence(origin, public_raw, older, newer)
            raise LogFailed(
                f"its consistency proof from size {small.size} to {large.size} does not "
                f"verify: a faulty answer or a forked log (both checkpoints kept in "
                f"{evidence}; `notary log watch` settles which from the entries)"
            ) from None
    if shown.size > seen.size:
        checkpoints.remember(origin, public_raw, logged.note)
    return f", consistent with size {seen.size} seen before"


async def consistency_proof(
    bundle: Bundle, relay: Bundle | None, resolver: Resolver, old_size: int, new_size: int
) -> list[bytes] | None:
    """RFC 9162's consistency proof between two sizes of the notary's log,
    from ``/v2/log/proof/consistency``; None when the notary answers that
    its log is not ``new_size`` large (404). ``LogFailed`` (a connectivity
    failure) when it cannot be had; a malformed proof is a failure."""
    path = f"/v2/log/proof/consistency?old={old_size}&new={new_size}"
    try:
        response, _ = await exchange(bundle, relay, resolver, lambda h: http_request(
            "GET", path, h
        ))
    except NotaryFailed as failed:
        raise LogFailed(
            f"no consistency proof ({failed.detail})", Verdict.CONNECTIVITY_FAILURE
        ) from None
    if response.status == 404:
        return None
    if response.status != 200:
        raise LogFailed(
            f"no consistency proof (HTTP {response.status})", Verdict.CONNECTIVITY_FAILURE
        )
    proof: list[bytes] = []
    for line in response.body.split(b"\n"):
        if not line:
            continue
        try:
            node = base64.b64decode(line, validate=True)
        except ValueError:
            node = b""
        if len(node) != tlog.HASH_SIZE or len(proof) >= MAX_PROOF_HASHES:
            raise LogFailed("a malformed consistency proof")
        proof.append(node)
    return proof
