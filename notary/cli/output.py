"""How the commands print: to a reader that may leave early (a closed pipe
ends the printing, not the command), and cells of a report (times,
durations, and text from a bundle or a notary made safe for one terminal
line)."""

from __future__ import annotations

import os
import sys
import time


def stop_printing() -> None:
    """Send the rest of stdout nowhere: its reader closed the pipe (the
    interpreter's last flush would raise again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_while_read(text: str) -> None:
    """``print`` for a report whose reader may leave early (``notary dev-init
    | head``): once the pipe is closed, the rest goes nowhere and the
    command's work goes on."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        stop_printing()


def when(timestamp: int | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def cell(text: str) -> str:
    """``text`` (a notary's name or detail, from a bundle or a notary) with
    no character that could break a line or drive the terminal."""
    from notary.client.check import one_line

    return one_line(text, limit=None)
