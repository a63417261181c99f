"""A task waiting on a stream, woken by another: what its wait raised."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing


async def woken_by(wait: Callable[[], Awaitable[object]], wake: Callable[[], object]) -> list[type]:
    """Run ``wait`` in a task until it blocks, then call ``wake`` (a
    close, an interrupt; awaited when it is a coroutine function): the
    exception types the wait ended with (``[]``: it returned)."""
    raised: list[type] = []

    async def waiting() -> None:
        try:
            await wait()
        except trio.ClosedResourceError as exc:
            raised.append(type(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting)
        await trio.testing.wait_all_tasks_blocked()
        woke = wake()
        if isinstance(woke, Awaitable):
            await woke
    return raised


async def still_serves(stream: trio.abc.Stream, peer: trio.abc.Stream) -> None:
    """``stream`` still sends to ``peer`` and receives from it (a woken
    connection's 408 goes out on it)."""
    await stream.send_all(b"408")
    assert await peer.receive_some(10) == b"408"
    await peer.send_all(b"more")
    assert await stream.receive_some(10) == b"more"
