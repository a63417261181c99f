"""The ``notary`` parser (its commands in the order ``--help`` lists them)
and ``main``: parse, run the command, and turn every error into one line on
stderr and an exit status (see ``notary.cli``)."""

from __future__ import annotations

import argparse
import signal
import sys

from notary import __version__
from notary.cli.args import UsageParser
from notary.cli.bundle import add_bundle, cmd_bundle
from notary.cli.check import add_check, add_watch, cmd_check, cmd_watch
from notary.cli.db import add_db, cmd_db
from notary.cli.keys import (
    add_keygen,
    add_keys,
    add_perspectives_entry,
    cmd_keygen,
    cmd_keys,
    cmd_perspectives_entry,
)
from notary.cli.log import add_log, cmd_log
from notary.cli.output import stop_printing
from notary.cli.serve import add_dev_init, add_serve, cmd_dev_init, cmd_serve
from notary.errors import NotaryError, UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="notary", description="A certificate notary (Convergence protocol).")
    parser.add_argument("--version", action="version", version=f"notary {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=UsageParser)
    add_keygen(commands)
    add_bundle(commands)
    add_check(commands)
    add_db(commands)
    add_serve(commands)
    add_watch(commands)
    add_log(commands)
    add_perspectives_entry(commands)
    add_keys(commands)
    add_dev_init(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        #: The command line, for the supervisor to start its workers with.
        args.argv = list(argv) if argv is not None else sys.argv[1:]
        return _COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"notary: error: {exc}", file=sys.stderr)
        return 2
    except NotaryError as exc:
        print(f"notary: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output left (``notary log watch | head``): stop
        # as a shell's SIGPIPE would, without a traceback.
        stop_printing()
        return 128 + signal.SIGPIPE


_COMMANDS = {
    "keygen": cmd_keygen,
    "bundle": cmd_bundle,
    "db": cmd_db,
    "serve": cmd_serve,
    "dev-init": cmd_dev_init,
    "check": cmd_check,
    "perspectives-entry": cmd_perspectives_entry,
    "keys": cmd_keys,
    "watch": cmd_watch,
    "log": cmd_log,
}
