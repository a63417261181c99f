"""Waiting, in a test, for something that announces nothing (a counter, an
HTTP answer): poll it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


async def wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    """Poll ``check`` until it is true; ``trio.TooSlowError`` after ``timeout_s``."""
    with trio.fail_after(timeout_s):
        while not await check():  # noqa: ASYNC110
            await trio.sleep(0.02)
