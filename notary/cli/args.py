"""What the command families share in reading their arguments: the parser
class whose usage errors become ``UsageError`` (one line, exit status 2),
the help of ``--notaries``, and the bounds of ``--timeout``."""

from __future__ import annotations

import argparse
from typing import NoReturn

from notary.errors import UsageError

NOTARIES_HELP = "the client's bundle directory (default: ~/.config/notary/notaries)"


class UsageParser(argparse.ArgumentParser):
    """A parser whose every error is a ``UsageError`` (``main`` prints it on
    one line and exits 2), rather than argparse's usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def check_timeout(timeout: float) -> None:
    if not 0 < timeout <= 3600:
        raise UsageError("--timeout must be between 0 and 3600 seconds")
