"""TLS session-ticket keys shared by a node's workers (``notary.server.tickets``):
two server contexts given the same keys resume each other's sessions, TLS
1.2 and 1.3 (over memory BIOs: no socket); contexts with keys of their own
do not; the keys travel from the supervisor to a worker through a memory
file and bad hand-overs are refused clearly; a context that cannot take
them leaves the worker serving with a warning; and a real two-worker node
(loopback) resumes every reconnection, whichever worker it reaches, a
restarted worker included."""

from __future__ import annotations

import os
import re
import signal
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


def test_a_context_that_cannot_take_the_keys_serves_with_its_own_and_a_warning(
    ca, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from notary.server import app, tickets

    def refuse(context: ssl.SSLContext, keys: bytes) -> None:
        raise tickets.TicketKeysUnavailable("this Python's ssl.SSLContext is not laid out as "
                                            "expected")

    context = server_context(ca)
    own = installed_ticket_keys(context)
    monkeypatch.setattr(app, "install_ticket_keys", refuse)
    app.share_ticket_keys(context, new_ticket_keys())
    assert installed_ticket_keys(context) == own
    assert "not shared with the node's other workers (this Python's" in caplog.text
    monkeypatch.undo()
    keys = new_ticket_keys()
    app.share_ticket_keys(context, keys)
    assert installed_ticket_keys(context) == keys


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

        def workers() -> dict[int, int]:
            return {int(m.group(1)): int(m.group(2)) for line in node.log
                    if (m := re.search(r"worker (\d) started \(pid (\d+)\)", line))}

        def reconnect(pids: set[int], session: ssl.SSLSession | None = None,
                      ) -> tuple[list[tuple[bool, int | None]], ssl.SSLSession]:
            """(resumed, the worker that served it) of TLS 1.3 connections,
            each offering ``session`` (else the first one's), until each
            worker served a few; and the session offered."""
            seen: list[tuple[bool, int | None]] = []
            while len(seen) < 200 and min(
                sum(pid == worker for _, pid in seen) for worker in pids
            ) < 4:
                with socket.create_connection((LOCALHOST, port), timeout=10) as raw, \
                        context.wrap_socket(raw, session=session) as sock:
                    worker = serving_pid(pids, port, sock.getsockname()[1])
                    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    while sock.recv(65536):  # TLS 1.3: the ticket comes with the answer
                        pass
                    if session is None:
                        session = sock.session
                        continue  # the first connection: a full handshake
                    seen.append((sock.session_reused, worker))
            assert session is not None
            return seen, session

        # One client context: a session is offered only on the context that made it.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(tmp_path / "notary.crt")
        context.check_hostname = False
        pids = set(workers().values())
        assert len(pids) == 2
        seen, session = await trio.to_thread.run_sync(reconnect, pids)
        by_worker = {pid: [reused for reused, served in seen if served == pid] for pid in pids}
        assert all(len(resumed) >= 4 for resumed in by_worker.values()), by_worker
        assert all(all(resumed) for resumed in by_worker.values()), by_worker
        assert None not in {served for _, served in seen}

        # A restarted worker gets the node's keys again: the session still resumes there.
        mark = len(node.log)
        os.kill(workers()[0], signal.SIGKILL)
        await node.wait_for(r"worker 0 \(pid \d+\) ready", after=mark)
        restarted = set(workers().values())  # the latest pid of each worker
        assert len(restarted) == 2 and restarted != pids
        pids = restarted
        seen, _ = await trio.to_thread.run_sync(reconnect, pids, session)
        assert all(reused for reused, _ in seen), seen
        assert None not in {served for _, served in seen}
