"""The ``.notary`` bundle, version 1 (notary.protocol.bundle), against the real
Thoughtcrime Labs bundle of 2011."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

import pytest
import trustme

from notary.errors import UsageError
from notary.protocol.bundle import (
    BUNDLE_VERSION,
    MAX_BUNDLE_BYTES,
    MAX_HOSTS,
    MAX_NAME_CHARS,
    Bundle,
    BundleError,
    BundleHost,
    make_bundle,
    parse_bundle,
    parse_host_spec,
    validate,
)
from tests.vectors_path import VECTORS

BUNDLE_FILE = VECTORS / "convergence" / "thoughtcrime.notary"
LOCATION = "https://ssl.thoughtcrime.org/convergence/thoughtcrime.notary"


def independent_sha1_pin(pem: str) -> str:
    """SHA-1 of the DER inside ``pem``, computed without ``cryptography``."""
    match = re.search(
        r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", pem, re.DOTALL
    )
    assert match
    der = base64.b64decode("".join(match.group(1).split()))
    return ":".join(f"{b:02X}" for b in hashlib.sha1(der).digest())


@pytest.fixture(scope="module")
def raw() -> bytes:
    return BUNDLE_FILE.read_bytes()


@pytest.fixture
def document(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)


@pytest.fixture(scope="module")
def other_pem() -> str:
    ca = trustme.CA()
    return ca.issue_cert("notary.example.test").cert_chain_pems[0].bytes().decode("ascii")


def parse_doc(document: object) -> Bundle:
    return parse_bundle(json.dumps(document).encode("utf-8"))


def bundle_error(document: object) -> str:
    with pytest.raises(BundleError) as info:
        parse_doc(document)
    return str(info.value)


# -- the real bundle -------------------------------------------------------------


def test_real_bundle_parses(raw: bytes) -> None:
    bundle = parse_bundle(raw)
    assert bundle.version == 1
    assert bundle.name == "Thoughtcrime Labs"
    assert bundle.bundle_location == LOCATION
    assert bundle.region is None
    assert [(h.host, h.ssl_port, h.http_port) for h in bundle.hosts] == [
        ("notary.thoughtcrime.org", 443, 80),
        ("notary2.thoughtcrime.org", 443, 80),
    ]


def test_real_bundle_pins_are_the_sha1_of_the_der(raw: bytes, document: dict[str, Any]) -> None:
    bundle = parse_bundle(raw)
    pins = [host.sha1_pin for host in bundle.hosts]
    expected = [independent_sha1_pin(h["certificate"]) for h in document["hosts"]]
    assert pins == expected
    assert pins[0] != pins[1]
    for pin in pins:
        assert re.fullmatch(r"([0-9A-F]{2}:){19}[0-9A-F]{2}", pin)


def test_real_bundle_certificates_name_their_hosts(raw: bytes) -> None:
    for host in parse_bundle(raw).hosts:
        cn = host.certificate.subject.rfc4514_string()
        assert f"CN={host.host}" in cn


def test_real_bundle_round_trips_byte_for_byte(raw: bytes) -> None:
    bundle = parse_bundle(raw)
    assert bundle.to_json() == raw
    assert parse_bundle(bundle.to_json()) == bundle


def test_to_json_key_order(raw: bytes) -> None:
    bundle = parse_bundle(raw)
    document = json.loads(bundle.to_json())
    assert list(document) == ["version", "hosts", "name", "bundle_location"]
    assert list(document["hosts"][0]) == ["host", "http_port", "ssl_port", "certificate"]


def test_region_round_trips(raw: bytes, document: dict[str, Any]) -> None:
    document["region"] = "US"
    bundle = parse_doc(document)
    assert bundle.region == "US"
    again = parse_bundle(bundle.to_json())
    assert again == bundle
    assert list(json.loads(bundle.to_json()))[-1] == "region"


def test_made_bundle_round_trips(other_pem: str) -> None:
    bundle = make_bundle(
        name="Example notary",
        location="https://notary.example.test/example.notary",
        hosts=[
            BundleHost("notary.example.test", 443, 80, other_pem),
            BundleHost("::1", 4242, 8080, other_pem),
        ],
        region="DE",
    )
    again = parse_bundle(bundle.to_json())
    assert again == bundle
    assert again.hosts[0].sha1_pin == independent_sha1_pin(other_pem)
    assert again.version == BUNDLE_VERSION


def test_null_region_is_no_region(document: dict[str, Any]) -> None:
    document["region"] = None
    assert parse_doc(document).region is None


def test_bundle_error_is_a_usage_error() -> None:
    assert issubclass(BundleError, UsageError)


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 0, "1", None, True, 1.0, [1]])
def test_bad_version(document: dict[str, Any], version: object) -> None:
    document["version"] = version
    assert "version" in bundle_error(document)


@pytest.mark.parametrize("name", ["", "   ", None, 5, ["x"], "x" * (MAX_NAME_CHARS + 1)])
def test_bad_name(document: dict[str, Any], name: object) -> None:
    document["name"] = name
    assert "name" in bundle_error(document)


def test_longest_name_is_accepted(document: dict[str, Any]) -> None:
    document["name"] = "x" * MAX_NAME_CHARS
    assert parse_doc(document).name == "x" * MAX_NAME_CHARS


@pytest.mark.parametrize(
    "location",
    [
        "http://ssl.thoughtcrime.org/convergence/thoughtcrime.notary",
        "ftp://ssl.thoughtcrime.org/thoughtcrime.notary",
        "https:///thoughtcrime.notary",
        "thoughtcrime.notary",
        "",
        5,
        None,
        "https://[not-an-ip/x.notary",
        "https://example.org:99999/x.notary",
    ],
)
def test_location_must_be_https(document: dict[str, Any], location: object) -> None:
    document["bundle_location"] = location
    assert "bundle_location" in bundle_error(document)


@pytest.mark.parametrize(
    "location",
    [
        "https://example.org/thoughtcrime.json",
        "https://example.org/",
        "https://example.org",
        "https://example.org/x.notary/",
        "https://example.org/x.NOTARY",
    ],
)
def test_location_must_end_with_dot_notary(document: dict[str, Any], location: str) -> None:
    document["bundle_location"] = location
    assert ".notary" in bundle_error(document)


@pytest.mark.parametrize(
    "location",
    ["https://[2001:db8::1]:8443/x.notary", "https://127.0.0.1:4242/local.notary"],
)
def test_location_with_address_and_port(document: dict[str, Any], location: str) -> None:
    document["bundle_location"] = location
    assert parse_doc(document).bundle_location == location


def test_no_hosts(document: dict[str, Any]) -> None:
    document["hosts"] = []
    assert "at least one host" in bundle_error(document)


def test_too_many_hosts(document: dict[str, Any]) -> None:
    document["hosts"] = [document["hosts"][0]] * (MAX_HOSTS + 1)
    assert str(MAX_HOSTS) in bundle_error(document)


@pytest.mark.parametrize("hosts", [{}, "hosts", 5, None])
def test_hosts_must_be_a_list(document: dict[str, Any], hosts: object) -> None:
    document["hosts"] = hosts
    assert "hosts" in bundle_error(document)


@pytest.mark.parametrize("entry", [1, "notary.example", None, []])
def test_host_entry_must_be_an_object(document: dict[str, Any], entry: object) -> None:
    document["hosts"] = [entry]
    assert "object" in bundle_error(document)


@pytest.mark.parametrize("field", ["ssl_port", "http_port"])
@pytest.mark.parametrize("port", [0, -1, 65536, 70000, "443", True, False, None, 443.0, [443]])
def test_bad_port(document: dict[str, Any], field: str, port: object) -> None:
    document["hosts"][1][field] = port
    message = bundle_error(document)
    assert field in message
    assert "notary2.thoughtcrime.org" in message


@pytest.mark.parametrize("port", [1, 65535])
def test_port_bounds_are_accepted(document: dict[str, Any], port: int) -> None:
    document["hosts"][0]["ssl_port"] = port
    assert parse_doc(document).hosts[0].ssl_port == port


@pytest.mark.parametrize(
    "pem",
    [
        "junk",
        "",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        "caf\u00e9",
    ],
)
def test_unreadable_pem(document: dict[str, Any], pem: str) -> None:
    document["hosts"][0]["certificate"] = pem
    assert "not a readable PEM" in bundle_error(document)


def test_truncated_pem(document: dict[str, Any]) -> None:
    document["hosts"][0]["certificate"] = document["hosts"][0]["certificate"][:400]
    assert "certificate" in bundle_error(document)


@pytest.mark.parametrize("pem", [5, None, ["-----BEGIN CERTIFICATE-----"]])
def test_pem_must_be_text(document: dict[str, Any], pem: object) -> None:
    document["hosts"][0]["certificate"] = pem
    assert "PEM text" in bundle_error(document)


@pytest.mark.parametrize("host", ["", "a b", "bad..name", None, 5])
def test_bad_host(document: dict[str, Any], host: object) -> None:
    document["hosts"][0]["host"] = host
    assert "host" in bundle_error(document)


@pytest.mark.parametrize("key", ["version", "name", "bundle_location", "hosts"])
def test_missing_top_level_key(document: dict[str, Any], key: str) -> None:
    del document[key]
    assert key in bundle_error(document)


@pytest.mark.parametrize("key", ["host", "ssl_port", "http_port", "certificate"])
def test_missing_host_key(document: dict[str, Any], key: str) -> None:
    del document["hosts"][0][key]
    assert repr(key) in bundle_error(document)


@pytest.mark.parametrize("region", ["us", "USA", "U1", "", 5, ["US"], "U"])
def test_bad_region(document: dict[str, Any], region: object) -> None:
    document["region"] = region
    assert "region" in bundle_error(document)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"{",
        b"\xff\xfe\x00",
        b'{"version": 1,}',
        b"[" * 100_000,
        b'{"a":' * 100_000,
        b"1" * 5000,
    ],
    ids=["empty", "text", "truncated", "bad-utf8", "trailing-comma", "deep-array",
         "deep-object", "huge-int"],
)
def test_not_json(data: bytes) -> None:
    with pytest.raises(BundleError, match="not JSON"):
        parse_bundle(data)


@pytest.mark.parametrize("data", [b"[]", b"1", b"null", b'"bundle"', b"true", b"[{}]"])
def test_not_an_object(data: bytes) -> None:
    with pytest.raises(BundleError, match="JSON object"):
        parse_bundle(data)


def test_file_too_large(raw: bytes) -> None:
    padded = raw[:-1] + b', "padding": "' + b"x" * MAX_BUNDLE_BYTES + b'"}'
    with pytest.raises(BundleError, match="larger"):
        parse_bundle(padded)


def test_unknown_keys_are_ignored(document: dict[str, Any]) -> None:
    document["future_key"] = {"x": 1}
    document["hosts"][0]["future_key"] = 1
    assert parse_doc(document).name == "Thoughtcrime Labs"


def test_make_bundle_validates(other_pem: str) -> None:
    with pytest.raises(BundleError, match="https"):
        make_bundle(
            name="n",
            location="http://x.example/n.notary",
            hosts=[BundleHost("x.example", 443, 80, other_pem)],
        )
    with pytest.raises(BundleError, match="at least one host"):
        make_bundle(name="n", location="https://x.example/n.notary", hosts=[])


def test_validate_refuses_a_constructed_bad_bundle(other_pem: str) -> None:
    good = Bundle("n", "https://x.example/n.notary", (BundleHost("x.example", 443, 80, other_pem),))
    validate(good)
    with pytest.raises(BundleError, match="version"):
        validate(Bundle("n", good.bundle_location, good.hosts, version=2))


# -- --host specs ----------------------------------------------------------------


def test_parse_host_spec(other_pem: str) -> None:
    host = parse_host_spec("notary.example.test:443:80", other_pem)
    assert host == BundleHost("notary.example.test", 443, 80, other_pem)
    assert parse_host_spec("[2001:db8::1]:4242:8080", other_pem).host == "2001:db8::1"


@pytest.mark.parametrize(
    "spec", ["notary.example.test", "notary.example.test:443", "a:b:c", ":443:80",
             "2001:db8::1:443:80", "x:443:80:extra", "x:123456:80"],
)
def test_parse_host_spec_refuses(spec: str, other_pem: str) -> None:
    with pytest.raises(BundleError, match="HOST:SSL_PORT:HTTP_PORT"):
        parse_host_spec(spec, other_pem)


# -- the optional v2_key extension ------------------------------------------------


def test_v2_key_round_trips_and_legacy_bundles_have_none(raw: bytes, other_pem: str) -> None:
    import base64

    assert all(host.v2_key is None for host in parse_bundle(raw).hosts)
    key = base64.b64encode(bytes(range(32))).decode("ascii")
    bundle = make_bundle(
        name="With v2", location="https://notary.example.test/v2.notary",
        hosts=[BundleHost("notary.example.test", 443, 80, other_pem, v2_key=key)],
    )
    again = parse_bundle(bundle.to_json())
    assert again.hosts[0].v2_key == key
    assert again.hosts[0].v2_key_raw == bytes(range(32))
    assert again == bundle


@pytest.mark.parametrize("bad", ["", "not base64!", "AAAA", 5])
def test_bad_v2_key_is_refused(other_pem: str, bad: object) -> None:
    with pytest.raises(BundleError, match="v2_key"):
        make_bundle(
            name="Bad v2", location="https://notary.example.test/v2.notary",
            hosts=[BundleHost("notary.example.test", 443, 80, other_pem, v2_key=bad)],
        )


# -- the optional log extension (issue 30, item 11) -----------------------------------


def _log_member(raw_key: bytes, origin: str = "notary.example.test/v2/log") -> dict[str, Any]:
    from notary.protocol import tlog

    witness = tlog.cosigner_key("w.example.test/witness", bytes(range(1, 33)))
    return {"origin": origin, "key": tlog.verifier_key(origin, raw_key), "witnesses": [witness]}


def test_a_log_member_round_trips_and_legacy_bundles_stay_byte_for_byte(
    raw: bytes, document: dict[str, Any], other_pem: str
) -> None:
    from notary.protocol.bundle import BundleLog

    legacy = parse_bundle(raw)
    assert legacy.log is None and legacy.to_json() == raw  # the 2011 bundle, unchanged
    key = bytes(range(32))
    member = _log_member(key)
    document["log"] = member
    bundle = parse_doc(document)
    assert bundle.log == BundleLog(member["origin"], member["key"], tuple(member["witnesses"]))
    assert bundle.log.public_raw == key
    assert json.loads(bundle.to_json())["log"] == member
    assert list(json.loads(bundle.to_json()))[-1] == "log"
    assert parse_bundle(bundle.to_json()) == bundle
    # What a 2011 reader sees of it: the members it knows, as before.
    legacy_view = json.loads(bundle.to_json())
    legacy_view.pop("log")
    assert parse_doc(legacy_view) == legacy
    made = make_bundle(
        name="With log", location="https://notary.example.test/l.notary",
        hosts=[BundleHost("notary.example.test", 443, 80, other_pem,
                          v2_key=base64.b64encode(key).decode())],
        log=BundleLog.of("notary.example.test/v2/log", key),
    )
    assert "witnesses" not in json.loads(made.to_json())["log"]
    assert parse_bundle(made.to_json()) == made
    document["log"] = None
    assert parse_doc(document).log is None
    # The operator's promise of cosignatures travels with it (absent: 0).
    document["log"] = {**member, "min_witnesses": 1}
    promised = parse_doc(document)
    assert promised.log is not None and promised.log.min_witnesses == 1
    assert json.loads(promised.to_json())["log"]["min_witnesses"] == 1
    assert parse_bundle(promised.to_json()) == promised
    assert bundle.log.min_witnesses == 0


@pytest.mark.parametrize(("change", "message"), [
    (lambda log: "not an object", "log must be an object"),
    (lambda log: {k: v for k, v in log.items() if k != "key"}, "log is missing 'key'"),
    (lambda log: {**log, "origin": "has space"}, "log origin must be a key name"),
    (lambda log: {**log, "origin": "other.example.test/log"}, "named after the log's origin"),
    (lambda log: {**log, "key": "junk"}, "log key must be the log's verifier key"),
    (lambda log: {**log, "key": log["witnesses"][0]}, "log key must be the log's verifier key"),
    (lambda log: {**log, "witnesses": "w"}, "log witnesses must be a list"),
    (lambda log: {**log, "witnesses": [log["key"]]}, "log witness"),
    (lambda log: {**log, "witnesses": log["witnesses"] * 2}, "must not repeat"),
    (lambda log: {**log, "witnesses": log["witnesses"] * 33}, "at most 32"),
    (lambda log: {**log, "min_witnesses": 2}, "min_witnesses must be a whole number from 0"),
    (lambda log: {**log, "min_witnesses": -1}, "min_witnesses must be a whole number from 0"),
    (lambda log: {**log, "min_witnesses": True}, "min_witnesses must be a whole number from 0"),
    (lambda log: {**log, "min_witnesses": "1"}, "min_witnesses must be a whole number from 0"),
])
def test_a_bad_log_member_is_refused(document: dict[str, Any], change, message: str) -> None:
    document["log"] = change(_log_member(bytes(range(32))))
    assert message in bundle_error(document)


def test_the_log_key_must_be_the_hosts_v2_key(document: dict[str, Any]) -> None:
    document["log"] = _log_member(bytes(range(32)))
    for host in document["hosts"]:
        host["v2_key"] = base64.b64encode(bytes(range(32))).decode()
    assert parse_doc(document).log is not None
    document["hosts"][1]["v2_key"] = base64.b64encode(bytes(32)).decode()
    assert "log key must be the hosts' v2_key" in bundle_error(document)
