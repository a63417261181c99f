"""A WebSocket watcher for the tests: ``notary.client.check.watch`` of one
target on one notary host (loopback), its verified events collected."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from notary.client import check as client
from notary.model.targets import Target
from notary.protocol.bundle import BundleHost, make_bundle

WATCH_START_TIMEOUT_S = 20.0


@dataclass
class Watcher:
    """The events received so far; ``next_event`` waits for one more."""

    events: list[client.WatchEvent] = field(default_factory=list)
    _arrived: trio.Event = field(default_factory=trio.Event)

    def _on_event(self, event: client.WatchEvent) -> None:
        self.events.append(event)
        self._arrived.set()

    async def next_event(self, timeout_s: float) -> client.WatchEvent:
        """The next event (one not returned before), within ``timeout_s``."""
        seen = len(self.events)
        with trio.fail_after(timeout_s):
            while len(self.events) <= seen:
                self._arrived = trio.Event()
                await self._arrived.wait()
        return self.events[seen]


@asynccontextmanager
async def watching(port: int, certificate_pem: str, target: Target) -> AsyncIterator[Watcher]:
    """Watch ``target`` on the notary at 127.0.0.1:``port`` (pinned to its
    ``certificate_pem``) from when the watch is acknowledged until the block
    exits."""
    bundle = make_bundle(
        name="Watched", location="https://127.0.0.1/w.notary",
        hosts=[BundleHost("127.0.0.1", port, 80, certificate_pem)],
    )
    watcher = Watcher()
    acknowledged = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: client.watch(
            bundle, [target], on_event=watcher._on_event,
            on_watching=lambda _: acknowledged.set(), resolver=lambda host, port: None,
        ))
        with trio.fail_after(WATCH_START_TIMEOUT_S):
            await acknowledged.wait()
        yield watcher
        nursery.cancel_scope.cancel()
