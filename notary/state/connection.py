"""The connection of each store engine, with the same calls on both, so
that what a store says to its database is written once
(``notary.state.observationstore``, ``tlogstore``, ``witnessstore``,
``claims``, ``feed``): ``SqliteConnection`` (a file) and
``PostgresConnection`` (a server: the fleet's database).

Both offer (the ``Connection`` protocol):

* ``path``: the database as messages name it (SQLite: the file;
  PostgreSQL: as ``dsn.describe_dsn`` says it, never with its password);
* ``transaction()``: a write transaction, committed when the block ends,
  rolled back if it raises; the block runs its statements on the
  ``Transaction`` it is given (``execute`` and ``executemany``, whose
  cursors have ``fetchone``, ``fetchall`` and ``rowcount``). SQLite:
  ``BEGIN IMMEDIATE``, the file's write lock from the start (writers take
  turns); PostgreSQL: read committed (a writer locks the rows it must
  hold: ``for_update``);
* ``snapshot()``: a transaction that only reads, all its statements seeing
  one snapshot of the database;
* ``read(sql, parameters)``: the rows of one statement;
  ``change(sql, parameters)``: how many rows one statement changed (each
  its own transaction);
* ``create_tables(ddl)``: run ``CREATE TABLE IF NOT EXISTS`` statements
  (PostgreSQL: under ``MIGRATION_LOCK``, so nodes starting at once do not
  race);
* the dialect: ``in_list(column, values)`` (a condition and its
  parameters), ``for_update`` and ``for_update_skip_locked`` (what ends a
  ``SELECT`` that locks the rows it reads until the transaction ends; on
  SQLite nothing: its write transaction holds the whole file),
  ``insert_rows(db, table, columns, rows)`` (many rows in one call: SQLite's
  ``executemany``, PostgreSQL's ``unnest`` of one array a column, one round
  trip);
* ``close()``: the connection released for good.

Placeholders: a statement names its parameters ``?`` on both engines
(SQLite's style); PostgreSQL's connection turns each into psycopg's ``%s``.
A statement only PostgreSQL runs may also name one ``%b`` (psycopg's: sent
in binary). So no statement holds a literal ``?``, and none run on
PostgreSQL with parameters a literal ``%``.

Synchronous: the Trio edge runs the stores in worker threads, one call at a
time per connection (from any thread). Resource handling: each connection
object owns one connection to its database; ``close()`` releases it.

Error handling: every database error is raised as ``StoreError``,
"database PATH: reason" (PostgreSQL: libpq's reason on one line,
``reason``; every form of the password ``***``, ``dsn.redacted``). Errors
the caller's own code raises inside ``transaction()`` or ``snapshot()``
end it (rolled back) and propagate unchanged.

SQLite: WAL mode (readers never wait for the writer), a busy timeout
(how long a writer waits for another's lock), ``synchronous`` as the store
asks. The switch to WAL needs the file to itself: it is retried while
another process (a worker starting beside this one) opens the file.

PostgreSQL: psycopg is imported when a connection is made, never at import
(a SQLite-only install does not need it). The connection is in autocommit
mode; ``transaction()`` makes the explicit transactions.

Reconnecting: a server that ends a session (a restart, an administrator,
a failover that closes connections) sends an error and closes the
socket. Before each call sends anything, the idle connection is checked
for that without waiting (is its socket readable? then libpq reads what is
there): a connection so found dropped is closed and made again, and the
call goes on, on the new one. So after a restart a caller sees nothing,
once the server is back; while it is away each call fails with
``StoreError``, as quickly as the server refuses a connection, or within
``CONNECT_TIMEOUT_S``. A connection lost while a call is in flight fails
that call with ``StoreError`` (the statement may or may not have run: it
is never sent twice), and the next call connects again.

A server that stops answering without closing the socket (hung, or behind
a proxy that stalls) would hold a call for ever: ``statement_timeout`` is
enforced by the server itself. So every call (a read, a statement, a
transaction, a wait for ``NOTIFY`` beyond its own timeout) has a deadline
of ``MAX_CALL_S`` on the client's side too, kept by one watchdog thread per
connection: past it the connection's socket is shut down, the call fails
with ``StoreError`` and the next one connects again. A network partition
is bounded the same way.
"""

from __future__ import annotations

import os
import select
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self

from notary.errors import StoreError
from notary.state.dsn import check_dsn, describe_dsn, redacted

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CONNECT_TIMEOUT_S",
    "MAX_CALL_S",
    "MIGRATION_LOCK",
    "Columns",
    "Connection",
    "ConnectionOwner",
    "Cursor",
    "PostgresConnection",
    "SqliteConnection",
    "Transaction",
    "reason",
    "scalar",
]

#: How long opening a PostgreSQL connection may take (past it: ``StoreError``).
CONNECT_TIMEOUT_S = 10
#: How long one call may wait on the PostgreSQL server, whatever the server
#: says its statement timeout is (twice the stores' longest, 30 s): past it
#: the connection is cut (see the module docstring).
MAX_CALL_S = 60.0
#: At most how many reads of what the server sent an idle connection (an
#: error, then the end of the stream) tell whether it dropped it.
IDLE_READS = 4
#: The advisory lock (``pg_advisory_xact_lock``) under which every store
#: makes or migrates its tables, so the nodes of a fleet may start at once.
MIGRATION_LOCK = 0x6E6F7461
#: Pause between attempts to switch a file other processes hold to WAL.
WAL_SWITCH_RETRY_S = 0.01

#: The columns of ``insert_rows``: each a name and its PostgreSQL type.
Columns = Sequence[tuple[str, str]]


class Cursor(Protocol):
    """What a statement run in a transaction gives back."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Transaction(Protocol):
    """The statements of a ``transaction()`` or ``snapshot()`` block."""

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Cursor: ...


class Connection(Protocol):
    """What every store asks of its connection (the module docstring)."""

    for_update: str
    for_update_skip_locked: str

    @property
    def path(self) -> Path | str: ...

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def snapshot(self) -> AbstractContextManager[Transaction]: ...

    def read(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]: ...

    def change(self, sql: str, parameters: Sequence[Any] = ()) -> int: ...

    def create_tables(self, ddl: str) -> None: ...

    def in_list(self, column: str, values: Iterable[Any]) -> tuple[str, list[Any]]: ...

    def insert_rows(
        self, db: Transaction, table: str, columns: Columns, rows: Sequence[Sequence[Any]],
        tail: str = "",
    ) -> None: ...

    def close(self) -> None: ...


class ConnectionOwner:
    """A store owning one connection, ``_db``: ``close()`` releases it, as
    leaving a ``with`` block does."""

    _db: Connection

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()


def scalar(db: Transaction, query: str, params: Sequence[Any] = ()) -> Any:
    """The first column of the one row ``query`` returns on ``db`` (in a
    ``transaction()`` block); ``StoreError`` when it returns none."""
    row = db.execute(query, params).fetchone()
    if row is None:
        raise StoreError(f"no row from {query.split()[0]} ...")
    return row[0]


# -- SQLite ---------------------------------------------------------------------------


class SqliteConnection(sqlite3.Connection):
    """One connection to a SQLite file (the module docstring), made by
    ``open``. A ``sqlite3.Connection``: its own ``execute`` and
    ``executemany`` make it the ``Transaction`` of its transactions."""

    for_update = ""
    for_update_skip_locked = ""
    path: Path | str

    @classmethod
    def open(
        cls, path: Path | str, *, synchronous: str, busy_timeout_ms: int,
        foreign_keys: bool = False,
    ) -> SqliteConnection:
        """Open ``path`` (made if missing) in WAL mode with ``synchronous``
        (``NORMAL``, ``FULL``...), waiting up to ``busy_timeout_ms`` for
        another writer's lock; ``foreign_keys``: enforce them. Raises
        ``StoreError`` (nothing left open)."""
        try:
            db = sqlite3.connect(
                path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                check_same_thread=False, factory=cls,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"database {path}: {exc}") from None
        db.path = path
        try:
            db.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            db._enable_wal(busy_timeout_ms)
            db.execute(f"PRAGMA synchronous = {synchronous}")
            if foreign_keys:
                db.execute("PRAGMA foreign_keys = ON")
        except BaseException as exc:
            db.close()
            if isinstance(exc, sqlite3.Error):
                raise db._error(exc) from None
            raise
        return db

    def _enable_wal(self, busy_timeout_ms: int) -> None:
        """Switch the file to WAL. The switch needs the file to itself and
        SQLite reports "locked" at once, without waiting, while another
        process (a worker starting beside this one) opens or switches it:
        retry for up to the busy timeout."""
        deadline = time.monotonic() + busy_timeout_ms / 1000
        while True:
            try:
                mode = self.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(WAL_SWITCH_RETRY_S)
        if mode.lower() != "wal":
            raise StoreError(f"database {self.path}: cannot enable WAL mode")

    def _error(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"database {self.path}: {exc}")

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        """The block's ``sqlite3`` errors raised as ``StoreError``."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def transaction(self) -> AbstractContextManager[SqliteConnection]:
        return self._block("BEGIN IMMEDIATE")

    def snapshot(self) -> AbstractContextManager[SqliteConnection]:
        return self._block("BEGIN")  # deferred: it reads, and takes no write lock

    @contextmanager
    def _block(self, begin: str) -> Iterator[SqliteConnection]:
        with self._mapped():
            self.execute(begin)
            try:
                yield self
            except BaseException:
                self.execute("ROLLBACK")
                raise
            self.execute("COMMIT")

    def read(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        with self._mapped():
            return self.execute(sql, parameters).fetchall()

    def change(self, sql: str, parameters: Sequence[Any] = ()) -> int:
        with self._mapped():
            return self.execute(sql, parameters).rowcount

    def create_tables(self, ddl: str) -> None:
        with self._mapped():
            self.executescript(ddl)

    def in_list(self, column: str, values: Iterable[Any]) -> tuple[str, list[Any]]:
        """``column IN (?, ...)``: at most SQLite's 32,766 parameters a
        statement, with the others."""
        listed = list(values)
        return f"{column} IN ({', '.join('?' * len(listed))})", listed

    def insert_rows(
        self, db: Transaction, table: str, columns: Columns, rows: Sequence[Sequence[Any]],
        tail: str = "",
    ) -> None:
        names = ", ".join(name for name, _ in columns)
        marks = ", ".join("?" * len(columns))
        db.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks}) {tail}", rows)


# -- PostgreSQL -------------------------------------------------------------------------


def reason(exc: BaseException) -> str:
    """A psycopg error in one line (libpq's message can span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _native(sql: str) -> str:
    """``sql`` with psycopg's placeholders for ``?`` (the module docstring)."""
    return sql.replace("?", "%s")


class _PostgresTransaction:
    """A ``Transaction`` on a psycopg connection: ``?`` placeholders."""

    __slots__ = ("_db",)

    def __init__(self, db: psycopg.Connection[Any]) -> None:
        self._db = db

    def execute(self, sql: str, parameters: Any = None, /) -> Cursor:
        # None, not (): several statements in one (DDL) need the simple protocol.
        return self._db.execute(_native(sql), parameters)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Cursor:
        cursor = self._db.cursor()
        cursor.executemany(_native(sql), rows)
        return cursor


class _CallWatchdog:
    """Shuts a connection's socket down when the call in progress on it
    outlives its deadline; one thread, started with the first call, ended
    by ``close``. A store runs one call at a time on its connection."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._deadline: float | None = None
        self._socket = -1
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def bound(self, db: psycopg.Connection[Any], timeout_s: float) -> Iterator[None]:
        """Cut ``db`` if the block lasts more than ``timeout_s``: whatever
        it waits on the server for then fails (psycopg's ``OperationalError``)."""
        with self._changed:
            outer = self._deadline  # a call within a transaction keeps its deadline
            self._deadline = time.monotonic() + timeout_s
            if outer is not None:
                self._deadline = min(outer, self._deadline)
            self._socket = db.pgconn.socket
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="postgres call watchdog", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:  # after this the socket may be closed, its number reused
                self._deadline = outer

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                deadline = self._deadline
                if deadline is None:
                    self._changed.wait()
                    continue
                left = deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self._deadline = None
                with suppress(OSError), socket.socket(fileno=os.dup(self._socket)) as cut:
                    cut.shutdown(socket.SHUT_RDWR)


class PostgresConnection:
    """One connection to a PostgreSQL database (the module docstring).
    ``dsn``: libpq keywords or a URL; the session's settings, applied to
    every connection made: ``statement_timeout_ms`` (one statement, past
    it ``StoreError``), ``lock_timeout_ms`` (a wait for a lock; None: the
    server's), ``synchronous_commit`` (e.g. ``"on"``: a commit waits for
    the WAL flush whatever the server's default; None: the server's).

    Raises ``StoreError`` when the first connection cannot be made."""

    for_update = " FOR UPDATE"
    for_update_skip_locked = " FOR UPDATE SKIP LOCKED"

    def __init__(
        self, dsn: str, *, statement_timeout_ms: int, lock_timeout_ms: int | None = None,
        synchronous_commit: str | None = None,
    ) -> None:
        import psycopg

        #: What messages name (the SQLite engine's file).
        self.path = describe_dsn(dsn)
        self._dsn = dsn
        try:
            check_dsn(dsn)
        except ValueError as exc:
            raise StoreError(f"database {self.path}: the dsn is {exc}") from None
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
        self._watchdog = _CallWatchdog()
        self._db: psycopg.Connection[Any] | None = self._connect()

    def close(self) -> None:
        """Release the connection; every later call is a ``StoreError``."""
        self._closed = True
        self._watchdog.close()
        if self._db is not None:
            self._db.close()
            self._db = None

    def _error(self, exc: BaseException) -> StoreError:
        return StoreError(redacted(f"database {self.path}: {reason(exc)}", self._dsn))

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
        attempt failed); ``StoreError`` if it cannot be. Sends nothing on
        the connection it returns."""
        if self._closed:
            raise StoreError(f"database {self.path}: the connection was closed")
        if self._db is not None and (self._db.closed or _dropped(self._db)):
            self._db.close()
            self._db = None
        if self._db is None:
            self._listening.clear()
            self._db = self._connect()
        return self._db

    @contextmanager
    def _call(self, more_s: float = 0.0) -> Iterator[psycopg.Connection[Any]]:
        """The connection, for one call of at most ``MAX_CALL_S`` + ``more_s``
        (the watchdog's), its psycopg errors raised as ``StoreError``."""
        db = self._usable()
        try:
            with self._watchdog.bound(db, MAX_CALL_S + more_s):
                yield db
        except self._errors as exc:
            raise self._error(exc) from None

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self._call() as db, db.transaction():
            yield _PostgresTransaction(db)

    @contextmanager
    def snapshot(self) -> Iterator[Transaction]:
        with self.transaction() as db:
            db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield db

    def read(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        with self._call() as db:
            return db.execute(_native(sql), parameters).fetchall()

    def change(self, sql: str, parameters: Sequence[Any] = ()) -> int:
        with self._call() as db:
            return db.execute(_native(sql), parameters).rowcount

    def create_tables(self, ddl: str) -> None:
        with self.transaction() as db:
            db.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
            db.execute(ddl)

    def in_list(self, column: str, values: Iterable[Any]) -> tuple[str, list[Any]]:
        """``column = ANY(array)``: one parameter, whatever the count."""
        return f"{column} = ANY(%b)", [list(values)]

    def insert_rows(
        self, db: Transaction, table: str, columns: Columns, rows: Sequence[Sequence[Any]],
        tail: str = "",
    ) -> None:
        if not rows:
            return
        names = ", ".join(name for name, _ in columns)
        # %b: binary parameters (text arrays of bytes are escaped element by element).
        arrays = ", ".join(f"%b::{kind}[]" for _, kind in columns)
        db.execute(
            f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}) {tail}",
            [list(column) for column in zip(*rows, strict=True)],
        )

    def wait_for_notify(self, channel: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a ``NOTIFY`` on ``channel`` (this
        connection ``LISTEN``s to it first, and again on a connection made
        again: what was notified in between is missed); whether one came."""
        with self._call(more_s=timeout_s) as db:
            if channel not in self._listening:
                db.execute(f"LISTEN {channel}")
                self._listening.add(channel)
            return any(True for _ in db.notifies(timeout=timeout_s, stop_after=1))


def _dropped(db: psycopg.Connection[Any]) -> bool:
    """Whether the server closed ``db``, idle between calls: its socket is
    readable (what an idle connection is sent is an error before the
    server closes it, or a notification), so libpq reads what is there, up
    to ``IDLE_READS`` times, without waiting; the end of the stream marks
    it closed. Sends nothing. Notifications read on the way are handed on
    as psycopg does (``notifies()`` yields them)."""
    import psycopg
    from psycopg import pq

    pgconn = db.pgconn
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False  # a call is in flight on it (not ours to read)
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        for _ in range(IDLE_READS):
            if not poller.poll(0):
                break
            pgconn.consume_input()
        while (notify := pgconn.notifies()) is not None:
            if pgconn.notify_handler is not None:
                pgconn.notify_handler(notify)
    except psycopg.Error:
        return True
    return db.closed
