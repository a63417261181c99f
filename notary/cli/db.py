"""``notary db init|stats|compact``: the store, opened by its ``[store]``
backend, outside a serving node."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from notary.config import StoreConfig, load_config
from notary.errors import UsageError
from notary.state.store import database_file_mode


def add_db(commands: argparse._SubParsersAction) -> None:
    db = commands.add_parser(
        "db", help="create/migrate the database, print statistics, or compact it"
    )
    db.add_argument("action", choices=["init", "stats", "compact"])
    db.add_argument("--db", type=Path, help="database file (default: from --config)")
    db.add_argument("--config", type=Path)


def _db_settings(args: argparse.Namespace) -> tuple[Path | None, StoreConfig, int]:
    """The database file (None: a PostgreSQL store), its ``[store]``
    settings and its files' mode: from ``--config`` (``--db`` overriding its
    file and its backend), else the defaults."""
    if args.db is None and args.config is None:
        raise UsageError("db needs --db FILE or --config FILE")
    if args.config is None:
        return args.db, StoreConfig(), database_file_mode("")
    config = load_config(args.config)
    if args.db is not None:
        return args.db, replace(config.store, backend="sqlite"), database_file_mode(
            config.node.group
        )
    return config.server.db_file, config.store, database_file_mode(config.node.group)


def _open_db(
    path: Path | None, settings: StoreConfig, mode: int, *, create: bool
) -> tuple[Any, str]:
    """The store ``cmd_db`` works on (its engine by ``[store] backend``) and
    the name it is shown by (never a password)."""
    from notary.outbound.writer import store_openers

    make_schema, existing = store_openers(path, settings, mode)
    store = make_schema() if create else existing()
    return store, str(store.path)


def cmd_db(args: argparse.Namespace) -> int:
    path, settings, mode = _db_settings(args)
    sqlite = settings.backend == "sqlite"
    if args.action == "init":
        # Creates or migrates, sets the files' mode, and brings rows kept
        # under looser limits within these (what ``serve`` does at start).
        store, name = _open_db(path, settings, mode, create=True)
        with store:
            report = store.enforce_limits()
            print(f"{name}: schema version {store.schema_version()}"
                  + (f", mode {mode:04o}" if sqlite else ""))
        if report:
            print(f"brought within the [store] limits: {report}")
        return 0
    store, name = _open_db(path, settings, mode, create=False)
    size = "file bytes" if sqlite else "database bytes"
    if args.action == "compact":
        with store:
            before = store.statistics().file_bytes
            report = store.compact(int(time.time()), settings.forget_unasked_after_s)
            after = store.statistics().file_bytes
        print(f"{name}: {report}")
        print(f"{size}: {before} -> {after}")
        return 0
    with store:
        stats = store.statistics()
    print(f"schema version: {stats.schema_version}")
    print(f"targets:        {stats.targets}")
    print(f"certificates:   {stats.certificates}")
    print(f"observations:   {stats.observations}")
    print(f"{size + ':':<16}{stats.file_bytes}")
    return 0
