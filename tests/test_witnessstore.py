"""``notary.state.witnessstore``: what a witness holds, on both engines
(``tests.support.engines``: PostgreSQL on a throwaway loopback server,
skipped without one): the compare-and-swap lets one of two requests
checked against the same held checkpoint win, and survives reopening."""

from __future__ import annotations

import threading

from notary.protocol.tlog import HeldCheckpoint
from notary.state.witnessstore import WitnessEngine
from tests.support.engines import Engine


def held(size: int, byte: int = 1) -> HeldCheckpoint:
    return HeldCheckpoint(size, bytes([byte]) * 32, f"note {size}\n")


def test_the_swap_moves_only_from_what_is_held(engine: Engine) -> None:
    store: WitnessEngine = engine.witness()
    try:
        assert store.held("log") is None
        assert store.swap("log", None, held(3))
        assert not store.swap("log", None, held(4))  # something is held now
        assert store.held("log") == held(3) and store.held("log").note == "note 3\n"
        assert not store.swap("log", held(3, byte=2), held(5))  # same size, other root
        assert store.swap("log", held(3), held(5))
        assert not store.swap("log", held(3), held(6))  # stale
        assert store.held("other") is None
    finally:
        store.close()
    reopened: WitnessEngine = engine.witness()
    try:
        assert reopened.held("log") == held(5)
    finally:
        reopened.close()


def test_of_requests_racing_from_one_held_checkpoint_one_wins(engine: Engine) -> None:
    first: WitnessEngine = engine.witness()
    first.swap("log", None, held(1))
    stores = [engine.witness() for _ in range(8)]
    results: list[bool] = []
    barrier = threading.Barrier(len(stores))

    def swap(store: WitnessEngine, size: int) -> None:
        barrier.wait()
        results.append(store.swap("log", held(1), held(size)))

    threads = [threading.Thread(target=swap, args=(s, 10 + i)) for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]
    winner = first.held("log")
    assert winner is not None and 10 <= winner.size < 18
    for store in [first, *stores]:
        store.close()
