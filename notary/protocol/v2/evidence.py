"""How a statement says which backend vouched (issue 20; docs/v2.md, rule
S6): the ``verification`` object a notary running DANE adds to every
statement it signs, built here from the target's DANE verdict. A notary
verifying by network perspective alone adds nothing (its statements stay
byte for byte as before).

::

    "verification": {
      "backend": "dane" | "perspective",     which backend decided the answer
      "dane": {                               the DANE check (null: not made)
        "outcome": "match" | "mismatch" | "no-tlsa" | "insecure" | "bogus"
                   | "resolver-failure",
        "dnssec": "secure" | "secure-denial" | "insecure" | "bogus"
                  | "resolver-failure",
        "checked_at": <unix s>,               when the TLSA records were looked up
        "sha256": "<hex>" | null,             the certificate judged (the probed leaf);
                                              null for bogus or resolver-failure when
                                              no certificate was (DNSSEC failed first)
        "tlsa": ["3 1 1 <hex>", ...],         the validated RRset (secure only; at
                                              most 16 records, the matched one among
                                              them; records without data, which can
                                              vouch for nothing, left out)
        "matched": <index into tlsa> | null,  the record that vouched (match only)
        "judged": [                           optional: the other certificates of the
          {"sha256": "<hex>",                 current set judged against the same
           "matched": <index into tlsa> | null}, ...   records (match and mismatch only;
        ]                                     ascending sha256; absent for one certificate)
      }
    }

With several certificates judged (a site serving several at once), the
main one (``sha256``) is the first a record vouches for in SHA-256 order,
else the first judged (``notary.model.dane``, rule 5), and the ``tlsa`` cut
keeps every record that vouched for a stated certificate first
(``_stated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from notary.model.dane import JUDGING, DaneJudgement, DaneVerdict, Tlsa
from notary.protocol.v2.constants import MAX_STATEMENT_OBSERVATIONS

#: The backends a statement may name, and the names of DANE's outcomes and
#: DNSSEC statuses (``notary.model.dane``'s values).
BACKENDS = frozenset({"dane", "perspective"})
DANE_OUTCOMES = frozenset(
    {"match", "mismatch", "no-tlsa", "insecure", "bogus", "resolver-failure"}
)
DNSSEC_STATUSES = frozenset({"secure", "secure-denial", "insecure", "bogus", "resolver-failure"})
#: Most TLSA records a statement carries (an RRset larger than this is cut),
#: and most characters of them: a statement's log entry is at most 65,535
#: bytes (S7), and a site's records (full certificates, matching type 0)
#: could fill that and make its statements unloggable.
MAX_STATEMENT_TLSA = 16
MAX_STATEMENT_TLSA_CHARS = 16 * 1024
#: Most entries of ``judged``: the current set (at most the statement's 64
#: observations) but the main certificate.
MAX_STATEMENT_JUDGED = MAX_STATEMENT_OBSERVATIONS - 1
#: What one ``judged`` entry counts against ``MAX_STATEMENT_TLSA_CHARS`` (its
#: canonical JSON, ``{"matched":null,"sha256":"<64 hex>"}`` and a comma, is
#: at most 93 characters), so that records and entries together keep a
#: statement's log entry within its bound whatever the site serves.
JUDGED_ENTRY_CHARS = 96


def verification(backend: str, dane: DaneVerdict | None) -> dict[str, Any]:
    """The ``verification`` object of a statement decided by ``backend``
    with the DANE verdict ``dane`` (None: no DANE check was made).
    Raises ``ValueError`` for an unknown backend."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    return {"backend": backend, "dane": None if dane is None else _dane(dane)}


def _dane(dane: DaneVerdict) -> dict[str, Any]:
    stated = _stated(dane)
    made: dict[str, Any] = {
        "outcome": dane.outcome.value,
        "dnssec": dane.lookup.status.value,
        "checked_at": dane.lookup.checked_at,
        "sha256": dane.leaf_sha256.hex() if dane.leaf_sha256 else None,
        "tlsa": [str(record) for record in stated.records],
        "matched": stated.matched,
    }
    if stated.judged:
        made["judged"] = [
            {"sha256": sha256.hex(), "matched": matched} for sha256, matched in stated.judged
        ]
    return made


@dataclass(frozen=True, slots=True)
class _Stated:
    """What a statement says of a verdict: the records, the index of the
    main certificate's (None: no match), and each other certificate judged
    that it states with the index of its record (None: none vouches)."""

    records: tuple[Tlsa, ...]
    matched: int | None
    judged: tuple[tuple[bytes, int | None], ...]


def _stated(dane: DaneVerdict) -> _Stated:
    """The evidence of ``dane`` within ``MAX_STATEMENT_TLSA`` records and
    ``MAX_STATEMENT_TLSA_CHARS`` characters (``judged`` entries counting
    ``JUDGED_ENTRY_CHARS`` each), in this order of precedence:

    1. the main certificate's matched record, always (a client refuses a
       DANE match it cannot see), whatever its size;
    2. each other certificate judged, in SHA-256 order, with the record
       that vouched for it when that is not stated already, as long as
       both fit (a record shared with a stated certificate, as a DANE-TA
       anchor, costs nothing more), and at most ``MAX_STATEMENT_JUDGED``
       of them: one that does not is left out of ``judged`` (the
       statement then says nothing of it);
    3. the other records with data, the first ones of the RRset as long as
       they fit, none after the first that does not.

    Records keep their RRset order (a kept one beyond the cut comes after
    those of rule 3: in its place, or last); a record with no data has no
    presentation form to state. With one certificate judged this is the
    cut of a statement before ``judged`` existed, byte for byte."""
    main = dane.matched.record if dane.matched is not None else None
    reserved: list[Tlsa] = [] if main is None else [main]
    room = MAX_STATEMENT_TLSA - len(reserved)
    chars = MAX_STATEMENT_TLSA_CHARS - (len(str(main)) if main is not None else 0)
    judged: list[DaneJudgement] = []
    if dane.outcome in JUDGING:
        for judgement in dane.others:
            if len(judged) == MAX_STATEMENT_JUDGED:
                break  # what a client parses, at most (a site judged more is cut)
            record = judgement.matched.record if judgement.matched is not None else None
            new = record is not None and record not in reserved
            cost = JUDGED_ENTRY_CHARS + (len(str(record)) if new else 0)
            if cost > chars or (new and not room):
                continue
            judged.append(judgement)
            chars -= cost
            if new:
                assert record is not None
                reserved.append(record)
                room -= 1
    stated: list[Tlsa] = []
    placed: dict[Tlsa, int] = {}
    for record in dane.lookup.records:
        if not record.data:
            continue
        if record in reserved and record not in placed:
            placed[record] = len(stated)
            stated.append(record)
            continue
        size = len(str(record))
        if room and size <= chars:
            stated.append(record)
            room -= 1
            chars -= size
        else:
            room = 0  # the first ones: none after a record left out
    return _Stated(
        tuple(stated),
        placed.get(main) if main is not None else None,
        tuple(
            (j.sha256, placed[j.matched.record] if j.matched is not None else None)
            for j in judged
        ),
    )


def stated_vouched(dane: DaneVerdict) -> frozenset[bytes]:
    """The SHA-256s of the certificates that the statement evidence of
    ``dane`` shows a record vouching for (``_stated``: the main one on a
    match, and each judged one stated with its record): a v2 ``match`` for
    another certificate would not be backed by its statement."""
    stated = _stated(dane)
    vouched = {sha256 for sha256, matched in stated.judged if matched is not None}
    if stated.matched is not None:
        vouched.add(dane.leaf_sha256)
    return frozenset(vouched)
