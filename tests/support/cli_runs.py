"""The ``notary`` command run in-process from a Trio test: ``run_cli``."""

from __future__ import annotations

import pytest
import trio

from notary.cli import main


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``notary ARGV`` in a thread (it runs its own Trio loop): its exit
    status, stdout and stderr."""
    capsys.readouterr()
    status = await trio.to_thread.run_sync(main, list(argv))
    out, err = capsys.readouterr()
    return status, out, err
