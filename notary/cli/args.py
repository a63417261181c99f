"""What the command families share in reading their arguments: the parser
class whose usage errors become ``UsageError`` (one line, exit status 2),
the help of ``--notaries``, the bounds of ``--timeout``, and a SHA-1
fingerprint given as an option (``--pin``, ``--fingerprint``)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from notary.errors import ProtocolError, UsageError
from notary.protocol.convergence import parse_fingerprint

NOTARIES_HELP = "the client's bundle directory (default: ~/.config/notary/notaries)"


class UsageParser(argparse.ArgumentParser):
    """A parser whose every error is a ``UsageError`` (``main`` prints it on
    one line and exits 2), rather than argparse's usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def check_timeout(timeout: float) -> None:
    if not 0 < timeout <= 3600:
        raise UsageError("--timeout must be between 0 and 3600 seconds")


def fingerprint_option(value: str | None, option: str) -> bytes | None:
    """The SHA-1 fingerprint ``option`` gave (None: not given); a malformed
    one is a ``UsageError`` naming the option."""
    if value is None:
        return None
    try:
        return parse_fingerprint(value)
    except ProtocolError as exc:
        raise UsageError(f"{option}: {exc.message}") from None
