"""A real notary on 127.0.0.1, real local TLS targets, legacy-style clients.

Loopback only: every target is a local server; names reach them through an
injected resolver.
"""

import json
import sqlite3

import pytest
import trio

from notary.config import Endpoint
from notary.model.targets import Target
from notary.protocol import convergence
from notary.state.crypto import verify_convergence_signature
from tests.support.notaries import legacy_query, open_notary, parse_response, send_raw, sha1_fp
from tests.support.tls_targets import (
    closed_port,
    open_stalled_target,
    open_tls_target,
)

NAME = "www.example.test"
OTHER = "other.example.test"
ABSENT_FP = ":".join(["AB"] * 20)


def fingerprints_of(body: bytes) -> list[str]:
    return [row["fingerprint"] for row in json.loads(body)["fingerprintList"]]


def assert_signed_by(notary, body: bytes) -> None:
    answer = convergence.parse_answer(body)
    key = notary.certificate.public_key()
    assert verify_convergence_signature(key, answer.payload, answer.signature_b64)


async def test_legacy_post_gets_signed_200(tmp_path):
    async with open_tls_target(names=[NAME, OTHER]) as site:
        resolver = {NAME: [site.host], OTHER: [site.host]}
        async with open_notary(tmp_path, names=resolver) as notary:
            fp = sha1_fp(site.leaf_der(NAME))
            response = await legacy_query(notary.port, f"{NAME}+{site.port}", fp)
            assert response.peer_sha1 == notary.sha1_pin  # the pinned certificate
            assert response.status == 200
            assert response.headers[b"content-type"] == b"application/json"
            assert int(response.headers[b"content-length"]) == len(response.body)
            assert response.headers[b"connection"] == b"close"
            assert fingerprints_of(response.body) == [fp]
            assert_signed_by(notary, response.body)
            # The notary probed with SNI; another name on the same port is
            # another certificate.
            assert NAME in site.server_names
            other = await legacy_query(notary.port, f"{OTHER}+{site.port}", None)
            assert other.status == 200
            assert fingerprints_of(other.body) == [sha1_fp(site.leaf_der(OTHER))]
            assert fp not in fingerprints_of(other.body)


async def test_ip_literal_target_is_probed_without_sni(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path) as notary:
            response = await legacy_query(notary.port, f"127.0.0.1+{site.port}", None)
            assert response.status == 200
            assert fingerprints_of(response.body) == [sha1_fp(site.leaf_der())]
            assert site.server_names == [None]


async def test_certificate_change_gives_409_with_the_new_fingerprint(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
            target = f"{NAME}+{site.port}"
            old_fp = sha1_fp(site.leaf_der(NAME))
            assert (await legacy_query(notary.port, target, old_fp)).status == 200
            new_fp = sha1_fp(site.replace_certificate(NAME))
            # Still vouched for while fresh (fresh_for_s, default one day)...
            assert (await legacy_query(notary.port, target, old_fp)).status == 200
            # ...and once stale, a probe sees the new certificate: 409.
            notary.clock.advance(notary.config.answers.fresh_for_s + 1)
            response = await legacy_query(notary.port, target, old_fp)
            assert response.status == 409
            assert fingerprints_of(response.body) == [new_fp, old_fp]
            assert_signed_by(notary, response.body)
            assert (await legacy_query(notary.port, target, new_fp)).status == 200


async def test_unknown_fingerprint_is_409(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
            response = await legacy_query(notary.port, f"{NAME}+{site.port}", ABSENT_FP)
            assert response.status == 409
            assert fingerprints_of(response.body) == [sha1_fp(site.leaf_der(NAME))]


async def test_unreachable_target_is_503(tmp_path):
    # A short probe deadline: failures are answered at it (failures_at_deadline).
    async with open_notary(tmp_path, probe={"timeout_s": 0.5}) as notary:
        response = await legacy_query(notary.port, f"127.0.0.1+{closed_port()}", ABSENT_FP)
        assert response.status == 503
        assert b"fingerprintList" not in response.body


async def test_stalled_target_is_503_within_the_deadline(tmp_path):
    async with open_stalled_target() as stalled:
        async with open_notary(tmp_path, probe={"timeout_s": 0.5}) as notary:
            started = trio.current_time()
            response = await legacy_query(notary.port, f"127.0.0.1+{stalled.port}", None)
            assert response.status == 503
            assert stalled.accepted == 1
            # Bounded by the probe deadline, not by the client's patience.
            assert trio.current_time() - started < notary.config.answers.query_timeout_s


async def test_refused_target_never_receives_a_connection(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}, allow_targets=()) as notary:
            for target in (f"{NAME}+{site.port}", f"127.0.0.1+{site.port}"):
                response = await legacy_query(notary.port, target, ABSENT_FP)
                assert response.status == 403
            assert site.accepted == 0


async def test_concurrent_queries_share_one_probe(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
            site.pause()  # hold the handshake so all 20 queries overlap
            fp = sha1_fp(site.leaf_der(NAME))
            results = []

            async def ask():
                results.append(await legacy_query(notary.port, f"{NAME}+{site.port}", fp))

            async with trio.open_nursery() as clients:
                for _ in range(20):
                    clients.start_soon(ask)
                await site.wait_accepted(1)
                await trio.sleep(0.2)
                site.resume()
            assert [r.status for r in results] == [200] * 20
            assert site.accepted == 1
            assert len({r.body for r in results}) == 1
            assert notary.running.prober.statistics().started == 1


async def test_answer_is_signed_once_per_change(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
            fp = sha1_fp(site.leaf_der(NAME))
            signer = notary.running.signers["convergence"]
            first = await legacy_query(notary.port, f"{NAME}+{site.port}", fp)
            made = signer.signatures_made
            for _ in range(5):
                again = await legacy_query(notary.port, f"{NAME}+{site.port}", fp)
                assert again.body == first.body
            assert signer.signatures_made == made


async def test_http11_keep_alive_serves_several_requests(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
            fp = sha1_fp(site.leaf_der(NAME))
            body = f"fingerprint={fp}".encode()
            one = (
                f"POST /target/{NAME}+{site.port} HTTP/1.1\r\nHost: notary\r\n"
                f"Content-Type: application/x-www-form-urlencoded\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            last = (
                f"GET /target/{NAME}+{site.port} HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n"
            )
            response = await send_raw(notary.port, one + one + last.encode())
            assert response.status == 200
            # Three responses on one connection, each with its own length.
            raw = response.body
            assert raw.count(b"HTTP/1.1 200 OK") == 2


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /target/example.com HTTP/1.0\r\n\r\n", 400),  # missing port
        (b"GET /target/example.com+0 HTTP/1.0\r\n\r\n", 400),
        (b"GET /target/a+b+443 HTTP/1.0\r\n\r\n", 400),
        (b"GET /target/%ff+443 HTTP/1.0\r\n\r\n", 400),
        (b"POST /target/example.com+443 HTTP/1.0\r\nContent-Length: 0\r\n\r\n", 400),
        (b"POST /target/example.com+443 HTTP/1.0\r\nContent-Length: 14\r\n\r\nfingerprint=AA", 400),
        (b"PUT /target/example.com+443 HTTP/1.0\r\n\r\n", 405),
        (b"DELETE /target/example.com+443 HTTP/1.0\r\n\r\n", 405),
        (b"GET /nothing HTTP/1.0\r\n\r\n", 404),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GARBAGE\r\n\r\n", 400),
    ],
)
async def test_bad_requests_get_clear_4xx(tmp_path, request_bytes, status):
    async with open_notary(tmp_path) as notary:
        response = await send_raw(notary.port, request_bytes)
        assert response.status == status
        assert response.body.endswith(b"\n") and len(response.body) < 200
        if status == 405:
            assert response.headers[b"allow"] == b"GET, POST"


async def test_get_unknown_target_probes_and_answers_200(tmp_path):
    async with open_tls_target(names=[NAME]) as site:
        async with open_notary(tmp_path, names={NAME: [site.host]}) as notary:
            response = await legacy_query(notary.port, f"{NAME.upper()}.+{site.port}", None)
            assert response.status == 200  # normalised: case and trailing dot
            assert fingerprints_of(response.body) == [sha1_fp(site.leaf_der(NAME))]


async def test_observations_are_committed_by_a_clean_stop(tmp_path):
    async with open_tls_target(names=[NAME, OTHER]) as site:
        resolver = {NAME: [site.host], OTHER: [site.host]}
        async with open_notary(tmp_path, names=resolver) as notary:
            for name in (NAME, OTHER):
                assert (await legacy_query(notary.port, f"{name}+{site.port}", None)).status == 200
        assert notary.running.storage.statistics().queued == 0
    with sqlite3.connect(tmp_path / "notary.db") as db:
        rows = db.execute(
            "SELECT t.host, t.port FROM observations o JOIN targets t ON t.id = o.target_id"
        ).fetchall()
    assert sorted(rows) == sorted([(NAME, site.port), (OTHER, site.port)])


async def test_plain_http_listener_serves_the_same_signed_bytes(tmp_path):
    """For operators who terminate TLS in front of the notary."""
    async with open_tls_target(names=[NAME]) as site:
        server = {"plain_api": (Endpoint("127.0.0.1", 0),)}
        async with open_notary(tmp_path, names={NAME: [site.host]}, server=server) as notary:
            over_tls = await legacy_query(notary.port, f"{NAME}+{site.port}", None)
            port = notary.running.plain_api[0].port
            with trio.fail_after(20):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(f"GET /target/{NAME}+{site.port} HTTP/1.0\r\n\r\n".encode())
                    data = b""
                    while chunk := await stream.receive_some(65536):
                        data += chunk
    plain = parse_response(data)
    assert plain.status == over_tls.status == 200
    assert plain.body == over_tls.body
    assert_signed_by(notary, plain.body)


async def test_the_scheduler_rescans_what_was_asked(tmp_path, autojump_clock):
    """Rescanning wired into the server: a target asked about once is probed
    again by the scheduler (autojump clock: an hour passes at once)."""
    async with open_tls_target(names=[NAME]) as site:
        rescan = {"probes_per_s": 1.0, "base_interval_s": 900, "max_staleness_s": 3600}
        async with open_notary(tmp_path, names={NAME: [site.host]}, rescan=rescan) as notary:
            answer = await legacy_query(notary.port, f"{NAME}+{site.port}", None)
            assert answer.status == 200
            assert notary.running.prober.statistics().started == 1
            scheduler = notary.running.scheduler
            assert scheduler.statistics().targets_known == 1
            await trio.sleep(3600)
            assert scheduler.statistics().probes_started >= 1
            assert notary.running.prober.statistics().succeeded >= 2


async def test_a_change_a_query_probed_makes_the_scheduler_rescan_sooner(tmp_path):
    """The query service tells the scheduler what its probe saw: a target
    whose certificate changed is due sooner than one that stayed."""
    steady, rotating = NAME, "rotating.example.test"
    async with open_tls_target(names=[steady, rotating]) as site:
        names = {steady: [site.host], rotating: [site.host]}
        async with open_notary(tmp_path, names=names) as notary:
            for name in (steady, rotating):
                assert (await legacy_query(notary.port, f"{name}+{site.port}", None)).status == 200
            site.replace_certificate(rotating)
            notary.clock.advance(notary.config.answers.fresh_for_s + 1)
            for name in (steady, rotating):
                assert (await legacy_query(notary.port, f"{name}+{site.port}", None)).status == 200
            assert notary.running.prober.statistics().succeeded == 4
            scheduler = notary.running.scheduler
            steady_due = scheduler.due_at(Target(steady, site.port))
            rotating_due = scheduler.due_at(Target(rotating, site.port))
    assert rotating_due < steady_due - 3600


async def test_rescanning_can_be_turned_off(tmp_path):
    async with open_notary(tmp_path, rescan={"enabled": False}) as notary:
        assert notary.running.scheduler is None
        assert notary.running.service.scheduler is None
