"""What ``notary check`` prints: a table for people, JSON for programs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from notary.cli.output import cell, duration, when
from notary.protocol.convergence import format_fingerprint

if TYPE_CHECKING:
    from notary.client.check import CheckReport, NotaryAnswer


def report_table(report: CheckReport, now: float) -> str:
    """The human output of `notary check`: one row (one line) per notary
    asked, then the verdict line."""
    rows = [("NOTARY", "ANSWERED BY", "VERDICT", "NEWEST OBSERVATION", "SEEN FOR", "DETAIL")]
    for answer in report.answers:
        seen_for = now - answer.seen_since if answer.seen_since is not None else None
        rows.append((
            cell(answer.notary), answer.host or "-", answer.verdict.value,
            when(answer.newest_seen), duration(seen_for), cell(answer.detail) or "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    tally = report.tally
    via = f", bounced via {cell(' then '.join(report.relays))}" if report.relays else ""
    lines.insert(0, (
        f"{report.target} {format_fingerprint(report.fingerprint)} "
        f"({report.threshold.value}{', strict' if report.strict else ''}{via})"
    ))
    lines.append(
        f"{tally.outcome.value}: {tally.successes} of {tally.counted} counted notaries vouch "
        f"for this certificate ({report.threshold.value}); {tally.stood_aside} stood aside"
    )
    return "\n".join(lines)


def report_json(report: CheckReport) -> str:
    """The ``--json`` output of `notary check`: the vote, and per notary its
    row's fields; for a v2 answer also the signed ``consistency`` of the
    site's current set (docs/v2.md, S8; null when the notary sent none)
    and the per-address detail of its statement: ``certificates`` (each
    certificate it stated, with the addresses that served it and whether
    it is current) and ``addresses`` (each address with the certificates it
    served); both empty for a Convergence answer."""
    tally = report.tally
    return json.dumps({
        "target": report.target.key,
        "fingerprint": format_fingerprint(report.fingerprint),
        "threshold": report.threshold.value,
        "strict": report.strict,
        "relays": list(report.relays),
        "outcome": tally.outcome.value,
        "successes": tally.successes,
        "counted": tally.counted,
        "stood_aside": tally.stood_aside,
        "notaries": [
            {
                "name": a.notary, "host": a.host, "verdict": a.verdict.value,
                "status": a.status, "detail": a.detail, "via": a.via,
                "backend": a.backend, "newest_seen": a.newest_seen, "seen_since": a.seen_since,
                **_served_json(a),
            }
            for a in report.answers
        ],
    }, indent=2)


def _served_json(answer: NotaryAnswer) -> dict[str, Any]:
    """``consistency``, ``certificates`` and ``addresses`` of one notary's
    answer in ``report_json``."""
    consistency = answer.consistency
    current = set(consistency.current) if consistency is not None else set()
    served_by: dict[str, list[str]] = {}
    for observation in answer.observations:
        for address in observation.addresses:
            served_by.setdefault(address, []).append(observation.sha256.hex())
    return {
        "consistency": None if consistency is None else {
            "kind": consistency.kind.value,
            "certificates": consistency.certificates,
            "addresses": list(consistency.addresses),
            "current": [sha256.hex() for sha256 in consistency.current],
        },
        "certificates": [
            {
                "sha256": o.sha256.hex(), "sha1": format_fingerprint(o.sha1),
                "spki_sha256": o.spki_sha256.hex(), "first_seen": o.first_seen,
                "last_seen": o.last_seen, "addresses": list(o.addresses),
                "current": o.sha256 in current if consistency is not None else None,
            }
            for o in answer.observations
        ],
        "addresses": [
            {"address": address, "sha256": served_by[address]} for address in sorted(served_by)
        ],
    }
