"""Tests of notary.model.policy: pure functions only.

Nothing here connects anywhere or resolves any name: addresses, including the
public ones (8.8.8.8, 1.1.1.1, ...), are only evaluated by the policy.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notary.errors import ConfigError, ProbeRefused
from notary.model.policy import (
    IPV4_EMBEDDING_PREFIXES,
    REASONS,
    REFUSED_NETWORKS,
    AddressPolicy,
)

DEFAULT = AddressPolicy()

# One or more addresses from every refused range, with the reason expected.
REFUSED_CASES = [
    # IPv4
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("10.0.0.1", "private"),
    ("10.255.255.255", "private"),
    ("100.64.0.1", "shared"),
    ("100.127.255.254", "shared"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("169.254.169.254", "link-local"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.0.0.1", "ietf-protocol"),
    ("192.0.0.170", "ietf-protocol"),
    ("192.0.2.1", "documentation"),
    ("192.88.99.1", "6to4-relay"),
    ("192.168.1.1", "private"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("224.0.0.1", "multicast"),
    ("233.252.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("254.255.255.255", "reserved"),
    ("255.255.255.255", "broadcast"),
    # IPv6
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("0:0:0:0:0:0:0:1", "loopback"),
    ("::2", "deprecated"),
    ("::8.8.8.8", "deprecated"),  # IPv4-compatible, even with a public IPv4
    ("::1:0:0:0", "reserved"),
    ("64:ff9b:1::808:808", "private"),  # local-use NAT64, even with a public IPv4
    ("100::", "discard"),
    ("100::ffff:ffff:ffff:ffff", "discard"),
    ("100:0:0:1::1", "reserved"),
    ("200::1", "reserved"),
    ("1000::1", "reserved"),
    ("1fff:ffff::1", "reserved"),
    ("2001:1::1", "ietf-protocol"),
    ("2001:4:112::1", "ietf-protocol"),
    ("2001:2::1", "benchmarking"),
    ("2001:10::1", "reserved"),  # ORCHID
    ("2001:20::1", "reserved"),  # ORCHIDv2
    ("2001:db8::1", "documentation"),
    ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "documentation"),
    ("3fff::1", "documentation"),
    ("4000::1", "reserved"),
    ("5f00::1", "reserved"),  # SRv6 SIDs
    ("8000::1", "reserved"),
    ("e000::1", "reserved"),
    ("fc00::1", "private"),
    ("fd12:3456:789a::1", "private"),
    ("fe80::1", "link-local"),
    ("febf::1", "link-local"),
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),
]

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "9.9.9.9",
    "100.63.255.255",  # just below CGNAT
    "100.128.0.0",  # just above CGNAT
    "172.15.255.255",  # just below 172.16/12
    "172.32.0.0",  # just above 172.16/12
    "192.0.1.1",
    "192.169.0.1",
    "198.20.0.1",
    "223.255.255.255",  # just below multicast
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "2a00:1450:4001:80b::200e",
    "2001:200::1",  # just above 2001::/23
    "3ffe:ffff::1",  # just below 3fff::/20
    "::ffff:8.8.8.8",  # IPv4-mapped public
    "64:ff9b::808:808",  # NAT64 well-known prefix, public IPv4
    "2002:808:808::1",  # 6to4, public IPv4
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, both IPv4 public
]


@pytest.mark.parametrize(("address", "reason"), REFUSED_CASES)
def test_refused_ranges(address: str, reason: str) -> None:
    assert DEFAULT.refusal(address) == reason
    assert DEFAULT.refusal(ipaddress.ip_address(address)) == reason
    with pytest.raises(ProbeRefused) as excinfo:
        DEFAULT.check(address)
    assert str(excinfo.value) == f"address refused by policy: {reason}"
    assert excinfo.value.reason == "refused"


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_permitted(address: str) -> None:
    assert DEFAULT.refusal(address) is None
    assert DEFAULT.refusal(ipaddress.ip_address(address)) is None
    DEFAULT.check(address)  # does not raise


def test_every_table_network_is_exercised() -> None:
    """Each refused network has a case whose most specific match it is."""
    for network, reason in REFUSED_NETWORKS:
        assert reason in REASONS
        # The first address of a network is covered by that network; check
        # it is refused with that reason unless a more specific entry wins.
        more_specific = [
            n
            for n, _ in REFUSED_NETWORKS
            if n != network
            and n.version == network.version
            and n.subnet_of(network)  # type: ignore[arg-type]
            and network.network_address in n
        ]
        if more_specific or any(
            network.network_address in prefix for prefix, _, _ in IPV4_EMBEDDING_PREFIXES
        ):
            probe = network.broadcast_address
        else:
            probe = network.network_address
        assert DEFAULT.refusal(probe) == reason, (network, probe)


def test_table_has_no_duplicate_networks() -> None:
    networks = [n for n, _ in REFUSED_NETWORKS]
    assert len(networks) == len(set(networks))


# --- embedded IPv4 --------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:7f00:1", "loopback"),
        ("::ffff:10.1.2.3", "private"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:100.64.0.1", "shared"),
        ("::ffff:0.0.0.0", "unspecified"),
        ("::ffff:255.255.255.255", "broadcast"),
        ("::127.0.0.1", "deprecated"),
        ("64:ff9b::127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b::192.168.0.1", "private"),
        ("64:ff9b:1::a00:1", "private"),
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:c0a8:101::", "private"),  # 6to4 of 192.168.1.1
        ("2002:a9fe:a9fe:1:2:3:4:5", "link-local"),
        # Teredo: server 65.54.227.120, client 192.0.2.45 (RFC 4380 example).
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "documentation"),
        # Teredo: server 127.0.0.1, client public.
        ("2001:0:7f00:1:8000:63bf:f7f7:f7f7", "loopback"),
    ],
)
def test_embedded_ipv4_judged(address: str, reason: str) -> None:
    assert DEFAULT.refusal(address) == reason


def _refused_ipv4_networks() -> list[IPv4Network]:
    return [n for n, _ in REFUSED_NETWORKS if isinstance(n, IPv4Network)]


@st.composite
def refused_ipv4(draw: st.DrawFn) -> IPv4Address:
    network = draw(st.sampled_from(_refused_ipv4_networks()))
    offset = draw(st.integers(0, network.num_addresses - 1))
    return network.network_address + offset


def _embeddings(v4: IPv4Address, noise: int, other: IPv4Address) -> list[IPv6Address]:
    """Every IPv6 form embedding ``v4``; ``noise`` fills free bits."""
    n = int(v4)
    flip = 0xFFFF_FFFF
    return [
        IPv6Address((0xFFFF << 32) | n),  # IPv4-mapped
        IPv6Address(n),  # IPv4-compatible
        IPv6Address((0x0064_FF9B << 96) | n),  # NAT64 well-known prefix
        IPv6Address((0x0064_FF9B_0001 << 80) | (noise & ((1 << 48) - 1)) << 32 | n),  # local-use
        IPv6Address((0x2002 << 112) | (n << 80) | (noise & ((1 << 80) - 1))),  # 6to4
        # Teredo, v4 as server: 2001:0000:<server>:<flags>:<port>:<client ^ 1s>
        IPv6Address(
            (0x2001_0000 << 96) | (n << 64) | ((noise & 0xFFFF_FFFF) << 32) | (int(other) ^ flip)
        ),
        # Teredo, v4 as client.
        IPv6Address(
            (0x2001_0000 << 96) | (int(other) << 64) | ((noise & 0xFFFF_FFFF) << 32) | (n ^ flip)
        ),
    ]


@given(
    v4=refused_ipv4(),
    noise=st.integers(0, (1 << 80) - 1),
    other=st.integers(0, (1 << 32) - 1).map(IPv4Address),
)
def test_refused_ipv4_refused_in_every_ipv6_embedding(
    v4: IPv4Address, noise: int, other: IPv4Address
) -> None:
    assert DEFAULT.refusal(v4) is not None
    for v6 in _embeddings(v4, noise, other):
        reason = DEFAULT.refusal(v6)
        assert reason is not None, (v4, v6)
        assert DEFAULT.refusal(str(v6)) == reason
        with pytest.raises(ProbeRefused):
            DEFAULT.check(v6)


@given(st.integers(0, (1 << 32) - 1).map(IPv4Address))
def test_mapped_form_judged_like_ipv4(v4: IPv4Address) -> None:
    mapped = IPv6Address((0xFFFF << 32) | int(v4))
    assert DEFAULT.refusal(mapped) == DEFAULT.refusal(v4)


def test_embedding_prefixes_extract_what_they_embed() -> None:
    v4 = IPv4Address("203.0.113.9")
    for v6 in _embeddings(v4, 0x1234, IPv4Address("8.8.8.8")):
        for prefix, _kind, extract in IPV4_EMBEDDING_PREFIXES:
            if v6 in prefix:
                assert v4 in extract(v6), (prefix, v6)


# --- cross-check against the standard library -------------------------------


def _in_embedding_prefix(address: IPv6Address) -> bool:
    return any(address in prefix for prefix, _, _ in IPV4_EMBEDDING_PREFIXES)


@given(st.ip_addresses())
def test_stricter_than_stdlib_is_global(address: IPv4Address | IPv6Address) -> None:
    """Whatever the standard library calls non-global, the policy refuses.

    Only a cross-check: the policy keeps its own table because ``is_global``
    changes between Python versions. Embedding prefixes (judged by the IPv4
    they carry) are skipped: Python calls all of Teredo non-global.
    """
    if isinstance(address, IPv6Address) and _in_embedding_prefix(address):
        return
    if not address.is_global:
        assert DEFAULT.refusal(address) is not None, address


# --- the allow list ---------------------------------------------------------


def test_allow_list_permits_only_its_networks() -> None:
    policy = AddressPolicy.from_cidrs(["127.0.0.0/8"])
    assert policy.refusal("127.0.0.2") is None
    assert policy.refusal("127.0.0.1") is None
    assert policy.refusal("::ffff:127.0.0.2") is None  # same endpoint
    assert policy.refusal("10.0.0.1") == "private"
    assert policy.refusal("::1") == "loopback"
    assert policy.refusal("2002:7f00:2::") == "loopback"  # 6to4 is not the same endpoint
    assert policy.refusal("8.8.8.8") is None
    policy.check("127.0.0.2")
    with pytest.raises(ProbeRefused, match="private"):
        policy.check("10.0.0.1")


def test_allow_list_ipv6_and_single_addresses() -> None:
    policy = AddressPolicy.from_cidrs(["::1", " fd00::/8 ", "192.168.1.5"])
    assert policy.allowed == (
        IPv6Network("::1/128"),
        IPv6Network("fd00::/8"),
        IPv4Network("192.168.1.5/32"),
    )
    assert policy.refusal("::1") is None
    assert policy.refusal("fd00::5") is None
    assert policy.refusal("fc00::5") == "private"
    assert policy.refusal("192.168.1.5") is None
    assert policy.refusal("192.168.1.6") == "private"
    assert policy.refusal("127.0.0.1") == "loopback"


def test_allow_list_does_not_permit_scoped_or_invalid() -> None:
    policy = AddressPolicy.from_cidrs(["fe80::/10", "0.0.0.0/0", "::/0"])
    assert policy.refusal("fe80::1%eth0") == "scoped"
    assert policy.refusal("not-an-address") == "invalid"
    assert policy.refusal("fe80::1") is None


def test_default_and_empty_allow_list() -> None:
    assert AddressPolicy.from_cidrs([]) == AddressPolicy()
    assert AddressPolicy().allowed == ()


@pytest.mark.parametrize(
    "cidr",
    [
        "10.0.0.1/8",  # host bits set
        "10.0.0.0/33",
        "300.0.0.0/8",
        "::/129",
        "fe80::%eth0/64",
        "",
        "   ",
        "localhost",
        "127.0.0.0/8\x00",
        "127.0.0.0 /8",
        "\udc80",
        "1" * 10_000,
    ],
)
def test_bad_cidrs_raise_config_error(cidr: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        AddressPolicy.from_cidrs(["127.0.0.0/8", cidr])
    assert "invalid CIDR" in str(excinfo.value)
    assert repr(cidr[:20])[:-1] in str(excinfo.value)  # the bad entry is named


def test_non_string_cidr_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="not a string"):
        AddressPolicy.from_cidrs([42])  # type: ignore[list-item]


def test_single_string_instead_of_list_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="list"):
        AddressPolicy.from_cidrs("127.0.0.0/8")


# --- invalid input ----------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "",
        " 8.8.8.8",
        "8.8.8.8 ",
        "8.8.8.8:443",
        "[::1]",
        "010.0.0.1",  # leading zero: ambiguous (octal?)
        "0x7f.0.0.1",
        "127.1",
        "2130706433",
        "1.2.3.4.5",
        "::1::1",
        "example.com",
        "8.8.8.8\x00",
        "\x00",
        "\udc80",
        "\udc80::1",
        "1" * 100_000,
        "::ffff:" + "1" * 1000,
        42,
        None,
        b"8.8.8.8",
    ],
)
def test_invalid_input_refused_not_raised(address: object) -> None:
    assert DEFAULT.refusal(address) == "invalid"  # type: ignore[arg-type]
    with pytest.raises(ProbeRefused, match="address refused by policy: invalid"):
        DEFAULT.check(address)  # type: ignore[arg-type]


@given(st.text(max_size=200))
def test_any_text_gives_a_known_reason_or_none(text: str) -> None:
    reason = DEFAULT.refusal(text)
    assert reason is None or reason in REASONS


def test_policy_is_frozen_and_hashable() -> None:
    policy = AddressPolicy.from_cidrs(["127.0.0.0/8"])
    with pytest.raises(AttributeError):
        policy.allowed = ()  # type: ignore[misc]
    assert hash(policy) == hash(AddressPolicy.from_cidrs(["127.0.0.0/8"]))
