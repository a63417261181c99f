"""Graceful stop of a running notary (``RunningNotary.stop_gracefully``):
listeners closed at once, idle keep-alive connections closed at once, a
request in progress answered before its connection closes, stragglers cut
when the grace period ends; and listening sockets handed in by the caller."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from notary.config import Endpoint, load_config
from notary.errors import ConfigError, UsageError
from notary.model.policy import AddressPolicy
from notary.protocol.bundle import BundleHost, make_bundle
from notary.server.app import Reloader
from notary.server.sockets import (
    WORKER_FDS_ENV,
    bind_endpoint,
    inherited_sockets,
    worker_environment,
)
from notary.state import crypto
from tests.support.notaries import LOCALHOST, make_notary_files, open_notary

PLAIN = {"plain_api": (Endpoint(LOCALHOST, 0),)}
INDEX = b"GET / HTTP/1.1\r\nHost: n\r\n\r\n"


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


async def test_graceful_stop_answers_the_request_in_progress_and_closes_the_rest(
    tmp_path: Path,
) -> None:
    async with open_notary(tmp_path, server=PLAIN) as notary:
        port = notary.running.plain_api[0].port
        idle = await trio.open_tcp_stream(LOCALHOST, port)
        await idle.send_all(INDEX)
        assert (await idle.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
        busy = await trio.open_tcp_stream(LOCALHOST, port)
        await busy.send_all(INDEX[:10])  # half a request head
        await trio.sleep(0.1)
        stopped = trio.Event()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def stop() -> None:
                    await notary.running.stop_gracefully(30.0)
                    stopped.set()

                nursery.start_soon(stop)
                # The idle connection is closed at once, without an answer.
                assert await read_until_closed(idle) == b""
                # No new connection is accepted.
                await trio.sleep(0.1)
                with pytest.raises(OSError):
                    await trio.open_tcp_stream(LOCALHOST, port)
                assert not stopped.is_set()  # waits for the request in progress
                await busy.send_all(INDEX[10:])
                answer = await read_until_closed(busy)
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert answer.count(b"HTTP/1.1") == 1
            assert stopped.is_set()


async def test_graceful_stop_cuts_stragglers_when_the_grace_period_ends(
    tmp_path: Path,
) -> None:
    async with open_notary(tmp_path, server=PLAIN, http={"header_timeout_s": 600.0}) as notary:
        port = notary.running.plain_api[0].port
        slow = await trio.open_tcp_stream(LOCALHOST, port)
        await slow.send_all(INDEX[:10])  # never finished
        await trio.sleep(0.1)
        start = trio.current_time()
        with trio.fail_after(10):
            await notary.running.stop_gracefully(0.5)
            assert await read_until_closed(slow) == b""
        assert 0.5 <= trio.current_time() - start < 5


async def test_serve_notary_serves_on_the_sockets_it_is_given(tmp_path: Path) -> None:
    """The sockets come from the caller (supervisor, systemd): the notary
    serves on exactly those, bound before it started."""
    given = bind_endpoint(Endpoint(LOCALHOST, 0))
    port = given[0].getsockname()[1]
    sockets = {"api": [], "plain_api": given, "relay": [], "perspectives": [], "admin": []}
    async with open_notary(tmp_path, sockets=sockets) as notary:
        assert [e.port for e in notary.running.plain_api] == [port]
        assert notary.running.api == ()
        stream = await trio.open_tcp_stream(LOCALHOST, port)
        await stream.send_all(INDEX.replace(b"1.1", b"1.0"))
        assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 200 ")
    assert given[0].fileno() == -1  # closed when the notary stopped


def test_worker_environment_round_trip() -> None:
    api = bind_endpoint(Endpoint(LOCALHOST, 0))
    relay = bind_endpoint(Endpoint(LOCALHOST, 0))
    try:
        environ = dict(worker_environment({"api": api, "relay": relay, "admin": []}))
        assert environ[WORKER_FDS_ENV] == f"api={api[0].fileno()};relay={relay[0].fileno()}"
        # A worker sees the same fds (inherited); here, dup them to stand in.
        duplicated = {
            WORKER_FDS_ENV: f"api={api[0].dup().detach()};relay={relay[0].dup().detach()}"
        }
        got = inherited_sockets(duplicated)
        assert got is not None and WORKER_FDS_ENV not in duplicated
        assert [s.getsockname() for s in got["api"]] == [api[0].getsockname()]
        assert [s.getsockname() for s in got["relay"]] == [relay[0].getsockname()]
        assert got["admin"] == [] and got["perspectives"] == []
        for sock in got["api"] + got["relay"]:
            sock.close()
    finally:
        for sock in api + relay:
            sock.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [("web=3", "bad entry"), ("api=", "bad entry"), ("api=x", "bad file descriptor"),
     ("api=987654", "fd 987654")],
)
def test_a_bad_worker_environment_is_a_usage_error(value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        inherited_sockets({WORKER_FDS_ENV: value})


def test_no_worker_environment_means_not_a_worker() -> None:
    assert inherited_sockets({}) is None


def test_binding_a_busy_port_names_it() -> None:
    with socket.socket() as holder:
        holder.bind((LOCALHOST, 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UsageError, match=f"127.0.0.1:{port}"):
            bind_endpoint(Endpoint(LOCALHOST, port))


def test_reloader_applies_a_valid_config_and_keeps_settings_on_error(tmp_path: Path) -> None:
    bundle = tmp_path / "served.notary"
    configs = []

    def load():
        config = configs.pop(0)
        if isinstance(config, Exception):
            raise config
        return config

    prober = SimpleNamespace(policy=AddressPolicy.from_cidrs(()))
    relay = SimpleNamespace(policy=AddressPolicy.from_cidrs(()), trusted=None)
    api = SimpleNamespace(bundle_bytes=b"old")
    reloader = Reloader(
        load, prober=prober, relay=relay, api=api, bundle_file=bundle  # type: ignore[arg-type]
    )
    key, cert, certificate = make_notary_files(tmp_path / "keys")
    made = make_bundle(name="n", location="https://127.0.0.1/served.notary", hosts=[
        BundleHost(LOCALHOST, 443, 80, crypto.certificate_pem(certificate).decode("ascii"))
    ])
    bundle.write_bytes(made.to_json())
    configs.append(load_config(None, {
        "server": {"key_file": key, "cert_file": cert, "db_file": tmp_path / "db",
                   "allow_targets": ("127.0.0.0/8",)},
        "relay": {"allow_addresses": ("10.0.0.0/8",)},
    }))
    reloader.apply(reloader.read())
    assert prober.policy == AddressPolicy.from_cidrs(("127.0.0.0/8",))
    assert relay.policy == AddressPolicy.from_cidrs(("10.0.0.0/8",))
    assert api.bundle_bytes == made.to_json()
    configs.append(ConfigError("[server] allow_targets: bad"))
    assert reloader.read() is None
    bundle.write_text("not a bundle")
    configs.append(load_config(None, {
        "server": {"key_file": key, "cert_file": cert, "db_file": tmp_path / "db"},
    }))
    assert reloader.read() is None  # the bundle does not parse: nothing applied
    assert prober.policy == AddressPolicy.from_cidrs(("127.0.0.0/8",))
