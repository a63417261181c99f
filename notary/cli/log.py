"""``notary log verify|watch``: check a notary's whole transparency log,
or monitor it for a domain's entries and for equivocation."""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path
from typing import Any

import trio

from notary.cli.args import UsageParser, add_witness_options, check_timeout
from notary.cli.output import cell, when
from notary.errors import NotaryError, UsageError


def add_log(commands: argparse._SubParsersAction) -> None:
    log_parser = commands.add_parser(
        "log", help="verify or watch a notary's transparency log (`log verify|watch BUNDLE`)"
    )
    log_commands = log_parser.add_subparsers(
        dest="log_command", required=True, parser_class=UsageParser
    )
    verify = log_commands.add_parser(
        "verify", help="download a notary's whole log and check every entry, tile and the root"
    )
    verify.add_argument("bundle", type=Path, metavar="FILE.notary")
    verify.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="deadline of each request to the notary (default 10)")
    verify.add_argument("--max-problems", type=int, default=100, metavar="N",
                        help="stop reading after N problems (default 100)")
    verify.add_argument("--max-entries", type=int, default=100_000_000, metavar="N",
                        help="read at most the first N entries (default 100000000; 0: all)")
    add_witness_options(verify)
    watch = log_commands.add_parser(
        "watch", help="monitor a notary's log for a domain's entries and for equivocation"
    )
    watch.add_argument("bundle", type=Path, metavar="FILE.notary")
    watch.add_argument("--domain", required=True, help="print entries for it and its subdomains")
    watch.add_argument("--interval", type=float, default=60.0, metavar="S",
                       help="seconds between polls (default 60)")
    watch.add_argument("--state", type=Path, metavar="FILE",
                       help="the last verified checkpoint (default: one file per notary in "
                            "~/.config/notary/logs)")
    watch.add_argument("--once", action="store_true", help="poll once, then exit")
    watch.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="deadline of each request to the notary (default 10)")
    watch.add_argument("--max-problems", type=int, default=100, metavar="N",
                       help="stop reading after N problems (default 100)")
    add_witness_options(watch)


#: Exit status of `notary log`: 0 consistent, 1 the log is inconsistent,
#: 2 usage error, 3 equivocation (watch), 4 the log could not be read,
#: 5 the command itself failed, 6 a faulty consistency proof (watch: the
#: proof fails but the entries show the checkpoints consistent), 7
#: incomplete (verify read only the first --max-entries entries and found
#: no problem in them), 8 the checkpoint lacks the cosignatures required
#: (--witness, --min-witnesses, the bundle's min_witnesses).
EXIT_LOG_OK, EXIT_LOG_INCONSISTENT, EXIT_LOG_EQUIVOCATION = 0, 1, 3
EXIT_LOG_UNREACHABLE, EXIT_LOG_FAILED, EXIT_LOG_FAULTY_PROOF, EXIT_LOG_INCOMPLETE = 4, 5, 6, 7
EXIT_LOG_UNWITNESSED = 8
#: Most problems --max-problems may ask for (each is kept and printed).
MAX_LOG_PROBLEMS = 100_000
#: ``notary log verify`` says how far it got this often (stderr).
LOG_PROGRESS_INTERVAL_S = 10.0


def cmd_log(args: argparse.Namespace) -> int:
    """`notary log verify|watch`; whatever fails is one line on stderr and
    its own exit status (above), never a traceback."""
    from notary.client import check as client
    from notary.client import logmonitor
    from notary.client.witnesses import WitnessChoice

    try:
        check_timeout(args.timeout)
        if not 1 <= args.max_problems <= MAX_LOG_PROBLEMS:
            raise UsageError(f"--max-problems must be between 1 and {MAX_LOG_PROBLEMS}")
        (bundle,) = client.load_bundles([args.bundle], None)
        args.witnesses = WitnessChoice(tuple(args.witness), args.min_witnesses)
        if args.log_command == "verify":
            return _log_verify(bundle, args)
        return _log_watch(bundle, args)
    except UsageError:
        raise
    except logmonitor.LogUnreachable as exc:
        print(f"notary: cannot read the log: {client.one_line(str(exc), None)}", file=sys.stderr)
        return EXIT_LOG_UNREACHABLE
    except logmonitor.Unwitnessed as exc:
        print(f"UNWITNESSED: {client.one_line(str(exc), None)}", flush=True)
        return EXIT_LOG_UNWITNESSED
    except logmonitor.LogInconsistent as exc:
        print(f"INCONSISTENT: {client.one_line(str(exc), None)}", flush=True)
        for problem in exc.problems:
            print(f"problem: {problem.line()}")
        if exc.count > len(exc.problems):
            print(f"... and {exc.count - len(exc.problems)} more problems")
        if exc.stopped:
            print(f"stopped after {exc.count} problems (--max-problems): the rest was not read")
        return EXIT_LOG_INCONSISTENT
    except logmonitor.FaultyProof as exc:
        print(f"FAULTY PROOF: {client.one_line(str(exc), None)}", flush=True)
        print("no equivocation: nothing saved as evidence; the state keeps the old checkpoint")
        return EXIT_LOG_FAULTY_PROOF
    except logmonitor.Equivocation as exc:
        print(f"EQUIVOCATION: {client.one_line(exc.reason, None)}")
        print("checkpoint kept before:")
        print(exc.old_note, end="" if exc.old_note.endswith("\n") else "\n")
        print("checkpoint served now:")
        print(exc.new_note, end="" if exc.new_note.endswith("\n") else "\n")
        for path in exc.evidence:
            print(f"evidence: {path}")
        return EXIT_LOG_EQUIVOCATION
    except NotaryError as exc:
        print(f"notary: {client.one_line(str(exc), None)}", file=sys.stderr)
        return EXIT_LOG_FAILED
    except Exception as exc:
        reason = client.one_line(str(exc) or type(exc).__name__)
        print(f"notary: the log command failed: {reason}", file=sys.stderr)
        return EXIT_LOG_FAILED


def _log_verify(bundle: Any, args: argparse.Namespace) -> int:
    from notary.client import logmonitor

    if args.max_entries < 0:
        raise UsageError("--max-entries must be 0 (all) or more")
    last_said = [0.0]

    def progress(checked: int, size: int, limit: int) -> None:
        now = time.monotonic()
        if checked == 0:
            last_said[0] = now
            if limit < size:
                print(f"notary: its checkpoint claims {size} entries, more than --max-entries: "
                      f"only the first {limit} are read", file=sys.stderr, flush=True)
        elif now - last_said[0] >= LOG_PROGRESS_INTERVAL_S and checked < limit:
            last_said[0] = now
            print(f"notary: {checked} of {limit} entries checked", file=sys.stderr, flush=True)

    report = trio.run(lambda: logmonitor.verify_log(
        bundle, timeout_s=args.timeout, max_problems=args.max_problems,
        max_entries=args.max_entries, on_progress=progress, witnesses=args.witnesses,
    ))
    print(cell(f"notary:  {report.notary} ({report.host})"))
    pinned = ("pinned by the bundle" if report.pinned
              else "not pinned: the bundle has no log member; the checkpoint's own origin")
    print(cell(f"log:     {report.origin} ({pinned})"))
    if report.size is not None and report.root is not None:
        print(f"size:    {report.size}")
        print(f"root:    {base64.b64encode(report.root).decode('ascii')}")
        print(f"checked: {report.entries_checked} entries, {report.tiles_checked} hash tiles")
    if report.witnessing is not None:
        print(cell(f"witnessed: {report.witnessing.describe()}"))
    for problem in report.problems:
        print(f"problem: {problem.line()}")
    if report.problem_count > len(report.problems):
        print(f"... and {report.problem_count - len(report.problems)} more problems")
    if report.stopped:
        print(f"stopped after {report.problem_count} problems (--max-problems): "
              "the rest of the log was not read")
    if not report.consistent:
        print(f"INCONSISTENT: {report.problem_count} problems")
        return EXIT_LOG_INCONSISTENT
    if report.entries_limit is not None:
        print(f"INCOMPLETE: the first {report.entries_limit} of {report.size} entries are "
              "consistent and proven the start of the signed tree; the rest was not read "
              "(--max-entries)")
        return EXIT_LOG_INCOMPLETE
    print("consistent: every entry is signed, the tiles and the root match the checkpoint")
    return EXIT_LOG_OK


def _log_watch(bundle: Any, args: argparse.Namespace) -> int:
    from notary.client import logmonitor

    if not 0 < args.interval <= 86400:
        raise UsageError("--interval must be between 0 and 86400 seconds")
    domain = logmonitor.normalise_domain(args.domain)
    state_path = args.state if args.state is not None else logmonitor.default_state_path(bundle)
    logmonitor.bundle_v2_key(bundle)

    def show_entry(entry: logmonitor.LoggedEntry) -> None:
        sha256 = entry.sha256.hex() if entry.sha256 is not None else "-"
        print(f"{entry.index} {entry.target} sha256={sha256} "
              f"signed_at={when(entry.signed_at)}", flush=True)

    def show_poll(result: logmonitor.PollResult) -> None:
        if result.empty:
            print(cell(f"# {bundle.name}: no log yet (no checkpoint served)"), flush=True)
            return
        grown = (f"{result.old_size} -> {result.new_size} entries"
                 if result.new_size != result.old_size else f"{result.new_size} entries")
        witnessed = f", {result.witnessing.describe()}" if result.witnessing else ""
        print(cell(f"# {result.origin}: {grown}, {result.entries_checked} new entries "
                    f"verified, {result.matched} for {domain}{witnessed}"), flush=True)

    if bundle.log is None:
        print(cell(f"# {bundle.name}: its bundle pins no log (no log member): the origin is "
                    "the one this watch saw first"), flush=True)

    def show_unreachable(exc: logmonitor.LogUnreachable) -> None:
        print(f"notary: cannot read the log (trying again in {args.interval:g} s): "
              f"{exc}", file=sys.stderr, flush=True)

    def show_unwitnessed(exc: logmonitor.Unwitnessed) -> None:
        print(f"notary: {exc} (trying again in {args.interval:g} s)", file=sys.stderr, flush=True)

    if args.once:
        show_poll(trio.run(lambda: logmonitor.poll_log(
            bundle, domain=domain, state_path=state_path, on_entry=show_entry,
            timeout_s=args.timeout, max_problems=args.max_problems, witnesses=args.witnesses,
        )))
        return EXIT_LOG_OK
    trio.run(lambda: logmonitor.watch_log(
        bundle, domain=domain, state_path=state_path, on_entry=show_entry,
        on_poll=show_poll, on_unreachable=show_unreachable, interval_s=args.interval,
        timeout_s=args.timeout, max_problems=args.max_problems, witnesses=args.witnesses,
        on_unwitnessed=show_unwitnessed,
    ))
    return EXIT_LOG_OK
