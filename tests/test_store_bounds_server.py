"""What a target keeps, end to end (issue 17, item 10): a target that serves a
new certificate at each probe; the answer the cache signs and the answer
read back from the database after a restart drop the same certificates.

Loopback only: the target is a local TLS server reached through an injected
resolver.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tests.support.notaries import legacy_query, open_notary
from tests.support.tls_targets import open_tls_target

NAME = "www.example.test"
LIMITS = {"max_certificates_per_target": 2, "max_runs_per_certificate": 1}


def rows_of(body: bytes) -> list[dict]:
    return json.loads(body)["fingerprintList"]


async def test_the_cache_and_the_store_drop_the_same_certificates(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    async with open_tls_target(names=[NAME]) as site:
        names = {NAME: [site.host]}
        target = f"{NAME}+{site.port}"
        async with open_notary(first, names=names, store=LIMITS) as notary:
            for _ in range(3):
                site.replace_certificate(NAME)
                notary.clock.advance(notary.config.answers.fresh_for_s + 1)  # stale: a probe
                response = await legacy_query(notary.port, target, None)
                assert response.status == 200
            from_cache = rows_of(response.body)
        assert len(from_cache) == 2  # the newest two of four
        async with open_notary(
            second, names=names, store=LIMITS, server={"db_file": first / "notary.db"},
        ) as notary:
            response = await legacy_query(notary.port, target, None)  # fresh: no probe
            assert response.status == 200
            assert rows_of(response.body) == from_cache


async def test_a_served_notary_keeps_its_database_owner_only(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        async with open_tls_target(names=[NAME]) as site:
            async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
                assert (await legacy_query(notary.port, f"{NAME}+{site.port}", None)).status == 200
                for suffix in ("", "-wal", "-shm"):
                    mode = stat.S_IMODE(os.stat(f"{tmp_path / 'notary.db'}{suffix}").st_mode)
                    assert mode == 0o600, suffix
    finally:
        os.umask(previous)
