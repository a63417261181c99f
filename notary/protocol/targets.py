"""Targets: the ``host:port`` services a notary is asked about.

A ``Target`` is always normalised, so two spellings of one service share one
cache entry, one store row and one probe.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    """A normalised service: ``host`` is a lower-case A-label name without a
    trailing dot, or an IP literal in its compressed form (IPv6 without
    brackets); ``port`` is 1..65535."""

    host: str
    port: int

    @property
    def is_ip_literal(self) -> bool:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return False
        return True

    @property
    def key(self) -> str:
        """The canonical text used as cache and store key: ``host:port``,
        with IPv6 literals in brackets."""
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.key
