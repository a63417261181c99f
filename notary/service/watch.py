"""Who is told of what as it happens: the targets each WebSocket connection
watches (``WatchHub``) and the subscribers of the live figures
(``FiguresHub``).

Resource handling: a hub holds references to its subscribers only; each
subscriber owns its bounded send queue and closes itself when it is full
(``Subscriber.push`` never blocks). Nothing here raises to a publisher.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from notary.model.targets import Target

__all__ = ["FiguresHub", "Subscriber", "WatchHub"]


class Subscriber(Protocol):
    """A connection that takes pushed messages without blocking (a full
    queue marks it too slow: its owner closes it)."""

    def push(self, message: bytes) -> None: ...


class WatchHub:
    """Who watches which target: target key -> the send channels of the
    connections watching it. :meth:`publish` never blocks: a full channel
    marks its connection as too slow (rule 1)."""

    def __init__(self) -> None:
        self._watchers: dict[str, set[Subscriber]] = {}
        self.events_published = 0

    def watched(self, key: str) -> bool:
        """Whether any connection watches the target ``key`` (a publisher
        may skip making the entry, a signature, when none does)."""
        return key in self._watchers

    def publish(self, target: Target, entry: bytes) -> None:
        """A probe of ``target`` saw a new certificate; ``entry`` is the
        signed statement (``SignedStatement.entry``)."""
        watchers = self._watchers.get(target.key)
        if not watchers:
            return
        message = (
            b'{"statement":' + entry + b',"target":' + json.dumps(target.key).encode()
            + b',"type":"observation"}'
        )
        self.events_published += 1
        for connection in list(watchers):
            connection.push(message)

    def subscribe(self, key: str, connection: Subscriber) -> None:
        self._watchers.setdefault(key, set()).add(connection)

    def unsubscribe(self, key: str, connection: Subscriber) -> None:
        watchers = self._watchers.get(key)
        if watchers is not None:
            watchers.discard(connection)
            if not watchers:
                del self._watchers[key]

    def watcher_count(self) -> int:
        return sum(len(w) for w in self._watchers.values())


class FiguresHub:
    """Who subscribed to the live figures. :meth:`publish` never blocks: a
    full channel marks its connection as too slow (rule 1)."""

    def __init__(self, source: Callable[[], Awaitable[Mapping[str, object]]] | None) -> None:
        #: Makes a figures document (None: figures are not served).
        self.source = source
        self._subscribers: set[Subscriber] = set()

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, figures: Mapping[str, object]) -> None:
        message = json.dumps(
            {"figures": figures, "id": None, "type": "figures"}, sort_keys=True
        ).encode()
        for connection in list(self._subscribers):
            connection.push(message)

    def subscribe(self, connection: Subscriber) -> None:
        self._subscribers.add(connection)

    def unsubscribe(self, connection: Subscriber) -> None:
        self._subscribers.discard(connection)
