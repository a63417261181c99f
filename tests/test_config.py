"""Configuration: TOML file -> frozen dataclasses (notary.config)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from notary.config import (
    AnswerConfig,
    CacheConfig,
    Config,
    Endpoint,
    HttpConfig,
    LimitsConfig,
    LogConfig,
    ProbeConfig,
    RelayConfig,
    ServerConfig,
    StoreConfig,
    load_config,
    parse_endpoint,
)
from notary.errors import ConfigError, UsageError
from notary.model.observations import TimelineLimits
from tests.support.config_files import FILES, server_file, write

REQUIRED = {"key_file": "k.pem", "cert_file": "c.pem", "db_file": "n.db"}


def config_error(tmp_path: Path, server_extra: str = "", rest: str = "") -> str:
    with pytest.raises(ConfigError) as info:
        load_config(server_file(tmp_path, server_extra, rest))
    return str(info.value)


# -- defaults and overrides ------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    config = load_config(server_file(tmp_path))
    assert config.probe == ProbeConfig()
    assert config.answers == AnswerConfig()
    assert config.http == HttpConfig()
    assert config.cache == CacheConfig()
    assert config.store == StoreConfig()
    server = config.server
    assert server.api == (Endpoint("0.0.0.0", 443), Endpoint("0.0.0.0", 4242))
    assert server.allow_targets == ()
    assert server.bundle_file is None
    assert server.log_level == "info"
    assert config.store.synchronous == "NORMAL"
    assert config.probe.timeout_s == 10.0
    assert config.answers.fresh_for_s == 86400


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(server_file(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.probe.timeout_s = 1.0  # type: ignore[misc]


def test_defaults_pass_validation_without_a_file() -> None:
    config = load_config(None, {"server": dict(REQUIRED)})
    assert isinstance(config, Config)
    assert config.server.key_file == Path("k.pem")
    assert isinstance(config.server.cert_file, Path)


def test_every_section_and_key_from_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[server]\n" + FILES
        + 'api = ["127.0.0.1:8443", "[::1]:4242"]\n'
        + 'allow_targets = ["127.0.0.0/8", "::1/128"]\n'
        + 'bundle_file = "local.notary"\nlog_level = "debug"\n'
        + "[probe]\ntimeout_s = 5\nmax_concurrent = 8\nmax_handshake_bytes = 1024\n"
        + "[answers]\nfresh_for_s = 60\nreprobe_after_s = 0\nquery_timeout_s = 2.5\n"
        + "[http]\ntls_handshake_timeout_s = 1.0\nheader_timeout_s = 2\n"
        + "keepalive_timeout_s = 3\nsend_timeout_s = 4\nmax_header_bytes = 100\n"
        + "max_headers = 5\nmax_body_bytes = 6\nmax_connections = 7\n"
        + "[cache]\nmax_entries = 10\nmax_bytes = 11\n"
        + '[store]\nbatch_rows = 12\nbatch_interval_ms = 13\nqueue_rows = 14\nsynchronous = "FULL"\n',
    )
    config = load_config(path)
    assert config.server.api == (Endpoint("127.0.0.1", 8443), Endpoint("::1", 4242))
    assert config.server.allow_targets == ("127.0.0.0/8", "::1/128")
    assert config.server.bundle_file == tmp_path / "local.notary"
    assert config.server.log_level == "debug"
    assert config.probe == ProbeConfig(5.0, 8, 1024)
    assert isinstance(config.probe.timeout_s, float)
    assert config.answers == AnswerConfig(60, 0, 2.5)
    assert config.http == HttpConfig(1.0, 2.0, 3.0, 4.0, 100, 5, 6, 7)
    assert config.cache == CacheConfig(10, 11)
    assert config.store == StoreConfig(12, 13, 14, "FULL")


def test_relative_paths_are_resolved_against_the_file(tmp_path: Path) -> None:
    conf_dir = tmp_path / "etc" / "notary"
    conf_dir.mkdir(parents=True)
    path = write(conf_dir, "[server]\n" + FILES + 'bundle_file = "pub/n.notary"\n')
    server = load_config(path).server
    assert server.key_file == conf_dir / "notary.key"
    assert server.cert_file == conf_dir / "notary.crt"
    assert server.db_file == conf_dir / "notary.db"
    assert server.bundle_file == conf_dir / "pub" / "n.notary"


def test_relative_paths_do_not_depend_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    path = write(conf_dir, "[server]\n" + FILES)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_config(path).server.key_file.resolve() == (conf_dir / "notary.key").resolve()
    monkeypatch.chdir(conf_dir)
    assert load_config(Path("notary.toml")).server.key_file.resolve() == (
        conf_dir / "notary.key"
    ).resolve()


def test_absolute_paths_are_kept(tmp_path: Path) -> None:
    key = tmp_path / "abs" / "notary.key"
    path = write(tmp_path, f'[server]\nkey_file = "{key}"\ncert_file = "c"\ndb_file = "d"\n')
    assert load_config(path).server.key_file == key


def test_overrides_beat_the_file(tmp_path: Path) -> None:
    path = server_file(tmp_path, 'log_level = "info"\n', "[probe]\ntimeout_s = 5\n")
    config = load_config(
        path,
        {
            "server": {
                "key_file": Path("override.key"),
                "log_level": "error",
                "api": (Endpoint("127.0.0.1", 0),),
                "allow_targets": ("10.0.0.0/8",),
            },
            "probe": {"timeout_s": 1.5},
        },
    )
    # Override paths are the caller's (relative to the working directory).
    assert config.server.key_file == Path("override.key")
    assert config.server.cert_file == tmp_path / "notary.crt"
    assert config.server.log_level == "error"
    assert config.server.api == (Endpoint("127.0.0.1", 0),)
    assert config.server.allow_targets == ("10.0.0.0/8",)
    assert config.probe.timeout_s == 1.5


def test_overrides_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="log_level"):
        load_config(server_file(tmp_path), {"server": {"log_level": "loud"}})
    with pytest.raises(ConfigError, match="timeout_s"):
        load_config(server_file(tmp_path), {"probe": {"timeout_s": 0}})


def test_overrides_can_supply_the_required_files(tmp_path: Path) -> None:
    path = write(tmp_path, "[probe]\ntimeout_s = 3\n")
    config = load_config(path, {"server": dict(REQUIRED)})
    assert config.server.db_file == Path("n.db")
    assert config.probe.timeout_s == 3.0


def test_config_error_is_a_usage_error() -> None:
    assert issubclass(ConfigError, UsageError)


# -- errors: every one names its key ---------------------------------------------


def test_unknown_section(tmp_path: Path) -> None:
    assert "[relay]" in config_error(tmp_path, rest="[relay]\nport = 80\n")


@pytest.mark.parametrize(
    ("rest", "key"),
    [
        ("[probe]\ntimeout = 5\n", "'timeout'"),
        ("[http]\nmax_header_size = 5\n", "'max_header_size'"),
        ("[probe.extra]\nx = 1\n", "'extra'"),
    ],
)
def test_unknown_key(tmp_path: Path, rest: str, key: str) -> None:
    message = config_error(tmp_path, rest=rest)
    assert key in message
    assert "unknown key" in message


def test_unknown_server_key(tmp_path: Path) -> None:
    assert "'listen'" in config_error(tmp_path, 'listen = "0.0.0.0:443"\n')


@pytest.mark.parametrize("text", ["server = 5\n", 'server = "x"\n', "server = [1, 2]\n",
                                  'probe = "ab"\n' + "[server]\n" + FILES,
                                  "probe = [[1, 2]]\n" + "[server]\n" + FILES])
def test_section_must_be_a_table(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="must be a table"):
        load_config(write(tmp_path, text))


@pytest.mark.parametrize(
    ("rest", "where", "what"),
    [
        ('[probe]\ntimeout_s = "10"\n', "[probe] timeout_s", "number"),
        ("[probe]\ntimeout_s = true\n", "[probe] timeout_s", "number"),
        ("[probe]\ntimeout_s = [1]\n", "[probe] timeout_s", "number"),
        ("[probe]\ntimeout_s = 1979-05-27\n", "[probe] timeout_s", "number"),
        ("[probe]\nmax_concurrent = 1.5\n", "[probe] max_concurrent", "integer"),
        ('[probe]\nmax_concurrent = "8"\n', "[probe] max_concurrent", "integer"),
        ("[probe]\nmax_concurrent = false\n", "[probe] max_concurrent", "integer"),
        ("[store]\nsynchronous = 1\n", "[store] synchronous", "string"),
        ("[answers]\nfresh_for_s = 1.0\n", "[answers] fresh_for_s", "integer"),
        ("[cache]\nmax_bytes = {}\n", "[cache] max_bytes", "integer"),
    ],
)
def test_wrong_types(tmp_path: Path, rest: str, where: str, what: str) -> None:
    message = config_error(tmp_path, rest=rest)
    assert where in message
    assert what in message


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("log_level = 5\n", "log_level"),
        ('api = "127.0.0.1:443"\n', "api"),
        ("api = 443\n", "api"),
        ('allow_targets = "10.0.0.0/8"\n', "allow_targets"),
        ("bundle_file = 5\n", "bundle_file"),
    ],
)
def test_wrong_server_types(tmp_path: Path, extra: str, key: str) -> None:
    assert f"[server] {key}" in config_error(tmp_path, extra)


def test_path_must_be_text(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nkey_file = 5\ncert_file = "c"\ndb_file = "d"\n')
    with pytest.raises(ConfigError, match=r"\[server\] key_file must be a file path"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ('[server]\nkey_file = "k"\n', "cert_file"),
        ("[probe]\ntimeout_s = 1\n", "key_file, cert_file"),
        ("", "key_file, cert_file"),
        # db_file is checked once the keys are there: a PostgreSQL store needs none.
        ('[server]\nkey_file = "k"\ncert_file = "c"\n', "db_file"),
    ],
)
def test_required_files(tmp_path: Path, text: str, missing: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert str(info.value) == f"[server] needs {missing}"


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("probe", "timeout_s"),
        ("probe", "max_concurrent"),
        ("probe", "max_handshake_bytes"),
        ("answers", "fresh_for_s"),
        ("answers", "query_timeout_s"),
        *(("http", f.name) for f in dataclasses.fields(HttpConfig)),
        ("cache", "max_entries"),
        ("cache", "max_bytes"),
        ("cache", "bloom_expected_items"),
        ("store", "batch_rows"),
        ("store", "batch_interval_ms"),
        ("store", "queue_rows"),
        *(("relay", key) for key in (
            "head_timeout_s", "connect_timeout_s", "idle_timeout_s", "max_lifetime_s",
            "max_tunnels", "max_header_bytes", "max_headers", "max_destinations",
            "buffer_bytes",
        )),
    ],
)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_non_positive_values(tmp_path: Path, section: str, key: str, value: str) -> None:
    message = config_error(tmp_path, rest=f"[{section}]\n{key} = {value}\n")
    assert message == f"[{section}] {key} must be greater than 0"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1" + "0" * 400])
@pytest.mark.parametrize("key", ["probe.timeout_s", "answers.query_timeout_s",
                                 "http.header_timeout_s"])
def test_timeouts_must_be_finite(tmp_path: Path, key: str, value: str) -> None:
    section, name = key.split(".")
    message = config_error(tmp_path, rest=f"[{section}]\n{name} = {value}\n")
    assert f"[{section}] {name}" in message


def test_the_probe_s_addresses_samples_and_memory(tmp_path: Path) -> None:
    """Issue 31: how many addresses and samples a probe makes, and how long
    a resolution makes a client's address hint acceptable."""
    defaults = ProbeConfig()
    assert (defaults.max_addresses, defaults.samples_per_address, defaults.address_memory_s) == (
        8, 4, 86400
    )
    config = load_config(server_file(tmp_path, rest=(
        "[probe]\nmax_addresses = 64\nsamples_per_address = 1\naddress_memory_s = 0\n"
    )))
    assert (config.probe.max_addresses, config.probe.samples_per_address) == (64, 1)
    assert config.probe.address_memory_s == 0  # no hint is ever taken
    for rest, expected in (
        ("max_addresses = 65", "[probe] max_addresses must be at most 64"),
        ("samples_per_address = 17", "[probe] samples_per_address must be at most 16"),
        ("address_memory_s = -1", "[probe] address_memory_s must be 0"),
        ("max_addresses = 0", "[probe] max_addresses must be greater than 0"),
        ("samples_per_address = 0", "[probe] samples_per_address must be greater than 0"),
        ("max_addresses = 2.5", "[probe] max_addresses must be an integer"),
    ):
        assert expected in config_error(tmp_path, rest=f"[probe]\n{rest}\n")


def test_reprobe_after_may_be_zero_but_not_negative(tmp_path: Path) -> None:
    assert load_config(server_file(tmp_path, rest="[answers]\nreprobe_after_s = 0\n"))
    message = config_error(tmp_path, rest="[answers]\nreprobe_after_s = -1\n")
    assert "[answers] reprobe_after_s" in message


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "not-a-cidr", "", "10.0.0.0/8/8", "::1/129",
                                  "10"])
def test_bad_cidr(tmp_path: Path, cidr: str) -> None:
    message = config_error(tmp_path, f'allow_targets = ["127.0.0.0/8", "{cidr}"]\n')
    assert "[server] allow_targets" in message
    assert repr(cidr) in message


@pytest.mark.parametrize("cidr", ["10.0.0.0/8", "192.0.2.1", "2001:db8::/32"])
def test_good_cidrs(tmp_path: Path, cidr: str) -> None:
    config = load_config(server_file(tmp_path, f'allow_targets = ["{cidr}"]\n'))
    assert config.server.allow_targets == (cidr,)


@pytest.mark.parametrize(
    "endpoint", ["nope", "example.com:443", "127.0.0.1", "127.0.0.1:99999", "[::1]", ":443",
                 "127.0.0.1:http"],
)
def test_bad_endpoint(tmp_path: Path, endpoint: str) -> None:
    message = config_error(tmp_path, f'api = ["127.0.0.1:8443", "{endpoint}"]\n')
    assert "[server] api" in message
    assert repr(endpoint) in message


def test_no_endpoint(tmp_path: Path) -> None:
    assert "[server] api" in config_error(tmp_path, "api = []\n")


@pytest.mark.parametrize("level", ["verbose", "", "critical", "trace"])
def test_bad_log_level(tmp_path: Path, level: str) -> None:
    assert "[server] log_level" in config_error(tmp_path, f'log_level = "{level}"\n')


@pytest.mark.parametrize("level", ["debug", "INFO", "Warning", "error"])
def test_log_levels(tmp_path: Path, level: str) -> None:
    assert load_config(server_file(tmp_path, f'log_level = "{level}"\n')).server.log_level == level


@pytest.mark.parametrize("mode", ["sometimes", "", "NORMAL; DROP", "WAL"])
def test_bad_synchronous(tmp_path: Path, mode: str) -> None:
    assert "[store] synchronous" in config_error(tmp_path, rest=f'[store]\nsynchronous = "{mode}"\n')


@pytest.mark.parametrize(("rest", "message"), [
    ('[store]\nbackend = "mysql"\n', '[store] backend must be "sqlite" or "postgresql"'),
    ('[store]\nbackend = "postgresql"\n', '[store] backend = "postgresql" needs [store] dsn'),
])
def test_bad_store_backend(tmp_path: Path, rest: str, message: str) -> None:
    assert message in config_error(tmp_path, rest=rest)


def test_a_postgresql_store(tmp_path: Path) -> None:
    config = load_config(server_file(
        tmp_path, rest='[store]\nbackend = "postgresql"\ndsn = "host=db dbname=notary"\n'
    ))
    assert (config.store.backend, config.store.dsn) == ("postgresql", "host=db dbname=notary")
    assert load_config(server_file(tmp_path)).store.backend == "sqlite"


@pytest.mark.parametrize("mode", ["off", "normal", "FULL", "Extra"])
def test_synchronous_modes(tmp_path: Path, mode: str) -> None:
    config = load_config(server_file(tmp_path, rest=f'[store]\nsynchronous = "{mode}"\n'))
    assert config.store.synchronous == mode


@pytest.mark.parametrize(
    "text", ["[server\n", "key_file = \n", "[server]\nkey_file = 'a'\nkey_file = 'b'\n",
             "[server]\n[server]\n", "= 1\n"],
)
def test_invalid_toml(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "not valid TOML" in message
    assert str(path) in message
    assert "\n" not in message


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "notary.toml"
    path.write_bytes(b"[server]\nkey_file = '\xff\xfe'\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "No such file" in str(info.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = server_file(tmp_path)
    path.chmod(0)
    try:
        with pytest.raises(ConfigError, match="cannot read config"):
            load_config(path)
    finally:
        path.chmod(0o600)


# -- parse_endpoint --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port", "shown"),
    [
        ("127.0.0.1:8443", "127.0.0.1", 8443, "127.0.0.1:8443"),
        ("0.0.0.0:0", "0.0.0.0", 0, "0.0.0.0:0"),
        ("[::1]:443", "::1", 443, "[::1]:443"),
        ("[::]:4242", "::", 4242, "[::]:4242"),
        ("[2001:db8::1]:65535", "2001:db8::1", 65535, "[2001:db8::1]:65535"),
        ("[::ffff:192.0.2.1]:1", "::ffff:192.0.2.1", 1, "[::ffff:192.0.2.1]:1"),
        ("localhost:8080", "localhost", 8080, "localhost:8080"),
        ("  127.0.0.1:80  ", "127.0.0.1", 80, "127.0.0.1:80"),
        ("127.0.0.1:00080", "127.0.0.1", 80, "127.0.0.1:80"),
    ],
)
def test_parse_endpoint(text: str, host: str, port: int, shown: str) -> None:
    endpoint = parse_endpoint(text)
    assert endpoint == Endpoint(host, port)
    assert str(endpoint) == shown


@pytest.mark.parametrize(
    "text",
    [
        "", "127.0.0.1", "127.0.0.1:", ":443", "[::1]", "::1:443", "[::1:443", "::1]:443",
        "127.0.0.1:65536", "127.0.0.1:123456", "127.0.0.1:-1", "127.0.0.1:+80", "127.0.0.1:8o",
        "127.0.0.1:\u0663", "127.0.0.1:\uff18\uff10", "example.com:443", "LOCALHOST:80",
        "256.0.0.1:80", "[fe80::1%eth0]:80", "[zz::1]:80", "127.0.0.1 :80",
        "127.0.0.1:80:80", "http://127.0.0.1:80",
    ],
)
def test_parse_endpoint_refuses(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_endpoint(text, what="--api")
    assert str(info.value).startswith("--api ")


def test_server_config_defaults_listen_on_both_convergence_ports() -> None:
    server = ServerConfig(Path("k"), Path("c"), Path("d"))
    assert [e.port for e in server.api] == [443, 4242]


def test_unreadable_file_even_as_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = server_file(tmp_path)

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"cannot read config {path}: Permission denied"


# -- [relay] ------------------------------------------------------------------------


def test_relay_defaults_are_the_protocol_s(tmp_path: Path) -> None:
    relay = load_config(server_file(tmp_path)).relay
    assert relay == RelayConfig()
    assert relay.listen == (Endpoint("0.0.0.0", 80),)
    assert relay.destinations == "bundles" and relay.bundles == ()
    assert relay.dial_port == 4242 and relay.allow_addresses == ()


def test_relay_section_from_the_file(tmp_path: Path) -> None:
    path = server_file(
        tmp_path,
        rest='[relay]\nlisten = ["127.0.0.1:8280", "[::1]:8280"]\ndestinations = "public"\n'
        'bundles = ["trusted/", "/etc/notary/other.notary"]\nallow_addresses = ["127.0.0.0/8"]\n'
        "dial_port = 14242\nhead_timeout_s = 1\nconnect_timeout_s = 2\nidle_timeout_s = 3\n"
        "max_lifetime_s = 4\nmax_tunnels = 5\nmax_header_bytes = 6\nmax_headers = 7\n"
        "max_destinations = 8\nbuffer_bytes = 9\n",
    )
    relay = load_config(path).relay
    assert relay == RelayConfig(
        listen=(Endpoint("127.0.0.1", 8280), Endpoint("::1", 8280)),
        destinations="public",
        bundles=(tmp_path / "trusted", Path("/etc/notary/other.notary")),
        allow_addresses=("127.0.0.0/8",),
        dial_port=14242,
        head_timeout_s=1.0,
        connect_timeout_s=2.0,
        idle_timeout_s=3.0,
        max_lifetime_s=4.0,
        max_tunnels=5,
        max_header_bytes=6,
        max_headers=7,
        max_destinations=8,
        buffer_bytes=9,
    )


def test_relay_may_listen_nowhere(tmp_path: Path) -> None:
    assert load_config(server_file(tmp_path, rest="[relay]\nlisten = []\n")).relay.listen == ()


@pytest.mark.parametrize(
    ("rest", "expected"),
    [
        ('destinations = "open"', "[relay] destinations must be one of bundles, public, off"),
        ("dial_port = 0", "[relay] dial_port must be a port number 1-65535"),
        ("dial_port = 65536", "[relay] dial_port must be a port number 1-65535"),
        ('allow_addresses = ["10.0.0.1/8"]', "[relay] allow_addresses"),
        ('bundles = "one.notary"', "[relay] bundles must be a list of paths"),
        ("bundles = [1]", "[relay] bundles must be a list of paths"),
        ('listen = ["nowhere"]', "[relay] listen"),
    ],
)
def test_bad_relay_settings(tmp_path: Path, rest: str, expected: str) -> None:
    assert config_error(tmp_path, rest=f"[relay]\n{rest}\n").startswith(expected)


@pytest.mark.parametrize("rate", ["0.0", "1.0", "1.5", "-0.1"])
def test_bloom_false_positive_rate_is_a_probability(tmp_path: Path, rate: str) -> None:
    message = config_error(tmp_path, rest=f"[cache]\nbloom_false_positive_rate = {rate}\n")
    assert message.startswith("[cache] false_positive_rate must be strictly between 0 and 1")


def test_bloom_sizing_and_plain_api_from_the_file(tmp_path: Path) -> None:
    path = server_file(
        tmp_path,
        server_extra='plain_api = ["127.0.0.1:8080"]\n',
        rest="[cache]\nbloom_expected_items = 5000\nbloom_false_positive_rate = 0.001\n",
    )
    config = load_config(path)
    assert (config.cache.bloom_expected_items, config.cache.bloom_false_positive_rate) == (
        5000, 0.001
    )
    assert config.server.plain_api == (Endpoint("127.0.0.1", 8080),)
    assert load_config(server_file(tmp_path)).server.plain_api == ()



def test_proxy_protocol_from_is_read_and_off_by_default(tmp_path: Path) -> None:
    path = server_file(tmp_path, server_extra=(
        'plain_api = ["127.0.0.1:8080"]\n'
        'proxy_protocol_from = ["127.0.0.1/32", "10.1.0.0/16", "::1"]\n'
    ))
    config = load_config(path)
    assert config.server.proxy_protocol_from == ("127.0.0.1/32", "10.1.0.0/16", "::1")
    assert load_config(server_file(tmp_path)).server.proxy_protocol_from == ()


@pytest.mark.parametrize(("extra", "expected"), [
    ('plain_api = ["127.0.0.1:8080"]\nproxy_protocol_from = ["10.0.0.1/8"]\n',
     "[server] proxy_protocol_from: invalid CIDR '10.0.0.1/8'"),
    ('plain_api = ["127.0.0.1:8080"]\nproxy_protocol_from = ["edge.example"]\n',
     "[server] proxy_protocol_from: invalid CIDR 'edge.example'"),
    ('plain_api = ["127.0.0.1:8080"]\nproxy_protocol_from = "127.0.0.1"\n',
     "[server] proxy_protocol_from must be a list of strings"),
    ('proxy_protocol_from = ["127.0.0.1"]\n',
     "[server] proxy_protocol_from needs [server] plain_api"),
])
def test_proxy_protocol_from_errors_name_the_key(
    tmp_path: Path, extra: str, expected: str
) -> None:
    assert config_error(tmp_path, extra).startswith(expected)

# -- [store]: what the notary keeps (issue 17) ----------------------------------------


def test_store_limits_are_read_and_make_the_timeline_limits(tmp_path: Path) -> None:
    config = load_config(server_file(tmp_path, rest=(
        "[store]\nmax_certificate_bytes = 0\nmax_certificates_per_target = 3\n"
        "max_runs_per_certificate = 4\nforget_unasked_after_s = 864000\n"
    )))
    assert config.store.timeline_limits() == TimelineLimits(0, 3, 4)
    assert config.store.forget_unasked_after_s == 864000


def test_store_limit_defaults_are_the_timeline_limit_defaults() -> None:
    assert StoreConfig().timeline_limits() == TimelineLimits()
    assert StoreConfig().forget_unasked_after_s == 90 * 86400


@pytest.mark.parametrize(("rest", "message"), [
    ("[store]\nmax_certificate_bytes = -1\n", "[store] max_certificate_bytes must be 0"),
    ("[store]\nmax_certificates_per_target = 0\n",
     "[store] max_certificates_per_target must be greater than 0"),
    ("[store]\nmax_runs_per_certificate = -2\n",
     "[store] max_runs_per_certificate must be greater than 0"),
    ("[store]\nforget_unasked_after_s = 0\n",
     "[store] forget_unasked_after_s must be greater than 0"),
    ("[store]\nforget_unasked_after_s = 86400\n",
     "[store] forget_unasked_after_s must be at least [rescan] forget_after_s"),
    ("[store]\nmax_certificates_per_target = 1.5\n", "must be an integer"),
    ('[store]\nforget_unasked_after_s = "90d"\n', "must be an integer"),
])
def test_bad_store_limits(tmp_path: Path, rest: str, message: str) -> None:
    assert message in config_error(tmp_path, rest=rest)


def test_a_short_retention_is_allowed_without_rescans(tmp_path: Path) -> None:
    config = load_config(server_file(
        tmp_path, rest="[store]\nforget_unasked_after_s = 86400\n[rescan]\nenabled = false\n"))
    assert config.store.forget_unasked_after_s == 86400


def test_each_worker_enforces_its_share_of_the_per_client_rates() -> None:
    limits = LimitsConfig(
        queries_per_s_per_prefix=20.0, query_burst=100, probes_per_s_per_prefix=1.0,
        probe_burst=3, probes_per_minute_per_target=4, probes_per_s_per_destination_prefix=10.0,
        destination_probe_burst=50, max_connections_per_address=64,
    )
    assert limits.shared_by(1) is limits
    share = limits.shared_by(4)
    assert (share.queries_per_s_per_prefix, share.query_burst) == (5.0, 25)
    assert (share.probes_per_s_per_prefix, share.probe_burst) == (0.25, 1)  # bursts >= 1
    assert share.probes_per_minute_per_target == 1.0
    assert (share.probes_per_s_per_destination_prefix, share.destination_probe_burst) == (2.5, 13)
    assert share.max_connections_per_address == 64  # a connection lives on one worker
    assert (share.log_bytes_per_s_per_prefix, share.log_burst_bytes) == (256.0, 65536)
    off = LimitsConfig(queries_per_s_per_prefix=0).shared_by(4)
    assert off.queries_per_s_per_prefix == 0  # a rule that is off stays off
    log = LogConfig(statements_per_target_per_hour=12.0)
    assert log.shared_by(1) is log and log.shared_by(4).statements_per_target_per_hour == 3.0
    assert LogConfig(statements_per_target_per_hour=0).shared_by(4) == LogConfig(
        statements_per_target_per_hour=0
    )


def test_verification_is_by_perspective_unless_configured(tmp_path: Path) -> None:
    config = load_config(server_file(tmp_path))
    assert config.verify.backends == ("perspective",) and not config.verify.dane
    both = load_config(server_file(
        tmp_path, rest='[verify]\nbackends = ["dane", "perspective"]\n'
                      '[dns]\nresolvers = ["127.0.0.1:5353", "[::1]:53"]\n'
    ))
    assert both.verify.dane and both.dns.resolvers == (
        Endpoint("127.0.0.1", 5353), Endpoint("::1", 53)
    )


@pytest.mark.parametrize("backends", ['["perspective", "dane"]', '[]', '["dnssec"]',
                                      '["dane", "dane"]'])
def test_only_the_known_backend_lists_are_accepted(tmp_path: Path, backends: str) -> None:
    assert "[verify] backends must be" in config_error(
        tmp_path, rest=f"[verify]\nbackends = {backends}\n"
    )


def test_the_dane_reuse_floor_is_positive_and_below_the_ceiling(tmp_path: Path) -> None:
    assert load_config(server_file(tmp_path)).verify.dane_reuse_min_s == 30
    assert "[verify] dane_reuse_min_s must be greater than 0" in config_error(
        tmp_path, rest="[verify]\ndane_reuse_min_s = 0\n")
    assert "[verify] dane_reuse_min_s must be at most dane_reuse_max_s" in config_error(
        tmp_path, rest="[verify]\ndane_reuse_min_s = 60\ndane_reuse_max_s = 59\n")


def test_the_resolver_validation_check_settings(tmp_path: Path) -> None:
    dns = load_config(server_file(tmp_path)).dns
    assert (dns.validation_check_name, dns.require_validation, dns.validation_recheck_s) == (
        ".", True, 60.0)
    dane = '[verify]\nbackends = ["dane"]\n[dns]\n'
    lab = load_config(server_file(
        tmp_path, rest=dane + 'validation_check_name = "lab.test"\nrequire_validation = false\n'))
    assert (lab.dns.validation_check_name, lab.dns.require_validation) == ("lab.test", False)
    for name in ('""', '"a..b"', '"bücher.test"'):
        assert "[dns] validation_check_name" in config_error(
            tmp_path, rest=dane + f"validation_check_name = {name}\n")
    assert "[dns] validation_recheck_s must be greater than 0" in config_error(
        tmp_path, rest=dane + "validation_recheck_s = 0\n")


def test_dane_trusts_only_loopback_or_listed_resolvers(tmp_path: Path) -> None:
    public = '[dns]\nresolvers = ["192.0.2.53:53"]\n'
    message = config_error(tmp_path, rest='[verify]\nbackends = ["dane"]\n' + public)
    assert "[dns] resolver 192.0.2.53:53 is neither loopback nor in [dns] trusted" in message
    trusted = load_config(server_file(
        tmp_path, rest='[verify]\nbackends = ["dane"]\n' + public + 'trusted = ["192.0.2.53"]\n'
    ))
    assert trusted.dns.trusted == ("192.0.2.53",)
    # Without DANE the resolvers are not used for verification: no check.
    assert load_config(server_file(tmp_path, rest=public)).dns.resolvers[0].host == "192.0.2.53"


def test_a_full_v2_batch_of_the_largest_entries_fits_the_body_bound() -> None:
    """Every field of R4 at its largest, colon-form hashes and an IPv6
    address included, in a batch of ``max_batch``: not a 413 (the bound
    was sized for two hashes and refused such batches)."""
    from notary.protocol import v2

    config = load_config(None, {"server": dict(REQUIRED)})
    host = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters
    colons = lambda size: ":".join(["AB"] * size)  # noqa: E731
    entry = {"host": host, "port": 65535, "sha256": colons(32), "sha1": colons(20),
             "spki_sha256": colons(32), "address": "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"}
    body = json.dumps({"targets": [entry] * config.v2.max_batch, "nonce": "x" * 128}).encode()
    assert len(body) <= config.api_body_bytes
    parsed = v2.parse_query_request(
        body, max_batch=config.v2.max_batch, max_body_bytes=config.api_body_bytes
    )
    assert len(parsed.targets) == config.v2.max_batch
