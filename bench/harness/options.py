"""The command-line options the benchmarks share: the load benchmarks'
(``load_parser``, completed by ``finish_load_args``) and the
micro-benchmarks' (``argument_parser``, ``repetitions``)."""

from __future__ import annotations

import argparse


def load_parser(description: str, *, rounds: int, quick: str, cpus: str = "the servers",
                wait_quiet: str = "", connections: int | None = 64, threads: int = 1,
                duration: int = 10) -> argparse.ArgumentParser:
    """The load benchmarks' options (``finish_load_args`` fills those that depend on --quick)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--duration", type=int, default=None, help=f"seconds per wrk run (default {duration})")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"runs of each row, interleaved (default {rounds})")
    if connections is not None:  # None: the script adds its own
        parser.add_argument("--connections", type=int, default=connections,
                            help=f"wrk -c (default {connections})")
    parser.add_argument("--threads", type=int, default=threads, help=f"wrk -t (default {threads})")
    parser.add_argument("--server-cpu", type=int, help=f"core for {cpus} (default: first)")
    parser.add_argument("--client-cpu", type=int, help="core for the client (default: second)")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="first wait up to SECONDS for the cores to be idle (shared "
                        f"machines){wait_quiet}")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.set_defaults(default_rounds=rounds, default_duration=duration)
    return parser


def finish_load_args(args: argparse.Namespace, *, quick_rounds: int = 1) -> argparse.Namespace:
    if args.duration is None:
        args.duration = 2 if args.quick else args.default_duration
    if args.rounds is None:
        args.rounds = quick_rounds if args.quick else args.default_rounds
    return args


def argument_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the options every micro-benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes and one repetition: "
                        "a smoke run of a few seconds, not a measurement")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions per measurement, "
                        "the best is kept (default: see the script; 1 with --quick)")
    return parser


def repetitions(args: argparse.Namespace, full: int) -> int:
    if args.repeat is not None:
        return max(1, args.repeat)
    return 1 if args.quick else full
