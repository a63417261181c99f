"""A probe of several addresses (``notary.model.observations``): the report,
the current set, how often a probe samples, and what a change is."""

from __future__ import annotations

import pytest

from notary.model.observations import (
    Observation,
    ProbeReport,
    Timeline,
    TimelineLimits,
    is_change,
    samples_per_address,
)
from notary.model.targets import Target
from tests.support.observations import certificate, probe_result

HOST = "www.example.test"
TARGET = Target(HOST, 443)
T0 = 1_700_000_000
DAY = 86400
A, B, C = "a.example.test", "b.example.test", "c.example.test"


def report(*seen: tuple[str, str], at: int = T0, failures=()) -> ProbeReport:
    """A report of handshakes showing ``(certificate name, address)`` at ``at``."""
    results = tuple(probe_result(HOST, cert=name, address=address, at=at) for name, address in seen)
    addresses = tuple(dict.fromkeys([*(a for _, a in seen), *(a for a, _ in failures)]))
    return ProbeReport(TARGET, results, addresses, tuple(failures), at)


def timeline_of(*observations: tuple[str, int]) -> Timeline:
    """A timeline of ``(certificate name, last seen)``, each first seen then."""
    return Timeline(TARGET, tuple(Observation(certificate(n), at, at) for n, at in observations))


def test_a_report_says_what_each_address_served() -> None:
    made = report((A, "192.0.2.1"), (B, "192.0.2.2"), (C, "192.0.2.2"), (B, "192.0.2.2"),
                  (A, "2001:db8::1"), failures=[("192.0.2.9", "timeout")])
    assert made.primary.address == "192.0.2.1" and made.primary.leaf == certificate(A)
    assert made.leaves == (certificate(A), certificate(B), certificate(C))
    assert made.served == {
        "192.0.2.1": (certificate(A),),
        "192.0.2.2": (certificate(B), certificate(C)),
        "2001:db8::1": (certificate(A),),
    }
    assert made.handshakes == 5
    assert [(r.leaf, r.address) for r in made.sightings] == [
        (certificate(A), "192.0.2.1"), (certificate(B), "192.0.2.2"),
        (certificate(C), "192.0.2.2"), (certificate(A), "2001:db8::1"),
    ]
    assert made.addresses == ("192.0.2.1", "192.0.2.2", "2001:db8::1", "192.0.2.9")
    assert made.failures == (("192.0.2.9", "timeout"),)


def test_a_report_needs_a_result_of_its_own_target() -> None:
    with pytest.raises(ValueError):
        ProbeReport(TARGET, (), ("192.0.2.1",), (("192.0.2.1", "connect"),), T0)
    with pytest.raises(ValueError):
        ProbeReport(TARGET, (probe_result("other.example.test"),), ("192.0.2.1",))
    single = probe_result(HOST)
    assert ProbeReport.of(single) == ProbeReport(TARGET, (single,), (single.address,), (), T0)


def test_merging_a_report_is_the_fold_of_its_sightings() -> None:
    made = report((A, "192.0.2.1"), (B, "192.0.2.2"), (A, "192.0.2.3"), (A, "192.0.2.1"))
    limits = TimelineLimits(max_certificates_per_target=2)
    before = timeline_of((C, T0 - 10))
    folded = before
    for result in made.sightings:
        folded = folded.merged(result, 3600, limits)
    assert before.merged(made, 3600, limits) == folded
    merged = timeline_of().merged(made)
    by_certificate = {o.certificate: o for o in merged.observations}
    assert by_certificate[certificate(A)].addresses == ("192.0.2.3", "192.0.2.1")
    assert by_certificate[certificate(B)].addresses == ("192.0.2.2",)
    assert {o.last_seen for o in merged.observations} == {T0}


def test_the_current_set_is_the_fresh_certificates_and_the_newest() -> None:
    timeline = timeline_of((A, T0), (B, T0 - DAY + 1), (C, T0 - DAY - 1))
    assert [o.certificate for o in timeline.current(T0, DAY)] == [certificate(A), certificate(B)]
    stale = timeline_of((A, T0 - 3 * DAY), (B, T0 - 4 * DAY))
    assert [o.certificate for o in stale.current(T0, DAY)] == [certificate(A)]
    assert timeline_of().current(T0, DAY) == ()


def test_a_target_seen_serving_several_certificates_lately_is_sampled() -> None:
    assert samples_per_address(None, T0, DAY, 4) == 1
    assert samples_per_address(timeline_of(), T0, DAY, 4) == 1
    assert samples_per_address(timeline_of((A, T0)), T0, DAY, 4) == 1
    assert samples_per_address(timeline_of((A, T0), (B, T0 - DAY)), T0, DAY, 4) == 4
    assert samples_per_address(timeline_of((A, T0), (B, T0 - DAY - 1)), T0, DAY, 4) == 1
    assert samples_per_address(timeline_of((A, T0), (B, T0)), T0, DAY, 0) == 1


def test_a_change_is_a_certificate_outside_the_current_set() -> None:
    split = timeline_of((A, T0 - 60), (B, T0 - 60))
    assert not is_change(timeline_of(), report((A, "192.0.2.1")), DAY)  # a first probe
    assert not is_change(split, report((A, "192.0.2.1"), (B, "192.0.2.2")), DAY)
    assert not is_change(split, report((B, "192.0.2.1")), DAY)  # a mix, or only some
    assert is_change(split, report((A, "192.0.2.1"), (C, "192.0.2.2")), DAY)  # a new one
    gone = timeline_of((A, T0 - 60), (B, T0 - 2 * DAY))
    assert is_change(gone, report((B, "192.0.2.1")), DAY)  # back after fresh_for_s
    stale = timeline_of((A, T0 - 3 * DAY))
    assert not is_change(stale, report((A, "192.0.2.1")), DAY)  # the newest stays current
