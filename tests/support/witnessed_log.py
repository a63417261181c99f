"""A notary keeping a log that witnesses cosign, for tests: ``open_log_notary``
runs notary A (log origin ``ORIGIN``) in-process with v2, its log and the
given witnesses (each ``{"url", "key", "pin"}``), answering for ``SITE``,
``OTHER`` and ``THIRD`` at one loopback site; a witness cosigns as
``WITNESS_NAME``. The database is the caller's, so a restarted A keeps its
log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.support.notaries import NotaryUnderTest, open_notary

SITE, OTHER, THIRD = "www.example.test", "other.example.test", "third.example.test"
ORIGIN = "a.test/v2/log"
WITNESS_NAME = "b.test/witness"
LOG = {"enabled": True, "origin": ORIGIN, "checkpoint_interval_s": 0.1, "max_merge_delay_s": 30,
       "witness_timeout_s": 2.0, "witness_retry_s": 0.5}


@asynccontextmanager
async def open_log_notary(
    directory: Path, key_path: Path, site_host: str, witnesses: list[dict[str, str]],
    db_file: Path,
) -> AsyncIterator[NotaryUnderTest]:
    async with open_notary(
        directory, names={name: [site_host] for name in (SITE, OTHER, THIRD)}, v2={"key_file": key_path},
        answers={"failures_at_deadline": False}, server={"db_file": db_file},
        log={**LOG, "witnesses": tuple(witnesses)},
    ) as notary:
        yield notary
