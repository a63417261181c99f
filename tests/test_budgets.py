"""Budgets that must really bound what a client can make the notary do
(issue 17, items 4, 5, 6 and 12), on a running notary on loopback.

Loopback clients are exempt from per-client limits by default, so tests of
per-client budgets set ``exempt_clients = []``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from notary.protocol.targets import Target
from tests.support.notaries import legacy_query, open_notary
from tests.support.tls_targets import closed_port, open_tls_target

NAME = "www.example.test"
NO_EXEMPTIONS = {"exempt_clients": ()}


def sha1_fp(der: bytes) -> str:
    return ":".join(f"{b:02X}" for b in hashlib.sha1(der).digest())


def random_fp(i: int) -> str:
    return ":".join(f"{b:02X}" for b in hashlib.sha1(b"%d" % i).digest())


# -- item 4: what a query registers with the rescan scheduler -----------------------------


async def test_a_query_over_its_probe_budget_registers_nothing(tmp_path: Path) -> None:
    limits = {**NO_EXEMPTIONS, "probes_per_s_per_prefix": 0.01, "probe_burst": 1}
    async with open_tls_target(names=[NAME, "b.example.test"]) as site:
        names = {NAME: [site.host], "b.example.test": [site.host]}
        async with open_notary(tmp_path, names=names, limits=limits) as notary:
            scheduler = notary.running.scheduler
            assert scheduler is not None
            assert (await legacy_query(notary.port, f"{NAME}+{site.port}", None)).status == 200
            refused = await legacy_query(notary.port, f"b.example.test+{site.port}", None)
            assert refused.status == 429
            assert scheduler.due_at(Target(NAME, site.port)) is not None
            assert scheduler.due_at(Target("b.example.test", site.port)) is None
            assert scheduler.statistics().targets_known == 1


async def test_only_targets_a_probe_reached_are_registered(tmp_path: Path) -> None:
    """A name that does not resolve, and a target the policy refuses, are
    never rescanned; a port that refuses connections at an allowed address
    was reached (the scheduler retries it with its back-off)."""
    port = closed_port()
    async with open_notary(
        tmp_path, names={"nowhere.test": []},
        answers={"failures_at_deadline": False},
    ) as notary:
        scheduler = notary.running.scheduler
        assert scheduler is not None
        for target in ("nowhere.test+443", "192.0.2.1+443", f"127.0.0.1+{port}"):
            answer = await legacy_query(notary.port, target, None)
            assert answer.status in (403, 503), target
        assert scheduler.due_at(Target("nowhere.test", 443)) is None
        assert scheduler.due_at(Target("192.0.2.1", 443)) is None
        assert scheduler.due_at(Target("127.0.0.1", port)) is not None
        assert scheduler.statistics().targets_known == 1


async def test_a_v2_entry_over_the_probe_budget_registers_nothing(tmp_path: Path) -> None:
    from tests.support.notaries import open_v2_notary
    from tests.test_v2_server import post_json

    limits = {**NO_EXEMPTIONS, "probes_per_s_per_prefix": 0.01, "probe_burst": 1}
    async with open_tls_target(names=[NAME, "b.example.test"]) as site:
        names = {NAME: [site.host], "b.example.test": [site.host]}
        async with open_v2_notary(tmp_path, names, limits=limits) as notary:
            scheduler = notary.running.scheduler
            assert scheduler is not None
            request = {"nonce": "n-1", "targets": [
                {"host": NAME, "port": site.port},
                {"host": "b.example.test", "port": site.port},
            ]}
            status, _ = await post_json(notary.port, "/v2/query", request)
            assert status == 200
            assert site.accepted == 1  # one entry probed, the other over the budget
            known = [scheduler.due_at(Target(n, site.port)) is not None
                     for n in (NAME, "b.example.test")]
            assert sorted(known) == [False, True]


# -- item 12: a rotation seen by a client within reprobe_after_s ---------------------------


async def test_a_new_certificate_is_probed_within_reprobe_after_s(tmp_path: Path) -> None:
    """A client presenting a fingerprint the notary has not seen makes it
    probe whenever the per-target budget allows (default: 4 a minute, one
    every 15 s), even within ``reprobe_after_s`` (60 s) of the last probe:
    a legitimate rotation gets 200, not a signed 409."""
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path, names={NAME: [site.host]}, rescan={"enabled": False},
        ) as notary:
            target = f"{NAME}+{site.port}"
            old = sha1_fp(site.leaf_der(NAME))
            assert (await legacy_query(notary.port, target, old)).status == 200
            assert site.accepted == 1
            new = sha1_fp(site.replace_certificate(NAME))
            notary.clock.advance(20.0)  # within reprobe_after_s, past the spacing
            assert notary.config.answers.reprobe_after_s > 20
            assert (await legacy_query(notary.port, target, new)).status == 200
            assert site.accepted == 2
            # The budget is spent now: the probe of a moment ago answers.
            assert (await legacy_query(notary.port, target, random_fp(1))).status == 409
            # The old certificate was seen 20 s ago: still vouched for.
            assert (await legacy_query(notary.port, target, old)).status == 200
            assert site.accepted == 2


async def test_without_a_per_target_budget_reprobe_after_s_stops_the_loop(
    tmp_path: Path,
) -> None:
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(
            tmp_path, names={NAME: [site.host]}, rescan={"enabled": False},
            limits={"probes_per_minute_per_target": 0},
        ) as notary:
            target = f"{NAME}+{site.port}"
            assert (await legacy_query(notary.port, target, None)).status == 200
            for i in range(3):
                assert (await legacy_query(notary.port, target, random_fp(i))).status == 409
            assert site.accepted == 1
