"""Configuration files written for tests: any text (``write``), a minimal
file whose ``[server]`` section names its files relative to the
configuration, ``FILES``, so that nothing needs to exist for it to load
(``server_file``), and one that serves on loopback port 0 with the given key
and certificate (``write_config``). Each writes in the given directory
(``notary.toml`` unless told), replacing any file of that name."""

from __future__ import annotations

from pathlib import Path

FILES = 'key_file = "notary.key"\ncert_file = "notary.crt"\ndb_file = "notary.db"\n'


def write(tmp_path: Path, text: str, name: str = "notary.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def server_file(tmp_path: Path, server_extra: str = "", rest: str = "") -> Path:
    return write(tmp_path, "[server]\n" + FILES + server_extra + "\n" + rest)


def write_config(directory: Path, key: Path, cert: Path, extra: str = "") -> Path:
    """A config on loopback port 0 (the relay too); ``extra`` follows [server]."""
    path = directory / "notary.toml"
    relay = '[relay]\nlisten = ["127.0.0.1:0"]\n'
    if "[relay]\n" in extra:
        extra, relay = extra.replace("[relay]\n", relay), ""
    path.write_text(
        f'[server]\nkey_file = "{key}"\ncert_file = "{cert}"\ndb_file = "notary.db"\n'
        f'api = ["127.0.0.1:0"]\n{extra}\n{relay}'
    )
    return path
