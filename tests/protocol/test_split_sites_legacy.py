"""The legacy protocols' answers for sites that serve several certificates at
once (issue 31, item 3), judged by what each legacy client does with them.
No behaviour of the notary changes here: these tests pin what its answers
already mean for a split or rotating site. Timelines are built from
sightings at several addresses (``tests.support.observations``), as the
prober probing every address records them; no network.

- Convergence (2011): 200 for any certificate of the current set, and the
  add-on counts a 200 listing its fingerprint as a success; a certificate
  nobody serves gets a 409 whose signed list holds the whole current set.
- Perspectives (2008): each key is listed with its own timespans. The
  client's quorum logic is reimplemented below from its source, and shows
  what it makes of them: it does **not** accept each key of a split site.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from notary.model.consistency import consistency_of
from notary.model.observations import Timeline
from notary.protocol import convergence, perspectives
from notary.protocol.voting import Verdict, classify
from tests.support.observations import certificate, sightings_timeline

DAY = 86400
HOUR = 3600
NOW = 1_770_000_000
FRESH_FOR_S = DAY
#: Each address of the split site serves its own certificate; a fourth
#: serves the third's. The rotating site alternates two certificates on one
#: address, and serves the first on another.
SPLIT = (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.4"), ("c", "::1"))
ROTATING = (("a", "127.0.0.5"), ("b", "127.0.0.5"), ("a", "127.0.0.6"))
SITES = {"split": SPLIT, "rotating": ROTATING}


def observed(layout: tuple[tuple[str, str], ...], *, days: float, offset_s: int = 0) -> Timeline:
    """A notary's timeline of a site probed every 6 hours for ``days`` up
    to ``NOW - offset_s``, every address answering at each probe (each
    probe reaching every address in the same second)."""
    probes = range(NOW - offset_s - int(days * DAY), NOW - offset_s + 1, 6 * HOUR)
    return sightings_timeline(
        [(cert, address, at) for at in probes for cert, address in layout]
    )


# -- Convergence ---------------------------------------------------------------------


@pytest.mark.parametrize("site", sorted(SITES))
def test_convergence_vouches_for_each_certificate_of_the_current_set(site: str) -> None:
    timeline = observed(SITES[site], days=3)
    current = consistency_of(timeline, now=NOW, fresh_for_s=FRESH_FOR_S)
    assert current is not None and current.kind.value == site
    payload = convergence.signed_payload(convergence.entries_of(timeline))
    listed = {e.sha1 for e in convergence.parse_answer(
        convergence.answer_body(payload, "AAAA")).entries}
    for name in sorted({cert for cert, _ in SITES[site]}):
        sha1 = certificate(name).sha1
        status = convergence.answer_status(
            timeline, sha1, NOW, FRESH_FOR_S, reprobe_after_s=300
        )
        assert status == 200
        assert convergence.status_of(timeline, sha1, now=NOW, fresh_for_s=FRESH_FOR_S) == 200
        # The 2011 add-on (PROTOCOLS.md 1.7): a 200 listing it is a success.
        assert classify(status, listed=sha1 in listed, signature_ok=True) is Verdict.SUCCESS


@pytest.mark.parametrize("site", sorted(SITES))
def test_a_certificate_nobody_serves_gets_a_409_listing_the_whole_current_set(site: str) -> None:
    timeline = observed(SITES[site], days=3)
    intruder = certificate("man-in-the-middle").sha1
    assert convergence.answer_status(timeline, intruder, NOW, FRESH_FOR_S, 300) == 409
    payload = convergence.signed_payload(convergence.entries_of(timeline))
    listed = {e.sha1 for e in convergence.parse_answer(
        convergence.answer_body(payload, "AAAA")).entries}
    current = consistency_of(timeline, now=NOW, fresh_for_s=FRESH_FOR_S)
    assert current is not None
    current_sha1 = {o.certificate.sha1 for o in timeline.observations
                    if o.certificate.sha256 in current.current}
    assert current_sha1 <= listed and intruder not in listed
    assert classify(409, listed=False, signature_ok=True) is Verdict.FAILURE


# -- Perspectives: the client's quorum logic, reimplemented --------------------------


@dataclass(frozen=True)
class NotaryResult:
    """One notary's reply as the client holds it: ``obs`` is
    ``[(key, [(start, end), ...]), ...]`` in the reply's order."""

    server: str
    obs: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]


class PerspectivesClientPolicy:
    """The Perspectives Firefox client's quorum logic, rewritten in Python to
    see what it makes of a notary's replies: read from
    ``danwent/Perspectives``, ``plugin/chrome/content/client_policy.js``
    (``Pers_client_policy``: ``find_key_at_time``, ``find_most_recent``,
    ``find_oldest_most_recent``, ``get_num_valid_notaries``,
    ``check_current_consistency``, ``has_quorum_at_time``,
    ``get_quorum_duration``, ``key_weakly_seen_by_quorum``,
    ``inconsistency_check``, ``calc_longest_timespan``) and its caller
    ``notaries.js`` (``notaryQueriesComplete``: quorum = 75 % of the
    notaries, rounded, at least 1; ``max_stale_sec`` 2 days), with the
    defaults of ``plugin/defaults/preferences/prefs.js``
    (``weak_consistency_time_limit`` 30 days,
    ``max_timespan_for_inconsistency_test`` 7 days). The 2008 extension's
    ``notary_util.js`` has the same current-consistency and quorum-duration
    functions as plain functions (``get_quorum_duration(test_key, results,
    quorum_size, stale_limit_secs)``); the strict check below is that one.

    The point that matters here: the current consistency counts, for each
    notary, the one key ``find_key_at_time`` returns at that notary's
    newest time: the first key in the reply whose timespan covers it.
    """

    def __init__(self, results: list[NotaryResult], now: int) -> None:
        self.results = results
        self.now = now

    @staticmethod
    def most_recent(result: NotaryResult) -> int:
        return max((end for _, spans in result.obs for _, end in spans), default=0)

    @staticmethod
    def key_at(result: NotaryResult, moment: int) -> str | None:
        for key, spans in result.obs:
            if any(start <= moment <= end for start, end in spans):
                return key
        return None

    def valid_notaries(self, key: str, stale_limit_s: int) -> int:
        stale_limit = self.now - stale_limit_s
        count = 0
        for result in self.results:
            newest = self.most_recent(result)
            if newest == 0 or newest < stale_limit:
                continue
            if self.key_at(result, newest) == key:
                count += 1
        return count

    def currently_consistent(self, key: str, quorum: int, stale_limit_s: int) -> bool:
        return quorum >= 1 and self.valid_notaries(key, stale_limit_s) >= quorum

    def quorum_at(self, key: str, quorum: int, moment: int) -> bool:
        return sum(
            1 for r in self.results if r.obs and self.key_at(r, moment) == key
        ) >= quorum

    def quorum_duration(self, key: str, quorum: int, stale_limit_s: int) -> int:
        """-1 when the key fails the current consistency, else seconds."""
        if not self.currently_consistent(key, quorum, stale_limit_s):
            return -1
        stale_limit = self.now - stale_limit_s
        oldest_most_recent = self.now + stale_limit_s
        for result in self.results:
            newest = self.most_recent(result)
            if newest and newest < oldest_most_recent and newest > stale_limit:
                oldest_most_recent = newest
        changes = sorted(
            {t for r in self.results for _, spans in r.obs for span in spans for t in span},
            reverse=True,
        )
        oldest_valid = self.now
        for moment in changes:
            if moment > oldest_most_recent:
                continue
            if not self.quorum_at(key, quorum, moment):
                break
            oldest_valid = moment
        return max(self.now - oldest_valid + 1, 0)

    def weakly_seen(self, key: str, quorum: int, check_days: int) -> bool:
        cutoff = self.now - check_days * DAY
        seen = sum(
            1 for r in self.results for k, spans in r.obs
            if k == key and any(end >= cutoff for _, end in spans)
        )
        return seen >= quorum

    def inconsistent(self, max_timespan_days: int, check_days: int) -> bool:
        if len({k for r in self.results for k, _ in r.obs}) <= 1:
            return False
        cutoff = self.now - check_days * DAY
        for result in self.results:
            longest = max(
                (end - start for _, spans in result.obs for start, end in spans if end >= cutoff),
                default=0,
            )
            if longest / DAY > max_timespan_days:
                return False
        return True


def quorum_of(notaries: int) -> int:
    return min(max(round(notaries * 0.75), 1), notaries)


def replies(layout: tuple[tuple[str, str], ...], *, days: float) -> list[NotaryResult]:
    """Four notaries' replies for the site, each probing on its own
    schedule, taken apart by the reply parser (keys in the reply's order)."""
    made = []
    for index in range(4):
        timeline = observed(layout, days=days, offset_s=index * 600)
        keys = perspectives.keys_of(timeline)
        parsed = perspectives.parse_reply(perspectives.reply_xml(keys, "AAAA"))
        made.append(NotaryResult(f"notary-{index}", tuple(
            (perspectives.format_md5_fingerprint(key.md5), tuple(key.timespans))
            for key in parsed.keys
        )))
    return made


def fingerprint(name: str) -> str:
    return perspectives.format_md5_fingerprint(certificate(name).md5)


@pytest.mark.parametrize("site", sorted(SITES))
def test_each_key_is_listed_with_its_timespans(site: str) -> None:
    names = sorted({cert for cert, _ in SITES[site]})
    for result in replies(SITES[site], days=3):
        listed = dict(result.obs)
        assert set(listed) == {fingerprint(name) for name in names}
        for spans in listed.values():  # probed every 6 h: one run each, up to the newest probe
            assert len(spans) == 1 and spans[0][1] >= NOW - 3600


@pytest.mark.parametrize("site", sorted(SITES))
def test_the_2008_quorum_check_accepts_one_key_of_a_split_site_only(site: str) -> None:
    """What the notary cannot change: every notary saw every key at its
    newest time, and the client counts only the first of them in the reply
    (keys are in MD5 order, as the original notaries wrote them), so one
    key passes the current-consistency check and the others fail it
    (quorum duration -1: "inconsistent" in the client). The request names
    no key, so no reply can favour the one the client holds."""
    results = replies(SITES[site], days=3)
    policy = PerspectivesClientPolicy(results, NOW)
    quorum = quorum_of(len(results))
    names = sorted({cert for cert, _ in SITES[site]})
    durations = {name: policy.quorum_duration(fingerprint(name), quorum, 2 * DAY) for name in names}
    first = min(names, key=lambda name: certificate(name).md5)
    assert durations[first] > 2 * DAY
    assert all(durations[name] == -1 for name in names if name != first)


@pytest.mark.parametrize("site", sorted(SITES))
def test_weak_consistency_accepts_every_key_only_for_a_week(site: str) -> None:
    """The client's "weak consistency" (for a certificate the browser
    already trusts): every key seen by a quorum in 30 days, and no notary
    with a timespan longer than 7 days. A site served so for 3 days passes
    it for each key; one served so for 10 days no longer does: a notary
    never cuts a run it observed (PROTOCOLS.md 2.4)."""
    names = sorted({cert for cert, _ in SITES[site]})
    for days, accepted in ((3, True), (10, False)):
        results = replies(SITES[site], days=days)
        policy = PerspectivesClientPolicy(results, NOW)
        quorum = quorum_of(len(results))
        assert all(policy.weakly_seen(fingerprint(name), quorum, 30) for name in names)
        assert policy.inconsistent(7, 30) is accepted


def test_a_stable_site_passes_the_2008_quorum_check() -> None:
    """The reimplementation agrees with the client's purpose on the plain
    case: one certificate at several addresses is accepted."""
    results = replies((("a", "127.0.0.2"), ("a", "127.0.0.3")), days=3)
    policy = PerspectivesClientPolicy(results, NOW)
    assert policy.quorum_duration(fingerprint("a"), quorum_of(4), 2 * DAY) > 2 * DAY
    assert policy.quorum_duration(fingerprint("b"), quorum_of(4), 2 * DAY) == -1
