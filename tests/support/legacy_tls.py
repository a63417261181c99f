"""TLS 1.0 in tests: whether this machine's OpenSSL can still speak it at all
(``local_openssl_speaks_tls10``: a handshake with itself in memory, at
security level 0), and a GET of ``/`` from a notary on loopback over TLS 1.0
(``tls10_index``: the status; a refused handshake raises
``trio.BrokenResourceError``; 10 s at most)."""

from __future__ import annotations

import ssl
import warnings
from pathlib import Path

import trio

from notary.state import crypto
from tests.support.notaries import parse_response


def tls10_client_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def local_openssl_speaks_tls10(tmp_path: Path) -> bool:
    """Whether this OpenSSL completes a TLS 1.0 handshake with itself at all
    (in memory, at security level 0)."""
    key = crypto.generate_rsa_key()
    cert = crypto.make_self_signed_certificate(key, "127.0.0.1")
    (tmp_path / "k.pem").write_bytes(crypto.private_key_pem(key))
    (tmp_path / "c.pem").write_bytes(crypto.certificate_pem(cert))
    try:
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            server_context.minimum_version = ssl.TLSVersion.TLSv1
        server_context.set_ciphers("DEFAULT:@SECLEVEL=0")
        server_context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
        client_context_ = tls10_client_context()
    except (ssl.SSLError, ValueError):
        return False
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context_.wrap_bio(to_client, to_server)
    server = server_context.wrap_bio(to_server, to_client, server_side=True)
    for _ in range(10):
        done = True
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                done = False
            except ssl.SSLError:
                return False
        if done:
            return client.version() == "TLSv1"
    return False


async def tls10_index(port: int) -> int:
    with trio.fail_after(10):
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        stream = trio.SSLStream(
            tcp, tls10_client_context(), server_hostname=None, https_compatible=True
        )
        async with stream:
            await stream.do_handshake()
            assert stream.version() == "TLSv1"
            await stream.send_all(b"GET / HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    return parse_response(data).status
