"""``notary.state.tlogstore``: the log's rows, on both engines
(``tests.support.engines``; ``tests/test_tlogstore_postgres.py`` has what
only PostgreSQL does). Batches appended across tile boundaries agree with
RFC 9162 computed naively; the log survives reopening; a store whose tiles
contradict the tree refuses to append; two connections (two workers, or
two nodes) append one after the other."""

from __future__ import annotations

import pytest

from notary.protocol import tlog
from notary.state.tlogstore import LogCorrupted
from tests.support.engines import Engine, naive_root, signer


def test_batches_across_tiles_agree_with_rfc_9162(engine: Engine) -> None:
    entries = [b"entry %d" % i for i in range(600)]
    made: list[tuple[int, bytes]] = []
    with engine.log() as store:
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
        proof = store.inclusion_proof(300, 600)
        tlog.verify_inclusion(tlog.leaf_hash(entries[300]), 300, 600, proof, made[-1][1])
        with pytest.raises(ValueError):
            store.consistency_proof(10, 601)
    # Reopened: the tree goes on where it was.
    with engine.log() as store:
        head = store.head()
        assert head is not None and head.size == 600 and head.checkpoint.startswith("checkpoint 600")
        store.append([b"after"], signer(made))
        assert made[-1] == (601, naive_root([*entries, b"after"]))


def test_two_connections_append_one_after_the_other(engine: Engine) -> None:
    made: list[tuple[int, bytes]] = []
    with engine.log() as first, engine.log() as second:
        first.append([b"a", b"b"], signer(made))
        appended = second.append([b"c"], signer(made))
        assert appended.first_index == 2
        first.append([b"d"], signer(made))
        assert made[-1] == (4, naive_root([b"a", b"b", b"c", b"d"]))


def test_a_contradicting_tile_stops_appends(engine: Engine) -> None:
    with engine.log() as store:
        store.append([b"x%d" % i for i in range(10)], signer([]))
        # A tile losing a hash (substr: SQLite's and PostgreSQL's).
        store._db.change("UPDATE log_tiles SET hashes = substr(hashes, 1, 288)")
    with engine.log() as store, pytest.raises(LogCorrupted):
        store.append([b"more"], signer([]))
    with engine.log() as store:
        head = store.head()
        assert head is not None and head.size == 10  # nothing written
        assert len(store.entries(0, 20)) == 10


def test_batch_bounds(engine: Engine) -> None:
    with engine.log() as store:
        with pytest.raises(ValueError):
            store.append([], signer([]))
        with pytest.raises(ValueError):
            store.append([b"x" * 65536], signer([]))
        assert store.head() is None
