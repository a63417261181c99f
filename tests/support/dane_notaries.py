"""A notary checking DANE, for tests: ``dane_notary`` runs one in-process
with DANE among its ``[verify] backends`` and v2 on, resolving names as in
production, through the validating resolver at ``stack_resolver`` (a
``tests.support.dnssec`` stack on loopback), and stops it when its block
exits; ``dane_sections`` are the configuration sections that make it so."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from notary.config import Endpoint
from notary.outbound.dialer import system_resolver
from notary.state import crypto
from tests.support.notaries import open_notary


def dane_sections(resolver: tuple[str, int], backends: tuple[str, ...]) -> dict[str, Any]:
    return {
        "verify": {"backends": backends},
        "dns": {"resolvers": (Endpoint(*resolver),), "timeout_s": 1.0},
        "answers": {"failures_at_deadline": False},
    }


@asynccontextmanager
async def dane_notary(
    tmp_path: Path, stack_resolver: tuple[str, int], backends: tuple[str, ...],
    name: str = "n", **sections: Mapping[str, object],
):
    """A notary with DANE among ``backends`` and v2 on, resolving names as
    in production: through the validating resolver (``system_resolver`` is
    given, so the notary picks ``[dns] resolvers``)."""
    key_path = tmp_path / f"{name}-v2.key"
    crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
    settings = dane_sections(stack_resolver, backends) | {"v2": {"key_file": key_path}}
    settings.update(sections)
    async with open_notary(tmp_path / name, resolver=system_resolver, **settings) as notary:
        yield notary
