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
#: Most TLSA records a statement carries (an RRset larger than this is cut).
MAX_STATEMENT_TLSA = 16


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
    that matched. An RRset past ``MAX_STATEMENT_TLSA`` is cut, but the
    matched record always stays (a client refuses a DANE match it cannot
    see); a record with no data has no presentation form to state."""
    records = [record for record in dane.lookup.records if record.data]
    found = dane.matched
    if found is None:
        return records[:MAX_STATEMENT_TLSA], None
    index = records.index(found.record)
    if index >= MAX_STATEMENT_TLSA:
        records, index = [*records[:MAX_STATEMENT_TLSA - 1], found.record], MAX_STATEMENT_TLSA - 1
    return records[:MAX_STATEMENT_TLSA], index
