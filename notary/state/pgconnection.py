"""One connection to PostgreSQL, the layer every PostgreSQL store stands on
(``pgstore.PostgresStore``: the observations; ``pgtlogstore.PostgresLogStore``:
the log's rows; ``witnessstore.PostgresWitnessStore``: the witness's
checkpoints): connect, reconnect, transactions, reads, single statements,
waits for ``NOTIFY``, and psycopg's errors mapped to ``StoreError``.

Synchronous, like the stores: the Trio edge runs them in worker threads,
one call at a time per connection. psycopg is imported when a connection
is made, never at import (a SQLite-only install does not need it).

Resource handling: a ``PostgresConnection`` owns one connection
(autocommit; ``transaction()`` makes the explicit ones); ``close()``
releases it for good. A connection the server dropped (a restart, a
failover, an administrator) is closed and made again by the next call:
the call that finds it dropped fails with ``StoreError``, and the next one
connects again (and fails, as quickly as the server refuses, or within
``CONNECT_TIMEOUT_S``, while the server is away).

Error handling: every psycopg error is raised as ``StoreError`` naming the
database as ``describe_dsn`` does (user, host, port and database, never
the password), with libpq's reason on one line (``reason``). Errors the
caller's own code raises inside ``transaction()`` roll it back and
propagate unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from notary.errors import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CONNECT_TIMEOUT_S",
    "MIGRATION_LOCK",
    "PostgresConnection",
    "describe_dsn",
    "reason",
]

#: How long opening a connection may take (past it: ``StoreError``).
CONNECT_TIMEOUT_S = 10
#: The advisory lock (``pg_advisory_xact_lock``) under which every store
#: makes or migrates its tables, so the nodes of a fleet may start at once.
MIGRATION_LOCK = 0x6E6F7461


def describe_dsn(dsn: str) -> str:
    """``dsn`` for messages: user, host, port and database, never the
    password."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:
        return "postgresql database (unparsable dsn)"
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = parts.get("host") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname', '')}"


def reason(exc: BaseException) -> str:
    """A psycopg error in one line (libpq's message can span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


class PostgresConnection:
    """See the module docstring. ``dsn``: libpq keywords or a URL; the
    session's settings, applied to every connection made:
    ``statement_timeout_ms`` (one statement, past it ``StoreError``),
    ``lock_timeout_ms`` (a wait for a lock; None: the server's),
    ``synchronous_commit`` (e.g. ``"on"``: a commit waits for the WAL
    flush whatever the server's default; None: the server's).

    Raises ``StoreError`` when the first connection cannot be made."""

    def __init__(
        self, dsn: str, *, statement_timeout_ms: int, lock_timeout_ms: int | None = None,
        synchronous_commit: str | None = None,
    ) -> None:
        import psycopg

        #: What messages name (the SQLite engines' ``path``).
        self.path = describe_dsn(dsn)
        self._dsn = dsn
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error,)
        settings = {
            "statement_timeout": statement_timeout_ms, "lock_timeout": lock_timeout_ms,
            "synchronous_commit": synchronous_commit,
        }
        self._options = " ".join(
            f"-c {name}={value}" for name, value in settings.items() if value is not None
        )
        #: The channels this connection listens on (LISTENed again on a new one).
        self._listening: set[str] = set()
        self._closed = False
        self._db: psycopg.Connection[Any] | None = self._connect()

    def close(self) -> None:
        """Release the connection; every later call is a ``StoreError``."""
        self._closed = True
        if self._db is not None:
            self._db.close()
            self._db = None

    def _error(self, exc: BaseException) -> StoreError:
        return StoreError(f"database {self.path}: {reason(exc)}")

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg

        try:
            return psycopg.connect(
                self._dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                options=self._options,
            )
        except psycopg.Error as exc:
            raise self._error(exc) from None

    def _usable(self) -> psycopg.Connection[Any]:
        """The connection, made again if the server dropped it (or the last
        attempt failed); ``StoreError`` if it cannot be."""
        if self._closed:
            raise StoreError(f"database {self.path}: the connection was closed")
        if self._db is not None and self._db.closed:
            self._db.close()
            self._db = None
        if self._db is None:
            self._listening.clear()
            self._db = self._connect()
        return self._db

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on the connection, committed when the block ends
        (rolled back if it raises); the block runs its statements on the
        connection it is given."""
        db = self._usable()
        try:
            with db.transaction():
                yield db
        except self._errors as exc:
            raise self._error(exc) from None

    def read(self, query: str, params: Sequence[Any] = ()) -> list[tuple]:
        """The rows of one statement (autocommit)."""
        db = self._usable()
        try:
            return db.execute(query, params).fetchall()
        except self._errors as exc:
            raise self._error(exc) from None

    def execute(self, query: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (autocommit: its own transaction); how many
        rows it changed."""
        db = self._usable()
        try:
            return db.execute(query, params).rowcount
        except self._errors as exc:
            raise self._error(exc) from None

    def wait_for_notify(self, channel: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a ``NOTIFY`` on ``channel`` (this
        connection ``LISTEN``s to it first, and again on a connection made
        again: what was notified in between is missed); whether one came."""
        db = self._usable()
        try:
            if channel not in self._listening:
                db.execute(f"LISTEN {channel}")
                self._listening.add(channel)
            return any(True for _ in db.notifies(timeout=timeout_s, stop_after=1))
        except self._errors as exc:
            raise self._error(exc) from None
