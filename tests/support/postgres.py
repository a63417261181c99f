"""A throwaway PostgreSQL server for the tests: Debian's ``postgresql``
(``.ci/install-tools tests``), ``initdb`` and ``pg_ctl`` in a temporary
directory, listening on 127.0.0.1 only, on a free port, with its socket in
that directory; run as the ``postgres`` system user when the tests run as
root (PostgreSQL refuses root). Stopped by ``pg_ctl`` and, if it lingers,
by the PID in its ``postmaster.pid``.

When PostgreSQL is not installed, the PostgreSQL cases skip with that
reason. ``tests.support.engines`` opens the stores of either engine on it.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_databases = itertools.count(1)


@dataclass
class PostgresServer:
    directory: Path
    port: int
    binaries: Path

    def stop(self) -> None:
        """Stop the server (every connection dropped); ``start`` brings it back."""
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        self._pg_ctl("-w", "start")

    def _pg_ctl(self, *argv: str) -> None:
        subprocess.run(_as_postgres([
            str(self.binaries / "pg_ctl"), "-D", str(self.directory / "data"),
            "-l", str(self.directory / "log"), *argv,
        ]), check=True, capture_output=True)

    def restart(self) -> None:
        """Stop the server (dropping every connection) and start it again."""
        subprocess.run(_as_postgres([
            str(self.binaries / "pg_ctl"), "-D", str(self.directory / "data"),
            "-l", str(self.directory / "log"), "-m", "fast", "-w", "restart",
        ]), check=True, capture_output=True)

    def dsn(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def password_role(self, role: str, password: str) -> str:
        """A role that must give ``password`` (scram-sha-256 over TCP: the
        server trusts every other role); the DSN, without the password, of a
        new database it owns."""
        import psycopg

        hba = self.directory / "data" / "pg_hba.conf"
        line = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
        if line not in hba.read_text():
            hba.write_text(line + hba.read_text())
        with psycopg.connect(self.dsn(), autocommit=True) as db:
            if not db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                db.execute(f"CREATE ROLE {role} LOGIN")
            db.execute(f"ALTER ROLE {role} PASSWORD '{password}'")
            name = f"notary_{os.getpid()}_{next(_databases)}"
            db.execute(f"CREATE DATABASE {name} OWNER {role}")
            db.execute("SELECT pg_reload_conf()")
        dsn = f"host=127.0.0.1 port={self.port} user={role} dbname={name}"
        deadline = time.monotonic() + 10
        while True:  # the reload is asynchronous: until a wrong password is refused
            try:
                psycopg.connect(f"{dsn} password=not-{password}", connect_timeout=5).close()
            except psycopg.OperationalError as exc:
                if "password authentication failed" in str(exc):
                    return dsn
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not take the new pg_hba.conf")
            time.sleep(0.05)

    def new_database(self) -> str:
        """A fresh, empty database; its DSN."""
        import psycopg

        name = f"notary_{os.getpid()}_{next(_databases)}"
        with psycopg.connect(self.dsn(), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_postgres(argv: list[str]) -> list[str]:
    """``argv`` run as the ``postgres`` user when we are root."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    binaries = _binaries()
    if binaries is None:
        pytest.skip("PostgreSQL is not installed (.ci/install-tools tests installs it)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e '.[test]')")
    directory = Path(tempfile.mkdtemp(prefix="notary-pg-"))
    if os.geteuid() == 0:
        postgres = pwd.getpwnam("postgres")
        os.chown(directory, postgres.pw_uid, postgres.pw_gid)
    data, port = directory / "data", _free_port()
    subprocess.run(_as_postgres([
        str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
        "--no-sync", "-E", "UTF8",
    ]), check=True, capture_output=True)
    # Loopback only, its socket in our directory, no durability needed.
    with open(data / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write(
            f"listen_addresses = '127.0.0.1'\nport = {port}\n"
            f"unix_socket_directories = '{directory}'\nfsync = off\n"
            "synchronous_commit = off\nfull_page_writes = off\n"
        )
    subprocess.run(_as_postgres([
        str(binaries / "pg_ctl"), "-D", str(data), "-l", str(directory / "log"), "-w", "start",
    ]), check=True, capture_output=True)
    try:
        yield PostgresServer(directory, port, binaries)
    finally:
        subprocess.run(_as_postgres([
            str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop",
        ]), capture_output=True)
        _kill_lingering(data)
        shutil.rmtree(directory, ignore_errors=True)


def _kill_lingering(data: Path) -> None:
    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().split()[0])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    time.sleep(0.1)
