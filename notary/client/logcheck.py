"""``notary check --v2`` and the notaries' logs (issue 22, docs/v2.md rule
S7): the answer's statement is checked against its log (its inclusion
proof, or its promise while unsequenced) and, with a ``CheckpointBook``,
the notary's log is held consistent with the checkpoint it showed this
client before; a log that forked or shrank is that notary's failure, both
signed checkpoints kept as evidence (``notary.client.checkpoints``).

Error handling: ``LogFailed`` carries the verdict (``FAILURE`` for a log
that does not hold, ``CONNECTIVITY_FAILURE`` when a proof cannot be had
or the client's own memory of the log cannot be read or written) and a
short detail for the notary's row.
"""

from __future__ import annotations

import base64
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.client.checkpoints import CheckpointBook, CheckpointUnreadable
from notary.client.reach import NotaryFailed, exchange, http_request
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
) -> str | None:
    """Check the log member of the (verified) answer's statement: its
    inclusion proof or its promise (rule S7) and, with ``checkpoints``,
    the consistency of the notary's log with the checkpoint it showed this
    client before. When ``bundle`` pins the log (its ``log`` member), the
    statement must promise that log, and its checkpoint must be signed by
    the key the bundle pins; a bundle without it keeps to the statement's
    own promise and key, and the row says so. Returns the words for the
    notary's row (None: the notary keeps no log and its bundle pins none).
    ``LogFailed`` when the log does not hold."""
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
    if logged.checkpoint is None or logged.note is None:
        return f"log: promised by {promise.merge_by}{unpinned}"
    words = f"logged at {logged.index} of {logged.checkpoint.size}"
    if checkpoints is None:
        return words + unpinned
    try:
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
