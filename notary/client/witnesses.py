"""The client's witnesses (docs/log.md "Witnesses", "Checking a site"):
which witnesses it trusts to have cosigned a notary's checkpoint, how many
it requires, and what it asks them when a checkpoint comes without them.

``WitnessChoice`` is the user's choice: ``--witness VKEY`` (the witnesses
the user trusts; none given: each bundle's ``log.witnesses``) and
``--min-witnesses N`` (none given: the bundle's ``log.min_witnesses``, the
operator's promise, or 1 when the user named witnesses and the bundle
promises none). ``policy_for`` makes a bundle's ``tlog.WitnessPolicy``.

A witness is usually another notary, and the user's other notaries are
those it already trusts: ``views`` asks each of them (``GET
/v2/witness/view/<sha256 of the origin>``, over its pinned TLS) what it
holds of a log, and keeps the views that are signed by the log's key and
cosigned by a witness the policy trusts. A view of the same size as the
checkpoint a notary showed, with another root, is two signed histories:
the evidence of equivocation (``notary.client.logcheck``).

Error handling: a malformed ``--witness`` key or a minimum the trusted
witnesses cannot meet is ``UsageError`` (for a bundle: ``WitnessesUnmet``);
a peer that cannot answer, or answers something that does not verify, gives
no view (it is not that notary's failure).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from notary.client.reach import NotaryFailed, exchange, http_request
from notary.errors import UsageError
from notary.outbound.dialer import Resolver
from notary.protocol import tlog, v2
from notary.protocol.bundle import Bundle

__all__ = ["VIEW_PATH", "WitnessChoice", "WitnessView", "WitnessesUnmet", "view_path", "views"]

#: Where a witness serves the newest checkpoint it holds of a log.
VIEW_PATH = "/v2/witness/view/"
#: Most notaries asked for their view at once.
MAX_PEERS_ASKED = 16
#: How long the views are waited for, at most (a peer that is slow to
#: answer gives none: the row says "not witnessed", not "timed out").
VIEWS_TIMEOUT_S = 3.0


class WitnessesUnmet(UsageError):
    """The policy asks more witnesses than the user or the bundle trusts."""


def view_path(origin: str) -> str:
    """The path of a witness's view of the log ``origin``."""
    return VIEW_PATH + hashlib.sha256(origin.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class WitnessChoice:
    """See the module docstring. ``peers``: the notaries asked for their
    views (the check's trusted notaries)."""

    keys: tuple[str, ...] = ()
    minimum: int | None = None
    peers: tuple[Bundle, ...] = ()

    def __post_init__(self) -> None:
        for key in self.keys:
            try:
                tlog.parse_cosigner_key(key)
            except tlog.NoteError as exc:
                raise UsageError(f"--witness {key[:80]!r}: {exc}") from None
        if len(set(self.keys)) != len(self.keys):
            raise UsageError("--witness: a key is given twice")
        if self.minimum is not None and self.minimum < 0:
            raise UsageError("--min-witnesses must be 0 or more")
        if self.keys and self.minimum is not None and self.minimum > len(self.keys):
            raise UsageError(
                f"--min-witnesses {self.minimum}: only {len(self.keys)} --witness keys given"
            )

    def policy_for(self, bundle: Bundle) -> tlog.WitnessPolicy:
        """The policy for ``bundle``'s log (see the module docstring).
        ``WitnessesUnmet`` when it asks more witnesses than are trusted."""
        promised = bundle.log.min_witnesses if bundle.log is not None else 0
        trusted = self.keys or (bundle.log.witnesses if bundle.log is not None else ())
        default = promised or (1 if self.keys else 0)
        minimum = self.minimum if self.minimum is not None else default
        if minimum > len(trusted):
            raise WitnessesUnmet(
                f"{minimum} witnesses required, but its bundle names {len(trusted)}"
            )
        return tlog.WitnessPolicy(tuple(trusted), minimum)


@dataclass(frozen=True, slots=True)
class WitnessView:
    """What a witness holds of a log, as served by ``peer``: its
    checkpoint, the note as served (the log's signature, the witnesses'
    lines) and the trusted witnesses whose cosignatures on it verified."""

    peer: str
    checkpoint: tlog.Checkpoint
    note: str
    witnesses: tuple[str, ...]


async def views(
    peers: Sequence[Bundle], origin: str, public_raw: bytes, policy: tlog.WitnessPolicy,
    relay: Bundle | None, resolver: Resolver,
) -> list[WitnessView]:
    """The verified views of log ``origin`` (signed by ``public_raw``) that
    ``peers`` serve, asked concurrently (at most ``MAX_PEERS_ASKED``), in
    the order of ``peers``; those not in within ``VIEWS_TIMEOUT_S`` are
    left out (the caller's deadline bounds it too)."""
    found: list[WitnessView | None] = [None] * min(len(peers), MAX_PEERS_ASKED)

    async def ask(position: int, peer: Bundle) -> None:
        found[position] = await _view(peer, origin, public_raw, policy, relay, resolver)

    with trio.move_on_after(VIEWS_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for position, peer in enumerate(peers[:MAX_PEERS_ASKED]):
                nursery.start_soon(ask, position, peer)
    return [view for view in found if view is not None]


async def _view(
    peer: Bundle, origin: str, public_raw: bytes, policy: tlog.WitnessPolicy,
    relay: Bundle | None, resolver: Resolver,
) -> WitnessView | None:
    try:
        response, _ = await exchange(peer, relay, resolver, lambda h: http_request(
            "GET", view_path(origin), h
        ))
    except NotaryFailed:
        return None
    if response.status != 200 or len(response.body) > tlog.MAX_NOTE_BYTES:
        return None
    try:
        note = response.body.decode("utf-8")
        checkpoint = v2.verify_checkpoint(note, origin, public_raw)
        judged = policy.judge(note, now=int(time.time()))
    except (UnicodeDecodeError, v2.VerificationError, tlog.NoteError):
        return None
    if not judged.cosigned:
        return None  # no witness the user trusts vouches for it
    return WitnessView(peer.name, checkpoint, note, judged.cosigned)
