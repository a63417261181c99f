"""The v2 API served end to end: ``POST /v2/query`` (batched, signed,
nonce-bound) and ``GET /v2/key``, over HTTPS on loopback."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import trio

from notary.model.targets import Target
from notary.protocol import v2
from notary.state import crypto
from tests.support.http_client import post_json
from tests.support.notaries import open_notary, open_v2_notary, send_raw
from tests.support.tls_targets import closed_port, open_tls_target
from tests.support.v2_queries import public_keys

SITE, OTHER = "www.example.test", "other.example.test"


async def test_batch_query_is_signed_and_bound_to_the_nonce(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE, OTHER]) as site:
        names = {SITE: [site.host], OTHER: [site.host]}
        async with open_v2_notary(tmp_path, names) as notary:
            keys = await public_keys(notary)
            good = hashlib.sha256(site.leaf_der(SITE)).hexdigest()
            dead = closed_port()
            request = {
                "targets": [
                    {"host": SITE, "port": site.port, "sha256": good},
                    {"host": OTHER, "port": site.port, "sha256": good},  # OTHER serves another
                    {"host": SITE, "port": site.port},
                    {"host": "127.0.0.1", "port": dead},
                    {"host": "10.0.0.1", "port": 443},
                ],
                "nonce": "n-123",
            }
            status, body = await post_json(notary.port, "/v2/query", request)
            assert status == 200
            queries = v2.parse_query_request(
                json.dumps(request).encode(), max_batch=100, max_body_bytes=1 << 20
            ).targets
            results = v2.verify_answer(
                v2.parse_answer_document(body), keys, nonce="n-123",
                now=int(notary.clock()), queries=queries,
            )
            verdicts = [r.verdict for r in results]
            assert verdicts == ["match", "mismatch", "unknown", "unreachable", "refused"]
            assert results[0].observations[0].sha256.hex() == good
            assert results[0].valid_until > int(notary.clock())
            with pytest.raises(v2.VerificationError):
                v2.verify_answer(v2.parse_answer_document(body), keys, nonce="other",
                                 now=int(notary.clock()))
            # Tampering with a verdict breaks the envelope signature.
            tampered = body.replace(b'"verdict":"mismatch"', b'"verdict":"match"', 1)
            with pytest.raises(v2.VerificationError):
                v2.verify_answer(v2.parse_answer_document(tampered), keys, nonce="n-123",
                                 now=int(notary.clock()))
            # Expired: a client living after valid_until rejects it.
            with pytest.raises(v2.VerificationError):
                v2.verify_answer(v2.parse_answer_document(body), keys, nonce="n-123",
                                 now=results[0].valid_until + 1)


async def test_statements_are_signed_once_per_change(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_v2_notary(tmp_path, {SITE: [site.host]}) as notary:
            request = {"targets": [{"host": SITE, "port": site.port}]}
            await post_json(notary.port, "/v2/query", request)
            cached = notary.running.cache.peek(Target(SITE, site.port).key)
            statement = cached.v2_statement
            for _ in range(3):
                status, body = await post_json(notary.port, "/v2/query", request)
                assert status == 200
                assert statement.entry in body  # the same signed statement bytes
            assert notary.running.cache.peek(Target(SITE, site.port).key).v2_statement is statement


async def test_a_statement_near_expiry_is_signed_again(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        settings = {"statement_valid_for_s": 7200, "renew_before_s": 3600}
        async with open_v2_notary(tmp_path, {SITE: [site.host]}, v2=settings) as notary:
            request = {"targets": [{"host": SITE, "port": site.port}]}
            await post_json(notary.port, "/v2/query", request)
            key = Target(SITE, site.port).key
            first = notary.running.cache.peek(key).v2_statement
            notary.clock.advance(3700)  # now within renew_before_s of valid_until
            _, body = await post_json(notary.port, "/v2/query", request)
            second = notary.running.cache.peek(key).v2_statement
            assert second.valid_until > first.valid_until
            assert second.entry in body


@pytest.mark.parametrize(
    ("document", "status"),
    [
        ({"targets": []}, 400),
        ({"targets": [{"host": "a.example.test"}]}, 400),
        ({"targets": [{"host": "a.example.test", "port": "443"}]}, 400),
        ({"targets": [{"host": "bad_host", "port": 443}]}, 400),
        ({"targets": [{"host": "a.example.test", "port": 443}] * 3}, 413),
        ([1, 2, 3], 400),
    ],
)
async def test_bad_requests(tmp_path: Path, document: object, status: int) -> None:
    async with open_v2_notary(tmp_path, {}, v2={"max_batch": 2}) as notary:
        got, body = await post_json(notary.port, "/v2/query", document)
    assert got == status, body
    assert b"Traceback" not in body


async def test_wrong_methods_and_v2_off(tmp_path: Path) -> None:
    async with open_v2_notary(tmp_path, {}) as notary:
        assert (await send_raw(notary.port, b"GET /v2/query HTTP/1.0\r\n\r\n")).status == 405
        status, _ = await post_json(notary.port, "/v2/key", {})
        assert status == 405
    async with open_notary(tmp_path / "off") as notary:
        assert (await send_raw(notary.port, b"GET /v2/key HTTP/1.0\r\n\r\n")).status == 404


async def test_a_large_batch_fits_the_body_limit(tmp_path: Path) -> None:
    async with open_v2_notary(tmp_path, {}) as notary:
        request = {"targets": [
            {"host": f"h{i}.example.test", "port": 443, "sha256": "ab" * 32, "sha1": "cd" * 20}
            for i in range(100)
        ], "nonce": "x" * 128}
        # Unknown names do not resolve: every entry is unreachable, quickly.
        status, body = await post_json(notary.port, "/v2/query", request)
    assert status == 200
    assert len(json.loads(body)["answer"]["results"]) == 100


# -- the WebSocket on the API port ---------------------------------------------------------


async def test_websocket_query_with_an_independent_client(tmp_path: Path) -> None:
    """The `websockets` package (not ours) asks a batch query over wss://."""
    import ssl

    from websockets.sync.client import connect

    async with open_tls_target(names=[SITE]) as site:
        async with open_v2_notary(tmp_path, {SITE: [site.host]}) as notary:
            keys = await public_keys(notary)
            good = hashlib.sha256(site.leaf_der(SITE)).hexdigest()

            def talk() -> tuple[dict, dict]:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                url = f"wss://127.0.0.1:{notary.port}/v2/ws"
                with connect(url, ssl=context, open_timeout=10) as ws:
                    ws.send(json.dumps({"type": "query", "id": "q1", "nonce": "ws-nonce",
                                        "targets": [{"host": SITE, "port": site.port,
                                                     "sha256": good}]}))
                    answer = json.loads(ws.recv(timeout=20))
                    ws.send("{not json")
                    error = json.loads(ws.recv(timeout=20))
                return answer, error

            answer, error = await trio.to_thread.run_sync(talk)
            assert (answer["type"], answer["id"]) == ("answer", "q1")
            document = json.dumps(answer["answer"]).encode()
            (result,) = v2.verify_answer(v2.parse_answer_document(document), keys,
                                         nonce="ws-nonce", now=int(notary.clock()))
            assert result.verdict == "match"
            assert error["type"] == "error" and error["status"] == 400


async def test_watch_sees_exactly_one_signed_event_per_new_certificate(tmp_path: Path) -> None:
    from tests.support.watching import watching

    async with open_tls_target(names=[SITE]) as site:
        async with open_v2_notary(tmp_path, {SITE: [site.host]}) as notary:
            target = Target(SITE, site.port)
            await notary.running.records.refresh(target)  # the first certificate
            pem = crypto.certificate_pem(notary.certificate).decode()
            async with watching(notary.port, pem, target) as watcher:
                await notary.running.records.refresh(target)  # same certificate: no event
                new_der = site.replace_certificate(SITE)
                await notary.running.records.refresh(target)  # a new one: one event
                await watcher.next_event(20)
                await notary.running.records.refresh(target)  # unchanged again
                await trio.sleep(0.2)
            events = watcher.events
    assert len(events) == 1
    (event,) = events
    assert event.target == target
    # The statement lists every certificate seen; the new one is among them
    # (times are whole seconds, so both may carry the same last_seen).
    assert hashlib.sha256(new_der).digest() in {o.sha256 for o in event.observations}


async def test_405_names_the_allowed_methods(tmp_path: Path) -> None:
    async with open_v2_notary(tmp_path, {}) as notary:
        key = await send_raw(notary.port, b"DELETE /v2/key HTTP/1.0\r\n\r\n")
        query = await send_raw(notary.port, b"GET /v2/query HTTP/1.0\r\n\r\n")
        legacy = await send_raw(notary.port, b"PUT /target/a.example.test+443 HTTP/1.0\r\n\r\n")
    assert (key.status, key.headers[b"allow"]) == (405, b"GET")
    assert (query.status, query.headers[b"allow"]) == (405, b"POST")
    assert (legacy.status, legacy.headers[b"allow"]) == (405, b"GET, POST")
