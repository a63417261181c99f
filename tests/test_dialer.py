"""notary.outbound.dialer's name resolution: the system resolver is asked for absolute
names, so the machine's search domains never complete a name.

No name is resolved here: Trio's custom hostname resolver hook stands in for
``getaddrinfo`` and records what it is asked.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
import trio

from notary.outbound.dialer import absolute_name, system_resolver


class RecordingHostnameResolver(trio.abc.HostnameResolver):
    """Answers every name with 127.0.0.1 and records the names asked."""

    def __init__(self) -> None:
        self.asked: list[bytes] = []

    async def getaddrinfo(
        self, host: bytes | None, port: bytes | str | int | None,
        family: int = 0, type: int = 0, proto: int = 0, flags: int = 0,
    ) -> list[tuple[int, int, int, str, tuple[str, int]]]:
        await trio.lowlevel.checkpoint()
        self.asked.append(host or b"")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", int(port or 0)))]

    async def getnameinfo(
        self, sockaddr: tuple[str, int], flags: int
    ) -> tuple[str, str]:  # pragma: no cover - not used
        raise NotImplementedError


@pytest.fixture
async def recording() -> AsyncIterator[RecordingHostnameResolver]:
    """Installed for the test's Trio run (the hook is per run)."""
    resolver = RecordingHostnameResolver()
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    try:
        yield resolver
    finally:
        trio.socket.set_custom_hostname_resolver(previous)


@pytest.mark.parametrize(
    ("host", "asked"),
    [
        ("www.example.test", b"www.example.test."),
        ("xn--bcher-kva.example.test", b"xn--bcher-kva.example.test."),
        ("www.example.test.", b"www.example.test."),  # already absolute
        ("localhost", b"localhost"),  # answered by the machine itself (RFC 6761)
        ("www.localhost", b"www.localhost"),
    ],
)
async def test_the_system_resolver_asks_for_absolute_names(
    recording: RecordingHostnameResolver, host: str, asked: bytes
) -> None:
    assert await system_resolver(host, 443) == ["127.0.0.1"]
    assert recording.asked == [asked]


@pytest.mark.parametrize("literal", ["127.0.0.1", "::1", "192.0.2.1"])
async def test_ip_literals_are_not_looked_up(
    recording: RecordingHostnameResolver, literal: str
) -> None:
    assert absolute_name(literal) == literal
    assert await system_resolver(literal, 443) == [literal]
    assert recording.asked == []
