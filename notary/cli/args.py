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


def add_witness_options(parser: argparse.ArgumentParser, when: str = "") -> None:
    """``--witness VKEY`` and ``--min-witnesses N``: the witnesses the user
    trusts to cosign a notary's log checkpoints (``client.witnesses``);
    ``when`` begins their help (a condition, e.g. "with --v2: ")."""
    parser.add_argument("--witness", action="append", default=[], metavar="VKEY",
                        help=f"{when}a witness you trust to cosign the log's checkpoints "
                             "(repeat; given, only these count; default: the bundle's)")
    parser.add_argument("--min-witnesses", type=int, metavar="N",
                        help=f"{when}cosignatures required on the checkpoint (default: the "
                             "bundle's min_witnesses; 1 with --witness)")


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
