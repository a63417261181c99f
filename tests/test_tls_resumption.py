"""TLS session resumption on the API listener (issue 21): a client that
reconnects offering the session (TLS 1.2) or the ticket (TLS 1.3) it got
resumes it, and ``notary_tls_handshakes_total`` counts resumed and full
handshakes. A browser add-on asks one query per connection: resumption is
what keeps its handshakes cheap."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio

from tests.support.metrics import value
from tests.support.notaries import client_context, open_notary
from tests.support.tls_targets import LOCALHOST

INDEX = b"GET / HTTP/1.0\r\n\r\n"


async def query_once(port: int, context: ssl.SSLContext,
                     session: ssl.SSLSession | None) -> tuple[ssl.SSLSession, bool, bytes]:
    """One connection, one HTTP/1.0 request read to the server's close: the
    session to offer next time, whether this one resumed, the answer."""
    tcp = await trio.open_tcp_stream(LOCALHOST, port)
    stream = trio.SSLStream(tcp, context, server_hostname=None, https_compatible=True)
    if session is not None:
        stream.session = session  # offered in the ClientHello (forwarded to the SSLObject)
    async with stream:
        await stream.send_all(INDEX)
        answer = b""
        # TLS 1.3 tickets come after the handshake, with the answer.
        while chunk := await stream.receive_some(65536):
            answer += chunk
        return stream.session, stream.session_reused, answer


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
async def test_a_reconnecting_client_resumes_its_session(
    tmp_path: Path, version: ssl.TLSVersion
) -> None:
    context = client_context()
    context.minimum_version = context.maximum_version = version
    async with open_notary(tmp_path) as notary:
        session, reused, answer = await query_once(notary.port, context, None)
        assert answer.startswith(b"HTTP/1.1 200 ") and not reused
        for _ in range(3):
            session, reused, answer = await query_once(notary.port, context, session)
            assert reused, version
            assert answer.startswith(b"HTTP/1.1 200 ")
        # A client that offers nothing makes a full handshake.
        assert not (await query_once(notary.port, context, None))[1]
        metrics = notary.running.metrics
        assert metrics is not None
        text = (await metrics.render()).decode()
    assert value(text, "notary_tls_handshakes_total", resumed="true") == 3
    assert value(text, "notary_tls_handshakes_total", resumed="false") == 2
