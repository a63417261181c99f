"""The prober's memory of its own resolutions (``notary.model.addresses``):
what a client's address hint is checked against."""

from __future__ import annotations

import pytest

from notary.model.addresses import MAX_ADDRESSES_PER_NAME, AddressMemory, canonical_address

T0 = 1_700_000_000.0
DAY = 86400


def test_an_address_is_known_for_its_name_within_the_memory() -> None:
    memory = AddressMemory(memory_s=DAY, max_entries=100)
    memory.remember("www.example.test", ["192.0.2.1", "2001:DB8::1"], T0)
    assert memory.knows("www.example.test", "192.0.2.1", T0 + DAY)
    assert memory.knows("WWW.example.test", "2001:db8:0::1", T0)  # any spelling
    assert memory.knows("www.example.test", "::ffff:192.0.2.1", T0)  # IPv4-mapped
    assert not memory.knows("www.example.test", "192.0.2.1", T0 + DAY + 1)  # too old
    assert not memory.knows("www.example.test", "192.0.2.2", T0)  # never returned
    assert not memory.knows("other.example.test", "192.0.2.1", T0)  # another name's
    assert not memory.knows("www.example.test", "not an address", T0)
    assert (len(memory), memory.names) == (2, 1)


def test_a_new_resolution_refreshes_and_keeps_the_recent_ones() -> None:
    memory = AddressMemory(memory_s=DAY, max_entries=100)
    memory.remember("www.example.test", ["192.0.2.1", "192.0.2.2"], T0)
    memory.remember("www.example.test", ["192.0.2.2", "192.0.2.3"], T0 + DAY - 10)
    assert memory.knows("www.example.test", "192.0.2.1", T0 + DAY)  # from the first
    assert memory.knows("www.example.test", "192.0.2.2", T0 + 2 * DAY - 10)  # refreshed
    assert not memory.knows("www.example.test", "192.0.2.1", T0 + DAY + 1)
    memory.remember("www.example.test", ["192.0.2.3"], T0 + 3 * DAY)
    assert len(memory) == 1  # the expired ones are gone with it


def test_a_name_keeps_at_most_its_share_of_addresses() -> None:
    memory = AddressMemory(memory_s=DAY, max_entries=1000)
    many = [f"10.0.{i // 256}.{i % 256}" for i in range(200)]
    memory.remember("cdn.example.test", many, T0)
    assert len(memory) == MAX_ADDRESSES_PER_NAME
    assert memory.knows("cdn.example.test", many[MAX_ADDRESSES_PER_NAME - 1], T0)
    assert not memory.knows("cdn.example.test", many[MAX_ADDRESSES_PER_NAME], T0)


def test_the_table_is_bounded_and_forgets_the_names_resolved_longest_ago() -> None:
    memory = AddressMemory(memory_s=DAY, max_entries=10)
    for i in range(10):
        memory.remember(f"h{i}.example.test", [f"192.0.2.{i}"], T0 + i)
    memory.remember("h0.example.test", ["192.0.2.0"], T0 + 20)  # resolved again: newest
    memory.remember("big.example.test", [f"198.51.100.{i}" for i in range(3)], T0 + 30)
    assert len(memory) == 10 and memory.evicted == 3
    assert memory.knows("h0.example.test", "192.0.2.0", T0 + 30)
    assert not any(memory.knows(f"h{i}.example.test", f"192.0.2.{i}", T0 + 30) for i in (1, 2, 3))
    assert memory.knows("big.example.test", "198.51.100.2", T0 + 30)
    tiny = AddressMemory(memory_s=DAY, max_entries=2)
    tiny.remember("cdn.example.test", ["192.0.2.1", "192.0.2.2", "192.0.2.3"], T0)
    assert len(tiny) == 2


def test_bad_settings_and_spellings() -> None:
    with pytest.raises(ValueError):
        AddressMemory(memory_s=-1, max_entries=10)
    with pytest.raises(ValueError):
        AddressMemory(memory_s=1, max_entries=0)
    assert canonical_address(" ::FFFF:192.0.2.1 ") == "192.0.2.1"
    assert canonical_address("2001:DB8:0:0::1") == "2001:db8::1"
    assert canonical_address("www.example.test") is None
