"""``notary serve`` (its flags over the configuration, then one process or
a supervisor and its workers) and ``notary dev-init`` (what ``make run``
serves)."""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

from notary import __version__
from notary.cli.output import print_while_read
from notary.config import Config, load_config, parse_endpoint
from notary.errors import ConfigError, NotaryError, UsageError

log = logging.getLogger("notary")


def add_serve(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve the notary")
    serve.add_argument("--config", type=Path, help="TOML configuration file")
    serve.add_argument("--check-config", action="store_true", help="validate and exit")
    serve.add_argument("--key", type=Path)
    serve.add_argument("--cert", type=Path)
    serve.add_argument("--db", type=Path)
    serve.add_argument("--bundle", type=Path, help="bundle served at /<file name>")
    serve.add_argument("--api", action="append", metavar="HOST:PORT", help="repeatable")
    serve.add_argument("--allow-target", action="append", metavar="CIDR", help="repeatable")
    serve.add_argument(
        "--plain-api", action="append", metavar="HOST:PORT",
        help="plain-HTTP API listener, behind a TLS terminator (repeatable)",
    )
    serve.add_argument(
        "--relay", action="append", metavar="HOST:PORT",
        help="relay listener (repeatable; replaces [relay] listen)",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["text", "json", "logfmt"])
    serve.add_argument(
        "--workers", type=int, metavar="N",
        help="worker processes (default: [node] workers, 0 = one per CPU)",
    )
    serve.add_argument("--user", help="started as root: serve as this user ([node] user)")
    serve.add_argument("--group", help="and this group ([node] group)")


def add_dev_init(commands: argparse._SubParsersAction) -> None:
    dev = commands.add_parser("dev-init", help="make a local key, certificate, db, bundle, config")
    dev.add_argument("--dir", type=Path, default=Path("var"))
    dev.add_argument("--api-port", type=int, default=8443)
    dev.add_argument("--relay-api-port", type=int, default=4242)


def config_from_args(args: argparse.Namespace) -> Config:
    server: dict[str, Any] = {}
    for flag, key in (("key", "key_file"), ("cert", "cert_file"), ("db", "db_file"),
                      ("bundle", "bundle_file"), ("log_level", "log_level"),
                      ("log_format", "log_format")):
        value = getattr(args, flag)
        if value is not None:
            server[key] = value
    if args.api:
        server["api"] = tuple(parse_endpoint(text, what="--api") for text in args.api)
    if args.plain_api:
        server["plain_api"] = tuple(
            parse_endpoint(text, what="--plain-api") for text in args.plain_api
        )
    if args.allow_target:
        server["allow_targets"] = tuple(args.allow_target)
    relay: dict[str, Any] = {}
    if args.relay:
        relay["listen"] = tuple(parse_endpoint(text, what="--relay") for text in args.relay)
    if args.config is None and not {"key_file", "cert_file", "db_file"} <= server.keys():
        raise ConfigError("serve needs --config FILE, or --key, --cert and --db")
    return load_config(args.config, {"server": server, "relay": relay})


def cmd_serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    node = {key: value for key in ("workers", "user", "group")
            if (value := getattr(args, key)) is not None}
    if node:
        config = replace(config, node=replace(config.node, **node))
    from notary.server.app import check_config

    if args.check_config:
        check_config(config)
        print("configuration OK")
        return 0
    from notary.logs import configure_logging, set_worker
    from notary.node.privileges import drop_privileges
    from notary.node.supervisor import default_workers, supervise, worker_index
    from notary.node.systemd import listen_fds
    from notary.server.sockets import bind_sockets, check_roles, inherited_sockets
    from notary.server.tickets import take_ticket_keys

    index = worker_index()
    set_worker(index)
    configure_logging(config.server.log_level, config.server.log_format)
    sockets = inherited_sockets()
    ticket_keys = take_ticket_keys()  # None unless a supervisor started this worker
    if sockets is None:  # the node's first process: open the sockets, then drop root
        taken = listen_fds()
        check_roles(taken)
        sockets = bind_sockets(config, taken=taken)
        drop_privileges(config.node.user, config.node.group)
    workers = config.node.workers or default_workers()
    if index is not None:
        # Each worker rescans the targets asked of it, with its share of the
        # node's budgets; skipping what another worker observed meanwhile
        # (the scheduler's rule 11) keeps a target from being probed once
        # per worker.
        # Likewise each enforces its share of the per-client rates.
        rescan = config.rescan
        config = replace(
            config, limits=config.limits.shared_by(workers), log=config.log.shared_by(workers),
            rescan=replace(
                rescan,
                probes_per_s=rescan.probes_per_s / workers,
                per_prefix_per_s=rescan.per_prefix_per_s / workers,
                max_in_flight=math.ceil(rescan.max_in_flight / workers),
            ),
        )
    if index is None and workers > 1:
        check_config(config)  # once here, rather than a failed start per worker
        from notary.server.app import check_resolvers_at_start

        trio.run(check_resolvers_at_start, config)  # likewise (each worker checks again)
        log.info("notary %s: starting %d workers", __version__, workers)
        return trio.run(supervise, config, sockets, workers, args.argv)
    from notary.node.lifecycle import run_serving_process

    try:
        # A worker shares the database with the node's other workers.
        trio.run(partial(run_serving_process, shared_store=index is not None,
                         ticket_keys=ticket_keys),
                 config, sockets, partial(config_from_args, args))
    except BaseExceptionGroup as group:
        # Nurseries wrap a start-up error (unreadable bundle, ...) in
        # exception groups: report it on one line like any other.
        errors, others = group.split(NotaryError)
        if errors is None or others is not None:
            raise
        error: BaseException = errors
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        raise error from None
    return 0


def cmd_dev_init(args: argparse.Namespace) -> int:
    """Everything ``make run`` needs under ``args.dir``, made once."""
    from notary.node.devsetup import ensure_dev_notary

    try:
        ensure_dev_notary(
            args.dir, api_port=args.api_port, relay_api_port=args.relay_api_port,
            say=print_while_read,
        )
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise UsageError(f"dev-init:{where}: {exc.strerror or exc}") from None
    return 0
