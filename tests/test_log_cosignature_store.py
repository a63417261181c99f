"""The witnesses' cosignatures of the log in the store, on both engines
(notary.state.logcosignatures through the log's engine): each witness keeps
its newest rows, a witness's turn goes to one holder at a time and lapses,
and the size a witness holds passes from one holder to the next."""

from __future__ import annotations

from notary.state import logcosignatures
from notary.state.logcosignatures import StoredCosignature
from tests.support.engines import Engine


def test_cosignatures_are_kept_newest_first_and_pruned_per_witness(engine: Engine) -> None:
    with engine.log() as log:
        assert log.cosignatures() == []
        for size in range(1, logcosignatures.KEEP_PER_WITNESS + 6):
            log.add_cosignature(StoredCosignature(size, "w1", f"note {size}\n", f"line {size}\n"))
        log.add_cosignature(StoredCosignature(3, "w2", "note 3\n", "w2 line 3\n"))
        rows = log.cosignatures()
    w1 = [row.size for row in rows if row.witness == "w1"]
    assert w1 == list(range(logcosignatures.KEEP_PER_WITNESS + 5, 5, -1))
    # Another witness's old row is its own newest: kept.
    assert [r for r in rows if r.witness == "w2"] == [
        StoredCosignature(3, "w2", "note 3\n", "w2 line 3\n")
    ]
    with engine.log() as again:  # another connection (another worker) reads the same
        assert again.cosignatures() == rows


def test_a_turn_has_one_holder_until_it_lapses(engine: Engine) -> None:
    with engine.log() as first, engine.log() as second:
        turn = first.take_witness_turn("w1", "a", 1_000, 5_000)
        assert turn is not None and turn.held_size == 0
        assert second.take_witness_turn("w1", "b", 2_000, 6_000) is None
        assert first.take_witness_turn("w1", "a", 3_000, 7_000) is not None  # renewed
        first.record_witness_size("w1", "a", 42)
        second.record_witness_size("w1", "b", 99)  # not the holder: nothing changes
        # Another witness's turn is separate.
        assert second.take_witness_turn("w2", "b", 3_000, 7_000) is not None
        # Once a's turn lapses b takes it, knowing the size the witness holds.
        assert second.take_witness_turn("w1", "b", 6_999, 9_000) is None
        taken = second.take_witness_turn("w1", "b", 7_000, 9_000)
        assert taken is not None and taken.held_size == 42
        assert first.take_witness_turn("w1", "a", 8_000, 12_000) is None
