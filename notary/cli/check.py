"""``notary check`` (ask several notaries which certificate a site serves,
and vote) and ``notary watch`` (print a site's certificate changes as a
notary sees them). Their output is ``notary.cli.report``'s."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import trio

from notary.cli.args import NOTARIES_HELP, add_witness_options, check_timeout, fingerprint_option
from notary.cli.output import cell, when
from notary.cli.report import report_json, report_table
from notary.errors import BadTarget, UsageError
from notary.model.targets import Target, make_target
from notary.protocol.voting import Outcome, Threshold


def add_check(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "check", help="ask several notaries which certificate a site serves, and vote"
    )
    check.add_argument("site", metavar="HOST[:PORT]")
    check.add_argument("--fingerprint", metavar="SHA1", help="check this one, not the site's")
    check.add_argument("--notary", action="append", type=Path, default=[], metavar="FILE.notary")
    check.add_argument("--notaries", type=Path, metavar="DIR", help=NOTARIES_HELP)
    check.add_argument("--quorum", type=int, default=3, metavar="N", help="notaries to ask")
    check.add_argument("--threshold", choices=[t.value for t in Threshold], default="majority")
    check.add_argument("--strict", action="store_true",
                       help="notaries that do not answer count against")
    check.add_argument("--bounce", default="auto", metavar="auto|off|FILE.notary")
    check.add_argument("--timeout", type=float, default=10.0, metavar="S")
    check.add_argument("--json", action="store_true")
    check.add_argument("--v2", action="store_true",
                       help="ask through the signed v2 API (Ed25519, nonce, freshness)")
    add_witness_options(check, "with --v2: ")


def add_watch(commands: argparse._SubParsersAction) -> None:
    watch = commands.add_parser(
        "watch", help="print certificate changes of sites as a notary sees them (v2 WebSocket)"
    )
    watch.add_argument("sites", nargs="+", metavar="HOST[:PORT]")
    watch.add_argument("--notary", type=Path, required=True, metavar="FILE.notary")
    watch.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="deadline to connect (the watch itself runs until interrupted)")


#: Exit status of `notary check`: 1 means "rejected by the vote" and
#: nothing else (a notary's failure is its row, never the exit status).
EXIT_VERIFIED, EXIT_REJECTED, EXIT_INCONCLUSIVE, EXIT_SITE_UNREACHABLE = 0, 1, 3, 4
EXIT_CHECK_FAILED = 5


def parse_site(text: str) -> Target:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 literal; port 443
    by default."""
    if text.startswith("["):
        host, bracket, port = text.rpartition("]:")
        host, port = (host + "]", port) if bracket else (text, "443")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, "443"
    try:
        return make_target(host, port)
    except BadTarget as exc:
        raise UsageError(f"site {text!r}: {exc}") from None


def cmd_check(args: argparse.Namespace) -> int:
    """`notary check`; any failure but a usage error and an unreachable site
    exits 5 on one line, never 1 (which means "rejected by the vote")."""
    from notary.client import check as client

    try:
        return _check(args)
    except UsageError:
        raise
    except client.SiteUnreachable as exc:
        print(f"notary: cannot fetch the site's certificate: {exc}", file=sys.stderr)
        return EXIT_SITE_UNREACHABLE
    except Exception as exc:
        reason = client.one_line(str(exc) or type(exc).__name__)
        print(f"notary: the check failed: {reason}", file=sys.stderr)
        return EXIT_CHECK_FAILED


def _check(args: argparse.Namespace) -> int:
    from notary.client import check as client
    from notary.client.checkpoints import CheckpointBook, default_checkpoint_dir
    from notary.client.witnesses import WitnessChoice

    check_timeout(args.timeout)
    target = parse_site(args.site)
    fingerprint = fingerprint_option(args.fingerprint, "--fingerprint")
    directory = args.notaries
    if directory is None and not args.notary:
        directory = client.default_notary_dir()
    bundles = client.load_bundles(args.notary, directory)
    relay: object
    if args.bounce in ("auto", "off"):
        relay = None if args.bounce == "off" else "auto"
    else:  # a local file, as a stored bundle is: a relay is trusted too
        (relay,) = client.load_bundles([Path(args.bounce)], None)
    if (args.witness or args.min_witnesses is not None) and not args.v2:
        raise UsageError("--witness and --min-witnesses need --v2 (the log is v2's)")
    witnesses = WitnessChoice(tuple(args.witness), args.min_witnesses)
    report = trio.run(lambda: client.check(
        target, bundles, fingerprint=fingerprint, quorum=args.quorum,
        threshold=Threshold(args.threshold), strict=args.strict, relay=relay,
        timeout_s=args.timeout, use_v2=args.v2,
        checkpoints=CheckpointBook(default_checkpoint_dir()) if args.v2 else None,
        witnesses=witnesses,
    ))
    now = time.time()
    print(report_json(report) if args.json else report_table(report, now))
    return {
        Outcome.VERIFIED: EXIT_VERIFIED,
        Outcome.REJECTED: EXIT_REJECTED,
        Outcome.INCONCLUSIVE: EXIT_INCONCLUSIVE,
    }[report.tally.outcome]


def cmd_watch(args: argparse.Namespace) -> int:
    from notary.client import check as client

    check_timeout(args.timeout)
    targets = [parse_site(site) for site in args.sites]
    (bundle,) = client.load_bundles([args.notary], None)

    def show_watching(target: Target) -> None:
        print(cell(f"watching {target} on {bundle.name}"), flush=True)

    def show(event: client.WatchEvent) -> None:
        newest = event.observations[0] if event.observations else None
        if newest is None:
            return
        print(
            f"{when(event.signed_at)} {event.target}: certificate sha256={newest.sha256.hex()} "
            f"(seen {when(newest.first_seen)} to {when(newest.last_seen)}, "
            f"{len(event.observations)} known)",
            flush=True,
        )

    trio.run(lambda: client.watch(
        bundle, targets, on_event=show, on_watching=show_watching, timeout_s=args.timeout
    ))
    return 0
