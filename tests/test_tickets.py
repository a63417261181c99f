"""TLS session-ticket keys shared by a node's workers (``notary.server.tickets``):
two server contexts given the same keys resume each other's sessions, TLS
1.2 and 1.3 (over memory BIOs: no socket); contexts with keys of their own
do not; the keys travel from the supervisor to a worker through a memory
file and bad hand-overs are refused clearly; and a real two-worker node
(loopback) resumes every reconnection, whichever worker it reaches."""

from __future__ import annotations

import os
import re
import socket
import ssl
from pathlib import Path

import pytest
import trio
import trustme

from notary.errors import UsageError
from notary.server.tickets import (
    TICKET_KEYS_BYTES,
    TICKET_KEYS_ENV,
    install_ticket_keys,
    installed_ticket_keys,
    new_ticket_keys,
    take_ticket_keys,
    ticket_keys_file,
)
from tests.support.nodes import run_node
from tests.support.notaries import LOCALHOST

VERSIONS = [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA, keys: bytes | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("notary.test").configure_cert(context)
    if keys is not None:
        install_ticket_keys(context, keys)
    return context


def client_context(ca: trustme.CA, version: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(context)
    context.minimum_version = context.maximum_version = version
    return context


def exchange(client_context: ssl.SSLContext, server_context: ssl.SSLContext,
             session: ssl.SSLSession | None = None) -> ssl.SSLObject:
    """A handshake and one request and answer over memory BIOs (the answer
    carries TLS 1.3 tickets to the client); the client's ``SSLObject``."""
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    client = client_context.wrap_bio(pipes[0], pipes[1], server_hostname="notary.test",
                                     session=session)
    server = server_context.wrap_bio(pipes[2], pipes[3], server_side=True)

    def pump() -> None:
        pipes[2].write(pipes[1].read())
        pipes[0].write(pipes[3].read())

    for _ in range(10):
        done = 0
        for side in (client, server):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
            pump()
        if done == 2:
            break
    client.write(b"ask")
    pump()
    assert server.read(3) == b"ask"
    server.write(b"answer")
    pump()
    assert client.read(6) == b"answer"
    return client


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.name)
def test_contexts_with_the_same_keys_resume_each_others_sessions(ca, version) -> None:
    keys = new_ticket_keys()
    first, second = server_context(ca, keys), server_context(ca, keys)
    client = client_context(ca, version)
    session = exchange(client, first).session
    assert session is not None
    resumed = exchange(client, second, session)
    assert resumed.session_reused and resumed.version() == version.name.replace("_", ".")
    # Without shared keys, another worker's context makes a full handshake.
    other = exchange(client, server_context(ca), session)
    assert not other.session_reused


def test_installed_keys_read_back_and_bad_keys_are_refused(ca) -> None:
    keys = new_ticket_keys()
    context = server_context(ca, keys)
    assert installed_ticket_keys(context) == keys
    assert installed_ticket_keys(server_context(ca)) != keys  # OpenSSL's own, at random
    assert len(keys) == TICKET_KEYS_BYTES and new_ticket_keys() != keys
    with pytest.raises(ValueError, match="80 bytes, not 79"):
        install_ticket_keys(context, keys[:-1])
    with pytest.raises(TypeError):
        install_ticket_keys(object(), keys)  # type: ignore[arg-type]
    assert installed_ticket_keys(context) == keys  # unchanged by the refusals


def test_keys_travel_in_a_memory_file_the_worker_reads_and_closes() -> None:
    keys = new_ticket_keys()
    fd = ticket_keys_file(keys)
    try:
        assert not os.get_inheritable(fd)  # a child gets it only through pass_fds
        copy = os.dup(fd)
        environ = {TICKET_KEYS_ENV: str(copy), "OTHER": "kept"}
        assert take_ticket_keys(environ) == keys
        assert environ == {"OTHER": "kept"}  # no child of the worker inherits it
        with pytest.raises(OSError):
            os.fstat(copy)  # closed
        assert take_ticket_keys({}) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize(("value", "message"), [
    ("seven", "not a file descriptor"),
    ("-1", "not a file descriptor"),
    ("987654", "cannot read fd 987654"),
    ("short", "holds 5 bytes, not 80"),
])
def test_a_bad_hand_over_is_a_usage_error(value: str, message: str) -> None:
    if value == "short":
        value = str(ticket_keys_file(b"12345"))
    with pytest.raises(UsageError, match=message):
        take_ticket_keys({TICKET_KEYS_ENV: value})


def serving_pid(pids: set[int], server_port: int, client_port: int) -> int | None:
    """Which of ``pids`` holds the server side of the loopback TCP connection
    from ``client_port`` to ``server_port`` (``/proc``: no packet sent)."""
    wanted = f":{server_port:04X} 0100007F:{client_port:04X} "
    with open("/proc/net/tcp") as table:
        inode = next((line.split()[9] for line in table if wanted in line), None)
    if inode is None:
        return None
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


async def test_a_two_worker_node_resumes_every_reconnection_whichever_worker_it_reaches(
    tmp_path: Path,
) -> None:
    async with run_node(tmp_path) as node:
        match = await node.wait_for(r"serving the API on 127\.0\.0\.1:(\d+)")
        await node.wait_for(r"node ready: 2 workers serving")
        port = int(match.group(1))
        pids = {int(m.group(1)) for line in node.log
                if (m := re.search(r"worker \d started \(pid (\d+)\)", line))}
        assert len(pids) == 2

        def reconnect() -> list[tuple[bool, int | None]]:
            """(resumed, the worker that served it) of TLS 1.3 connections,
            each after the first offering the first one's session, until
            each worker served a few."""
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.load_verify_locations(tmp_path / "notary.crt")
            context.check_hostname = False
            session, seen = None, []
            while len(seen) < 200 and min(
                sum(pid == worker for _, pid in seen[1:]) for worker in pids
            ) < 4:
                with socket.create_connection((LOCALHOST, port), timeout=10) as raw, \
                        context.wrap_socket(raw, session=session) as sock:
                    worker = serving_pid(pids, port, sock.getsockname()[1])
                    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    while sock.recv(65536):  # TLS 1.3: the ticket comes with the answer
                        pass
                    seen.append((sock.session_reused, worker))
                    session = session or sock.session
            return seen

        seen = await trio.to_thread.run_sync(reconnect)
    assert not seen[0][0]
    by_worker = {pid: [reused for reused, served in seen[1:] if served == pid] for pid in pids}
    assert all(len(resumed) >= 4 for resumed in by_worker.values()), by_worker
    assert all(all(resumed) for resumed in by_worker.values()), by_worker
    assert None not in {served for _, served in seen}
