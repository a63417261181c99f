"""The Perspectives protocol served end to end (plain-HTTP port and HTTPS API
ports), on loopback, answering from the same observations as Convergence.

Replies are checked by an independent verifier written from PROTOCOLS.md
2.3 (xml.etree + struct + cryptography, ``tests.support.perspectives``), not
by our parser.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from notary.errors import StoreError
from notary.model.ratelimit import client_prefix
from notary.model.targets import Target
from notary.outbound.writer import Storage
from notary.protocol.hotpath import Request
from notary.server.api import PerspectivesHandler
from notary.service.stored_targets import StoredTargets
from notary.state import crypto
from tests.support.http_client import header, http_get
from tests.support.notaries import NotaryUnderTest, open_notary, send_raw
from tests.support.perspectives import independent_verify, md5_fp, open_perspectives_notary
from tests.support.tls_targets import open_tls_target

SITE = "www.example.test"
HOUR = 3600


async def wait_for_probe(notary: NotaryUnderTest, count: int) -> None:
    with trio.fail_after(20):
        while notary.running.prober.statistics().succeeded < count:  # noqa: ASYNC110 (a counter)
            await trio.sleep(0.01)
    await trio.sleep(0.05)  # the result hook runs before the flight ends; let it finish


async def test_unknown_service_is_404_then_probed_then_200(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_perspectives_notary(tmp_path, {SITE: [site.host]}) as (notary, public):
            port = notary.running.perspectives[0].port
            query = f"/?host={SITE}&port={site.port}&service_type=2"
            status, _, body = await http_get(port, query)
            assert status == 404 and b"ask again" in body
            await wait_for_probe(notary, 1)
            status, head, xml = await http_get(port, query)
            assert (status, header(head, b"content-type")) == (200, b"text/xml")
            keys = independent_verify(xml, f"{SITE}:{site.port},2", public)
            observed_at = int(notary.clock())
            assert keys == [(md5_fp(site.leaf_der(SITE)), [(pytest.approx(observed_at, abs=5),) * 2])]
            # The same answer on the HTTPS API port, same bytes (signed once).
            over_tls = await send_raw(
                notary.port, f"GET {query} HTTP/1.0\r\n\r\n".encode()
            )
            assert over_tls.status == 200 and over_tls.body == xml
            # Convergence answers from the same observation.
            convergence = await send_raw(
                notary.port, f"GET /target/{SITE}+{site.port} HTTP/1.0\r\n\r\n".encode()
            )
            assert convergence.status == 200


async def test_a_certificate_change_gives_two_keys_with_their_runs(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_perspectives_notary(tmp_path, {SITE: [site.host]}) as (notary, public):
            target = Target(SITE, site.port)
            records, clock = notary.running.records, notary.clock
            first_der = site.leaf_der(SITE)
            t0 = int(clock())
            await records.refresh(target)
            clock.advance(HOUR)
            await records.refresh(target)  # within the window: the run grows
            second_der = site.replace_certificate(SITE)
            clock.advance(HOUR)
            await records.refresh(target)
            clock.advance(50 * HOUR)  # longer than the 48 h window: a new run
            await records.refresh(target)
            port = notary.running.perspectives[0].port
            status, _, xml = await http_get(port, f"/?host={SITE}&port={site.port}")
    assert status == 200
    keys = dict(independent_verify(xml, f"{SITE}:{site.port},2", public))
    approx = pytest.approx
    assert keys[md5_fp(first_der)] == [(approx(t0, abs=5), approx(t0 + HOUR, abs=5))]
    assert keys[md5_fp(second_der)] == [
        (approx(t0 + 2 * HOUR, abs=5), approx(t0 + 2 * HOUR, abs=5)),
        (approx(t0 + 52 * HOUR, abs=5), approx(t0 + 52 * HOUR, abs=5)),
    ]


async def test_index_page_and_bad_parameters(tmp_path: Path) -> None:
    async with open_perspectives_notary(tmp_path, {}) as (notary, public):
        port = notary.running.perspectives[0].port
        status, head, body = await http_get(port, "/")
        assert (status, header(head, b"content-type")) == (200, b"text/html; charset=utf-8")
        assert crypto.public_key_pem(public).strip().splitlines()[1].encode() in body
        for query, expected in (
            ("/?host=&port=443", 400),
            ("/?host=a.example.test&service_type=1", 400),
            ("/?host=a.example.test&port=99999", 400),
            ("/?host=a.example.test&colour=blue", 400),
            ("/elsewhere", 404),
        ):
            status, _, _ = await http_get(port, query)
            assert status == expected, query
        # On the API ports, a query without parameters is the usual index.
        index = await send_raw(notary.port, b"GET / HTTP/1.0\r\n\r\n")
        assert index.status == 200 and b"Convergence" in index.body


async def test_store_unavailable_and_nothing_cached_is_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: Storage, target: Target) -> object:
        raise StoreError("database notary.db: disk I/O error")

    async with open_perspectives_notary(tmp_path, {}) as (notary, _public):
        monkeypatch.setattr(Storage, "load_timeline", broken)
        monkeypatch.setattr(StoredTargets, "may_contain", lambda self, key: True)
        status, _, body = await http_get(
            notary.running.perspectives[0].port, "/?host=stored.example.test&port=443"
        )
    assert status == 503 and b"store unavailable" in body


async def test_perspectives_is_off_without_a_key(tmp_path: Path) -> None:
    async with open_notary(tmp_path) as notary:
        assert notary.running.perspectives == ()
        answer = await send_raw(notary.port, b"GET /?host=a.example.test&port=443 HTTP/1.0\r\n\r\n")
        assert answer.status == 200 and b"Convergence" in answer.body  # just the index


def perspectives_request(target: str, *, method: bytes = b"GET", keep_alive: bool = True,
                         headers: tuple[tuple[bytes, bytes], ...] = ()) -> Request:
    return Request(method, target.encode(), "1.1", headers, b"", keep_alive)


async def test_the_fast_path_answers_a_cached_service_as_the_slow_path(tmp_path: Path) -> None:
    """A cached service is answered without awaiting, with the bytes the
    awaited handler makes, counted and noted alike; everything else is
    left to the handler (None), nothing counted."""
    async with open_tls_target(names=[SITE]) as site:
        async with open_perspectives_notary(tmp_path, {SITE: [site.host]}) as (notary, _):
            service = notary.running.service
            handler = PerspectivesHandler(service, index_page=b"index")
            query = f"/?host={SITE}&port={site.port}&service_type=2"
            answered = service.answered["perspectives"]
            assert handler.answer_at_once(perspectives_request(query)) is None  # not cached
            assert answered.get(200, 0) == 0
            await notary.running.records.refresh(Target(SITE, site.port))
            for keep_alive in (True, False):
                request = perspectives_request(query, keep_alive=keep_alive)
                before = answered.get(200, 0)
                fast = handler.answer_at_once(request)
                assert answered[200] == before + 1
                slow = await handler(request)
                assert answered[200] == before + 2
                assert fast == slow
                assert fast is not None and fast[1] is keep_alive
            cross_site = ((b"sec-fetch-site", b"cross-site"),)
            for request in (
                perspectives_request("/?"),  # no parameters: the index page
                perspectives_request("/?host=&port=443"),  # a bad query: its 400
                perspectives_request(query, method=b"POST"),
                perspectives_request(query, headers=cross_site),
                perspectives_request(f"/?host=other.example.test&port={site.port}"),
                perspectives_request(f"/elsewhere?host={SITE}&port={site.port}"),
            ):
                before = dict(answered)
                assert handler.answer_at_once(request) is None, request.target
                assert answered == before
            # Over the wire, both listeners answer from the fast path.
            status, _, xml = await http_get(notary.running.perspectives[0].port, query)
            over_tls = await send_raw(notary.port, f"GET {query} HTTP/1.0\r\n\r\n".encode())
            assert status == over_tls.status == 200 and over_tls.body == xml


async def test_the_fast_paths_429_is_the_slow_paths(tmp_path: Path) -> None:
    """A limited client over its query rate gets from the fast path the
    very 429 (and ``Retry-After``) the awaited handler answers."""
    async with open_tls_target(names=[SITE]) as site:
        async with open_perspectives_notary(tmp_path, {SITE: [site.host]}) as (notary, _):
            service = notary.running.service
            handler = PerspectivesHandler(service, index_page=b"index")
            query = f"/?host={SITE}&port={site.port}&service_type=2"
            await notary.running.records.refresh(Target(SITE, site.port))
            client = client_prefix(bytes([192, 0, 2, 1]))  # a documentation address
            request = perspectives_request(query)
            for _ in range(1_000):  # the burst runs out; the clock stands still
                fast = handler.answer_at_once(request, client)
                assert fast is not None
                if fast[0].startswith(b"HTTP/1.1 429 "):
                    break
            else:
                raise AssertionError("the client's burst never ran out")
            slow = await handler(request, client)
            assert fast == slow
            assert b"\r\nRetry-After: " in fast[0]
            assert service.answered["perspectives"][429] == 1
            assert handler.rejected["perspectives", 429] == 1
