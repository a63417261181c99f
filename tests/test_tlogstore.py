"""``notary.state.tlogstore``: the log's rows in SQLite. Batches appended
across tile boundaries agree with RFC 9162 computed naively here; the log
survives reopening; a store whose tiles contradict the tree refuses to
append; two connections (two workers) append one after the other."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from notary.protocol import tlog
from notary.state.tlogstore import LogCorrupted, LogStore


def naive_root(entries: list[bytes]) -> bytes:
    leaves = [hashlib.sha256(b"\x00" + entry).digest() for entry in entries]

    def mth(part: list[bytes]) -> bytes:
        if len(part) == 1:
            return part[0]
        k = 1
        while k * 2 < len(part):
            k *= 2
        return hashlib.sha256(b"\x01" + mth(part[:k]) + mth(part[k:])).digest()

    return mth(leaves) if leaves else hashlib.sha256(b"").digest()


def signer(made: list[tuple[int, bytes]]):
    def sign(size: int, root: bytes) -> str:
        made.append((size, root))
        return f"checkpoint {size} {root.hex()}\n"
    return sign


def test_batches_across_tiles_agree_with_rfc_9162(tmp_path: Path) -> None:
    entries = [b"entry %d" % i for i in range(600)]
    made: list[tuple[int, bytes]] = []
    with LogStore(tmp_path / "log.db") as store:
        assert store.head() is None
        position = 0
        for size in (1, 2, 253, 1, 1, 300, 42):  # crosses 256 and 512
            appended = store.append(entries[position:position + size], signer(made))
            assert appended.first_index == position
            position += size
            assert appended.head.size == position
            assert made[-1] == (position, naive_root(entries[:position]))
            root = made[-1][1]
            for offset, proof in enumerate(appended.proofs):
                tlog.verify_inclusion(
                    tlog.leaf_hash(entries[appended.first_index + offset]),
                    appended.first_index + offset, position, proof, root,
                )
        assert store.entries(250, 260) == entries[250:260]
        assert store.tile(0, 0) == b"".join(tlog.leaf_hash(e) for e in entries[:256])
        # Level 1 holds the 256-leaf subtrees: two complete ones so far.
        assert store.tile(1, 0) == naive_root(entries[:256]) + naive_root(entries[256:512])
        assert store.tile(2, 0) is None
        proof = store.consistency_proof(257, 600)
        tlog.verify_consistency(257, 600, naive_root(entries[:257]), made[-1][1], proof)
        with pytest.raises(ValueError):
            store.consistency_proof(10, 601)
    # Reopened: the tree goes on where it was.
    with LogStore(tmp_path / "log.db") as store:
        assert store.head() is not None and store.head().size == 600
        store.append([b"after"], signer(made))
        assert made[-1] == (601, naive_root([*entries, b"after"]))


def test_two_connections_append_one_after_the_other(tmp_path: Path) -> None:
    made: list[tuple[int, bytes]] = []
    with LogStore(tmp_path / "log.db") as first, LogStore(tmp_path / "log.db") as second:
        first.append([b"a", b"b"], signer(made))
        appended = second.append([b"c"], signer(made))
        assert appended.first_index == 2
        first.append([b"d"], signer(made))
        assert made[-1] == (4, naive_root([b"a", b"b", b"c", b"d"]))


def test_a_contradicting_tile_stops_appends(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with LogStore(path) as store:
        store.append([b"x%d" % i for i in range(10)], signer([]))
    with sqlite3.connect(path) as db:  # a tile losing a hash
        db.execute("UPDATE log_tiles SET hashes = substr(hashes, 1, 288)")
    with LogStore(path) as store, pytest.raises(LogCorrupted):
        store.append([b"more"], signer([]))
    with LogStore(path) as store:
        assert store.head() is not None and store.head().size == 10  # nothing written


def test_batch_bounds(tmp_path: Path) -> None:
    with LogStore(tmp_path / "log.db") as store:
        with pytest.raises(ValueError):
            store.append([], signer([]))
        with pytest.raises(ValueError):
            store.append([b"x" * 65536], signer([]))
        assert store.head() is None
