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
releases it for good.

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

Error handling: every psycopg error is raised as ``StoreError`` naming the
database as ``describe_dsn`` does (user, host, port and database), with
libpq's reason on one line (``reason``). No message says the password:
a dsn libpq cannot read (its parse errors quote the dsn), or reads
otherwise than written (``check_dsn``), is refused with a fixed message
before any connection is tried, and every form the password may take
(as written, percent-encoded or not, as libpq reads it) is replaced by
``***`` in whatever else is said. Errors the caller's own code raises
inside ``transaction()`` roll it back and propagate unchanged.
"""

from __future__ import annotations

import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from notary.errors import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CONNECT_TIMEOUT_S",
    "INVALID_DSN",
    "MAX_CALL_S",
    "MIGRATION_LOCK",
    "PostgresConnection",
    "check_dsn",
    "describe_dsn",
    "reason",
    "scalar",
]

#: How long opening a connection may take (past it: ``StoreError``).
CONNECT_TIMEOUT_S = 10
#: How long one call may wait on the server, whatever the server says its
#: statement timeout is (twice the stores' longest, 30 s): past it the
#: connection is cut (see the module docstring).
MAX_CALL_S = 60.0
#: At most how many reads of what the server sent an idle connection (an
#: error, then the end of the stream) tell whether it dropped it.
IDLE_READS = 4
#: The advisory lock (``pg_advisory_xact_lock``) under which every store
#: makes or migrates its tables, so the nodes of a fleet may start at once.
MIGRATION_LOCK = 0x6E6F7461
#: What a dsn ``check_dsn`` refuses is, in words quoting none of it.
INVALID_DSN = "not a valid libpq connection string or URL"
_URL_SCHEMES = ("postgresql://", "postgres://")
#: ``password=VALUE`` (keywords, or a URL's parameter): quoted, or up to a space or '&'.
_PASSWORD_KEYWORD = re.compile(r"password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|([^\s&]+))")


def check_dsn(dsn: str) -> None:
    """Raise ``ValueError`` (its message: ``INVALID_DSN``, quoting nothing
    of ``dsn``) if libpq cannot read ``dsn``, or would read a URL otherwise
    than written: an unencoded '@' or '/' in its password (or user, or
    database) moves the rest into the host name or the port, where it is
    looked up and named in errors. Such a URL has two '@' before its
    parameters ('?'), or a '/' before its '@', or a host or port with '@'."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(dsn)
    except Exception:
        raise ValueError(INVALID_DSN) from None
    if dsn.startswith(_URL_SCHEMES):
        before_parameters = dsn.partition("://")[2].partition("?")[0]
        userinfo, at, _ = before_parameters.partition("@")
        if (
            before_parameters.count("@") > 1 or (at and "/" in userinfo)
            or "@" in str(parts.get("host") or "") or "@" in str(parts.get("port") or "")
        ):
            raise ValueError(
                f"{INVALID_DSN} (a URL percent-encodes '@' and '/' in its user, "
                "password and database)"
            )


def describe_dsn(dsn: str) -> str:
    """``dsn`` for messages: user, host, port and database, never the
    password (``postgresql (invalid dsn)`` for one ``check_dsn`` refuses)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        check_dsn(dsn)
    except ValueError:
        return "postgresql (invalid dsn)"
    parts = conninfo_to_dict(dsn)
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = parts.get("host") or "localhost"
    port = f":{parts['port']}" if parts.get("port") else ""
    return _redacted(f"postgresql://{user}{host}{port}/{parts.get('dbname', '')}", dsn)


def reason(exc: BaseException) -> str:
    """A psycopg error in one line (libpq's message can span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _url_password(dsn: str) -> str | None:
    """A URL's password as written: from the ':' after the user to the last
    '@' (as a browser reads it); None if the dsn is no URL or has none."""
    if not dsn.startswith(_URL_SCHEMES):
        return None
    userinfo, at, _ = dsn.partition("://")[2].rpartition("@")
    _, colon, password = userinfo.partition(":")
    return password if at and colon else None


def _redacted(text: str, dsn: str) -> str:
    """``text`` with each form ``dsn``'s password may take replaced by ``***``:
    as libpq reads it, as written in a URL (percent-encoded or not), and
    after ``password=`` (quoted or not), whether libpq can read ``dsn`` or
    not."""
    from psycopg.conninfo import conninfo_to_dict

    forms: set[str] = set()
    with suppress(Exception):  # libpq cannot read it: the forms below
        forms.add(str(conninfo_to_dict(dsn).get("password") or ""))
    written = _url_password(dsn)
    if written is not None:
        forms |= {written, unquote(written)}
    for match in _PASSWORD_KEYWORD.finditer(dsn):
        value = match.group(1) if match.group(1) is not None else match.group(2)
        forms |= {value, unquote(value), re.sub(r"\\(.)", r"\1", value)}
    for form in sorted(forms - {""}, key=len, reverse=True):
        text = text.replace(form, "***")
    return text


def scalar(db: psycopg.Connection[Any], query: str, params: Sequence[Any] = ()) -> Any:
    """The first column of the one row ``query`` returns on ``db`` (in a
    ``transaction()`` block); ``StoreError`` when it returns none."""
    row = db.execute(query, params).fetchone()
    if row is None:
        raise StoreError(f"no row from {query.split()[0]} ...")
    return row[0]


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
        return StoreError(_redacted(f"database {self.path}: {reason(exc)}", self._dsn))

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
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on the connection, committed when the block ends
        (rolled back if it raises); the block runs its statements on the
        connection it is given."""
        db = self._usable()
        try:
            with self._watchdog.bound(db, MAX_CALL_S), db.transaction():
                yield db
        except self._errors as exc:
            raise self._error(exc) from None

    def read(self, query: str, params: Sequence[Any] = ()) -> list[tuple]:
        """The rows of one statement (autocommit)."""
        db = self._usable()
        try:
            with self._watchdog.bound(db, MAX_CALL_S):
                return db.execute(query, params).fetchall()
        except self._errors as exc:
            raise self._error(exc) from None

    def execute(self, query: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (autocommit: its own transaction); how many
        rows it changed."""
        db = self._usable()
        try:
            with self._watchdog.bound(db, MAX_CALL_S):
                return db.execute(query, params).rowcount
        except self._errors as exc:
            raise self._error(exc) from None

    def wait_for_notify(self, channel: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a ``NOTIFY`` on ``channel`` (this
        connection ``LISTEN``s to it first, and again on a connection made
        again: what was notified in between is missed); whether one came."""
        db = self._usable()
        try:
            with self._watchdog.bound(db, timeout_s + MAX_CALL_S):
                if channel not in self._listening:
                    db.execute(f"LISTEN {channel}")
                    self._listening.add(channel)
                return any(True for _ in db.notifies(timeout=timeout_s, stop_after=1))
        except self._errors as exc:
            raise self._error(exc) from None


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
