"""TLS at the edge with real engines (docs/edge.md): nginx's ``stream``
module and HAProxy hold the notary's certificate and key, terminate TLS on
loopback and pass each connection to the notary's plain API listener with
a PROXY header (nginx: v1, HAProxy: ``send-proxy-v2``).

Through either, a Convergence query is answered 200, over a TLS
connection that presents the notary's own certificate (the pin clients
hold) and signed with its key; and the per-client limits see the client's
address, not the edge's: two clients in two prefixes get two budgets.

The edges run as throwaway processes (tests.support.edge); a test skips
when its engine is not installed.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import trio

from notary.config import Endpoint
from notary.protocol import convergence
from notary.state.crypto import verify_convergence_signature
from tests.support.edge import open_haproxy_edge, open_nginx_edge
from tests.support.notaries import (
    NotaryUnderTest,
    RawResponse,
    exchange_over_tls,
    legacy_request,
    open_notary,
    sha1_fp,
)
from tests.support.tls_targets import LOCALHOST, open_tls_target

SITE = "www.example.test"
#: Two clients in two /24 prefixes (two query budgets).
CLIENT, OTHER_CLIENT = "127.0.1.2", "127.0.2.2"
EDGES: dict[str, Callable[..., AbstractContextManager[int]]] = {
    "nginx": open_nginx_edge, "haproxy": open_haproxy_edge,
}


async def query_through(port: int, request: bytes, *, source: str) -> RawResponse:
    """``request`` over TLS to the edge at ``port``, from ``source``."""
    with trio.fail_after(30):
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        await sock.bind((source, 0))
        await sock.connect((LOCALHOST, port))
        return await exchange_over_tls(trio.SocketStream(sock), request)


def assert_the_notarys_answer(notary: NotaryUnderTest, answer: RawResponse, leaf: bytes) -> None:
    """200, over TLS with the notary's certificate, signed with its key,
    vouching for ``leaf``."""
    assert answer.status == 200, answer
    assert answer.peer_sha1 == notary.sha1_pin
    parsed = convergence.parse_answer(answer.body)
    key = notary.certificate.public_key()
    assert verify_convergence_signature(key, parsed.payload, parsed.signature_b64)
    listed = [row["fingerprint"] for row in json.loads(answer.body)["fingerprintList"]]
    assert listed == [sha1_fp(leaf)]


@pytest.mark.parametrize("edge", EDGES)
async def test_a_query_through_the_edge_is_the_notarys_and_limits_see_the_client(
    tmp_path: Path, edge: str,
) -> None:
    async with open_tls_target(names=[SITE]) as site, open_notary(
        tmp_path / "notary", names={SITE: [site.host]},
        server={"plain_api": (Endpoint(LOCALHOST, 0),),
                "proxy_protocol_from": (f"{LOCALHOST}/32",)},
        # Three queries per client prefix, never refilled (the notary's
        # clock stands still); loopback clients are not exempt here.
        limits={"exempt_clients": (), "queries_per_s_per_prefix": 0.001, "query_burst": 3},
        answers={"failures_at_deadline": False}, rescan={"enabled": False},
    ) as notary:
        leaf = site.leaf_der(SITE)
        request = legacy_request(f"{SITE}+{site.port}", sha1_fp(leaf))
        with EDGES[edge](
            tmp_path / edge, upstream=notary.running.plain_api[0].port,
            cert=notary.config.server.cert_file, key=notary.config.server.key_file,
        ) as port:
            # The first probes the site, the next two are cache hits.
            for _ in range(3):
                assert_the_notarys_answer(
                    notary, await query_through(port, request, source=CLIENT), leaf
                )
            assert (await query_through(port, request, source=CLIENT)).status == 429
            # Another client behind the same edge has a budget of its own.
            assert_the_notarys_answer(
                notary, await query_through(port, request, source=OTHER_CLIENT), leaf
            )
        metrics = notary.running.metrics
        assert metrics is not None
        metrics.fold()
        assert (
            b'notary_http_proxy_refused_connections_total{listener="plain_api"} 0.0'
            in metrics.exposition()
        )
