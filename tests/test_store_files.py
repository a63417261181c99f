"""The modes of the database files (issue 17, item 11): the database and its
``-wal``/``-shm`` files are created 0600 (0640 with a service group), and a
writable open sets the mode of existing ones."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from notary.errors import StoreError
from notary.state.store import (
    DATABASE_FILE_MODE,
    DATABASE_GROUP_FILE_MODE,
    Store,
    database_file_mode,
)
from tests.support.observations import probe_result


def modes(path: Path) -> dict[str, int]:
    """The permission bits of the database and its -wal/-shm files that exist."""
    return {
        suffix or "db": stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode)
        for suffix in ("", "-wal", "-shm") if os.path.exists(f"{path}{suffix}")
    }


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The usual umask (022), under which SQLite alone makes 0644 files."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def world_readable_database(path: Path) -> None:
    """A WAL database left by an older notary: 0644, with -wal and -shm."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE leftover (x)")
    db.commit()
    keep_open = sqlite3.connect(path)  # holds -wal/-shm while the test runs
    keep_open.execute("SELECT * FROM leftover").fetchall()
    db.close()
    for name in (path, f"{path}-wal", f"{path}-shm"):
        os.chmod(name, 0o644)
    world_readable_database.connection = keep_open  # type: ignore[attr-defined]


def test_a_new_database_and_its_wal_and_shm_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "notary.db"
    with Store(path) as store:
        store.record([probe_result()])
        assert modes(path) == {"db": 0o600, "-wal": 0o600, "-shm": 0o600}


def test_with_a_service_group_they_are_group_readable(tmp_path: Path) -> None:
    assert database_file_mode("") == DATABASE_FILE_MODE == 0o600
    assert database_file_mode("notary") == DATABASE_GROUP_FILE_MODE == 0o640
    path = tmp_path / "notary.db"
    with Store(path, file_mode=database_file_mode("notary")) as store:
        store.record([probe_result()])
        assert modes(path) == {"db": 0o640, "-wal": 0o640, "-shm": 0o640}


def test_a_strict_umask_does_not_narrow_the_group_mode(tmp_path: Path) -> None:
    os.umask(0o077)
    path = tmp_path / "notary.db"
    with Store(path, file_mode=0o640) as store:
        store.record([probe_result()])
        assert modes(path) == {"db": 0o640, "-wal": 0o640, "-shm": 0o640}


def test_opening_fixes_the_mode_of_existing_files(tmp_path: Path) -> None:
    path = tmp_path / "notary.db"
    world_readable_database(path)
    try:
        assert modes(path) == {"db": 0o644, "-wal": 0o644, "-shm": 0o644}
        with Store(path):
            assert modes(path) == {"db": 0o600, "-wal": 0o600, "-shm": 0o600}
    finally:
        world_readable_database.connection.close()  # type: ignore[attr-defined]


def test_a_reader_leaves_the_modes_alone(tmp_path: Path) -> None:
    path = tmp_path / "notary.db"
    Store(path).close()
    os.chmod(path, 0o644)
    with Store(path, create=False):
        assert modes(path)["db"] == 0o644


def test_a_mode_that_cannot_be_set_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "notary.db"
    Store(path).close()
    os.chmod(path, 0o644)

    def refuse(name: str, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refuse)
    with pytest.raises(StoreError, match=r"cannot make .*notary\.db mode 0600 .*chmod 0600"):
        Store(path)


def test_a_directory_in_place_of_the_database_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notary.db").mkdir()
    with pytest.raises(StoreError, match="not a regular file"):
        Store(tmp_path / "notary.db")
