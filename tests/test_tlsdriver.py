"""The TLS driver (``notary.server.tlsdriver``), both twins side by side: the
compiled ``notary.server._fasttls`` (OpenSSL's own API) and the pure
``notary.server._fasttls_py`` (``ssl.SSLSocket``) must answer every call the
same, step by step, over a real socket pair against a client driven by hand
(an ``ssl.SSLObject`` on memory buffers): the handshake's would-blocks, reads
and writes, a full send buffer, the ends of a connection (close_notify, a
close without it, a reset), garbage, resumption, close and use after close.
``TlsStream``, which waits on these answers, is tested in
tests/test_tlsstream.py and through every HTTPS test.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trustme

import notary.server._fasttls_py as pure_impl
from notary.server import tlsdriver
from tests.support.twins import KINDS, require_extension, twin

REPO_ROOT = Path(__file__).resolve().parents[1]
DRIVER = "notary.server._fasttls"


def _compiled() -> ModuleType:
    return twin("compiled", DRIVER)


@pytest.fixture(params=KINDS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    return twin(request.param, DRIVER)


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_context(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("localhost").configure_cert(context)
    context.set_alpn_protocols(["http/1.1"])
    return context


@pytest.fixture(scope="module")
def client_context(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    authority.configure_trust(context)
    context.set_alpn_protocols(["http/1.1"])
    return context


class Client:
    """A TLS client stepped by hand over its end of the pair."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext,
                 session: ssl.SSLSession | None = None) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(
            self.incoming, self.outgoing, server_hostname="localhost", session=session
        )

    def flush(self) -> None:
        """Send what the client wrote."""
        data = self.outgoing.read()
        if data:
            self.sock.sendall(data)

    def pull(self) -> None:
        """Take in what the server sent so far."""
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            if not data:
                self.incoming.write_eof()
                return
            self.incoming.write(data)

    def step_handshake(self) -> bool:
        self.pull()
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self.flush()
            return False
        self.flush()
        return True

    def write(self, data: bytes) -> None:
        self.tls.write(data)
        self.flush()

    def read(self) -> bytes:
        self.pull()
        got = b""
        while True:
            try:
                chunk = self.tls.read(65536)
            except ssl.SSLWantReadError:
                return got
            if not chunk:
                return got
            got += chunk


def connect(impl: ModuleType, server_context: ssl.SSLContext, client_context: ssl.SSLContext,
            session: ssl.SSLSession | None = None):
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    connection = impl.ServerContext(server_context).connection(ours)
    return connection, Client(theirs, client_context, session)


def handshake(connection, client: Client) -> None:
    """Step both sides until both are done (each step must progress)."""
    for _ in range(10):
        client_done = client.step_handshake()
        server = connection.handshake()
        if server == 0 and client_done:
            client.step_handshake()
            return
        # Both twins name the same codes (test_both_twins_name_the_same_codes).
        assert server in (0, pure_impl.WANT_READ)
    raise AssertionError("the handshake did not finish")


def test_both_twins_name_the_same_codes() -> None:
    compiled = _compiled()
    assert (compiled.WANT_READ, compiled.WANT_WRITE) == (pure_impl.WANT_READ, pure_impl.WANT_WRITE)
    assert pure_impl.WANT_READ < 0 and pure_impl.WANT_WRITE < 0


def test_the_handshake_waits_for_each_flight_of_the_client(impl, server_context, client_context):
    connection, client = connect(impl, server_context, client_context)
    with client.sock, connection.socket:
        assert connection.version() is None
        assert connection.handshake() == impl.WANT_READ  # no ClientHello yet
        assert connection.handshake() == impl.WANT_READ  # still none: nothing read, no error
        assert not client.step_handshake()  # ClientHello out
        assert connection.handshake() == impl.WANT_READ  # flight sent, Finished awaited
        assert client.step_handshake()  # the client is done and sends Finished
        assert connection.handshake() == 0
        assert connection.version() == "TLSv1.3"
        assert not connection.session_reused
        connection.close()


def test_reads_and_writes_after_the_handshake(impl, server_context, client_context):
    connection, client = connect(impl, server_context, client_context)
    with client.sock, connection.socket:
        handshake(connection, client)
        assert connection.receive(100) == impl.WANT_READ
        client.write(b"x" * 100)
        assert connection.receive(10) == b"x" * 10  # at most max_bytes
        assert connection.receive(1000) == b"x" * 90
        assert connection.receive(1000) == impl.WANT_READ
        assert connection.send(b"answer") == 6
        assert connection.send(memoryview(b"--answer--")[2:8]) == 6
        assert connection.send(b"") == 0
        assert client.read() == b"answeranswer"
        with pytest.raises(ValueError):
            connection.receive(0)
        connection.close()


def push_stale_openssl_error() -> None:
    """Leave an error in this thread's OpenSSL error queue, as a library
    sharing the thread may (the queue OpenSSL's ``SSL_get_error`` reads)."""
    crypto = ctypes.CDLL(ctypes.util.find_library("crypto") or "libcrypto.so.3")
    crypto.ERR_new()
    crypto.ERR_set_error(ctypes.c_int(20), ctypes.c_int(65), None)  # ERR_LIB_SSL, any reason
    assert crypto.ERR_peek_error() != 0


def test_a_stale_openssl_error_does_not_fail_the_next_call(server_context, client_context):
    """The compiled driver empties the queue before each call it explains with
    ``SSL_get_error``. (Python's ``ssl``, the pure twin's, does not before a
    read: a stale error there is raised as the read's "unknown error".)"""
    impl = _compiled()
    connection, client = connect(impl, server_context, client_context)
    with client.sock, connection.socket:
        push_stale_openssl_error()
        handshake(connection, client)
        push_stale_openssl_error()
        assert connection.receive(100) == impl.WANT_READ  # not the stale error
        client.write(b"query")
        push_stale_openssl_error()
        assert connection.receive(100) == b"query"
        push_stale_openssl_error()
        assert connection.send(b"answer") == 6
        assert client.read() == b"answer"
        connection.close()


def test_a_full_socket_buffer_is_want_write_and_the_same_bytes_go_later(
    impl, server_context, client_context
):
    connection, client = connect(impl, server_context, client_context)
    with client.sock, connection.socket:
        handshake(connection, client)
        block = bytes(range(256)) * 64  # 16 KiB, one record
        sent = 0
        results = []
        for _ in range(1000):
            result = connection.send(block)
            results.append(result)
            if result == impl.WANT_WRITE:
                break
            assert result == len(block)
            sent += result
        assert results[-1] == impl.WANT_WRITE, "the socket buffer never filled"
        received = b""
        while len(received) < sent:
            received += client.read()
        # The retry with the same bytes completes the record OpenSSL began.
        for _ in range(1000):
            result = connection.send(block)
            if result != impl.WANT_WRITE:
                break
            received += client.read()
        assert result == len(block)
        while len(received) < sent + len(block):
            received += client.read()
        assert received == block * (sent // len(block) + 1)
        connection.close()


@pytest.mark.parametrize("ending", ["close_notify", "close", "reset"])
def test_the_clients_end_is_an_end(impl, server_context, client_context, ending):
    connection, client = connect(impl, server_context, client_context)
    with connection.socket:
        handshake(connection, client)
        client.write(b"last words")
        if ending == "close_notify":
            with pytest.raises(ssl.SSLWantReadError):
                client.tls.unwrap()
            client.flush()
        elif ending == "reset":  # unread bytes (the session tickets) make the close a reset
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        client.sock.close()
        assert connection.receive(100) == b"last words"
        assert connection.receive(100) == b""
        connection.close()


def test_garbage_breaks_the_handshake(impl, server_context, client_context):
    connection, client = connect(impl, server_context, client_context)
    with client.sock, connection.socket:
        client.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(ssl.SSLError):
            connection.handshake()
        connection.close()  # nothing to send: the handshake was never made


def test_a_peer_gone_mid_handshake_is_an_error_or_an_eof(impl, server_context, client_context):
    connection, client = connect(impl, server_context, client_context)
    with connection.socket:
        client.step_handshake()
        client.sock.close()
        with pytest.raises((ssl.SSLError, OSError)):
            for _ in range(3):
                assert connection.handshake() == impl.WANT_READ


def test_close_sends_close_notify_once_and_ends_the_connection(
    impl, server_context, client_context
):
    connection, client = connect(impl, server_context, client_context)
    with client.sock, connection.socket:
        handshake(connection, client)
        connection.close()
        connection.close()  # again: nothing
        client.pull()
        # close_notify: an empty read (with nothing sent, it would raise
        # SSLWantReadError).
        assert client.tls.read(10) == b""
        for call in (connection.handshake, lambda: connection.receive(10),
                     lambda: connection.send(b"x")):
            with pytest.raises(ValueError):
                call()
        assert connection.version() is None
        assert not connection.session_reused


def test_a_session_is_resumed(impl, server_context, client_context):
    connection, client = connect(impl, server_context, client_context)
    with client.sock, connection.socket:
        handshake(connection, client)
        client.write(b"ping")
        assert connection.receive(10) == b"ping"
        assert connection.send(b"pong") == 4
        assert client.read() == b"pong"  # reads the tickets too
        session = client.tls.session
        connection.close()
    assert session is not None
    connection, client = connect(impl, server_context, client_context, session)
    with client.sock, connection.socket:
        handshake(connection, client)
        assert connection.session_reused
        assert client.tls.session_reused
        connection.close()


def test_a_server_context_needs_an_ssl_context(impl):
    with pytest.raises(TypeError):
        impl.ServerContext(object())


def test_the_compiled_twin_refuses_callbacks_it_cannot_run(server_context, authority):
    compiled = _compiled()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("localhost").configure_cert(context)
    context.sni_callback = lambda *args: None
    with pytest.raises(ValueError, match="callback"):
        compiled.ServerContext(context)
    assert pure_impl.ServerContext(context).context is context
    compiled.ServerContext(server_context)  # the notary's kind: accepted


def test_the_selection_follows_the_environment() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTARY_NO_EXTENSIONS", "NOTARY_REQUIRE_EXTENSION")}
    code = "from notary.server import tlsdriver; print(tlsdriver.IMPLEMENTATION)"
    pure = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=True,
                          env={**env, "NOTARY_NO_EXTENSIONS": "1"})
    assert pure.stdout.strip() == "pure"
    default = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=60, check=True, env=env)
    try:
        importlib.import_module(DRIVER)
    except ImportError:
        built = False
    else:
        built = True
    assert default.stdout.strip() == ("compiled" if built else "pure")
    if require_extension():
        assert tlsdriver.IMPLEMENTATION == "compiled"
    elif os.environ.get("NOTARY_NO_EXTENSIONS", "") not in ("", "0"):
        assert tlsdriver.IMPLEMENTATION == "pure"
