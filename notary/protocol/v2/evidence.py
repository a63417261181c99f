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
        "matched": <index into tlsa> | null   the record that vouched (match only)
      }
    }
"""

from __future__ import annotations

from typing import Any

from notary.model.dane import DaneVerdict, Tlsa

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


def verification(backend: str, dane: DaneVerdict | None) -> dict[str, Any]:
    """The ``verification`` object of a statement decided by ``backend``
    with the DANE verdict ``dane`` (None: no DANE check was made).
    Raises ``ValueError`` for an unknown backend."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}")
    return {"backend": backend, "dane": None if dane is None else _dane(dane)}


def _dane(dane: DaneVerdict) -> dict[str, Any]:
    records, matched = _stated_records(dane)
    return {
        "outcome": dane.outcome.value,
        "dnssec": dane.lookup.status.value,
        "checked_at": dane.lookup.checked_at,
        "sha256": dane.leaf_sha256.hex() if dane.leaf_sha256 else None,
        "tlsa": [str(record) for record in records],
        "matched": matched,
    }


def _stated_records(dane: DaneVerdict) -> tuple[list[Tlsa], int | None]:
    """The records a statement carries and the index among them of the one
    that matched: the first ones, as long as they are at most
    ``MAX_STATEMENT_TLSA`` records and ``MAX_STATEMENT_TLSA_CHARS``
    characters, but the matched record always stays (a client refuses a
    DANE match it cannot see), in its place or last; a record with no data
    has no presentation form to state."""
    matched = dane.matched.record if dane.matched is not None else None
    room = MAX_STATEMENT_TLSA - (matched is not None)
    chars = MAX_STATEMENT_TLSA_CHARS - (len(str(matched)) if matched is not None else 0)
    stated: list[Tlsa] = []
    index = None
    for record in dane.lookup.records:
        if not record.data:
            continue
        if index is None and record == matched:
            index = len(stated)
            stated.append(record)
            continue
        size = len(str(record))
        if room and size <= chars:
            stated.append(record)
            room -= 1
            chars -= size
        else:
            room = 0  # the first ones: none after a record left out
    return stated, index
