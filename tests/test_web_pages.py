"""The web pages served by a notary on loopback, over HTTPS: statuses,
content types, security headers, the bundle download, the lookup form,
"check now" and its limits, bad targets and an XSS attempt."""

from __future__ import annotations

import json
import re
from pathlib import Path

from notary.config import Endpoint
from tests.support.http_client import get
from tests.support.notaries import RawResponse, send_raw
from tests.support.tls_targets import closed_port, open_tls_target
from tests.support.web import (
    SEEDED_RUNS,
    SITE,
    assert_page,
    open_web_notary,
    seed_three_certificates,
)


async def post(
    port: int, path: str, *, accept: str | None = None, origin: str | None = None
) -> RawResponse:
    extra = f"Accept: {accept}\r\n" if accept else ""
    if origin is not None:
        extra += f"Origin: {origin}\r\nHost: 127.0.0.1:{port}\r\n"
    return await send_raw(port, f"POST {path} HTTP/1.0\r\n{extra}Content-Length: 0\r\n\r\n".encode())


async def test_index_shows_identity_figures_and_offers(tmp_path: Path) -> None:
    async with open_web_notary(tmp_path, {}) as notary:
        html = assert_page(await get(notary.port, "/"), 200)
        assert "Test notary 127.0.0.1" in html
        pin = ":".join(f"{b:02X}" for b in notary.sha1_pin)
        assert pin in html
        key_id = json.loads((await get(notary.port, "/v2/key")).body)["keys"][0]["key_id"]
        assert key_id in html
        assert 'href="/test.notary" download' in html
        assert 'data-figure="uptime_s"' in html and 'data-figures-interval="5"' in html
        assert f"on ports {notary.port}" in html  # the bound port, not the configured 0
        assert '<form class="lookup" action="/site" method="get"' in html
        # The plain-text index is gone; the Convergence API is untouched.
        assert (await get(notary.port, "/target/bad")).status == 400
        refused = assert_page(await post(notary.port, "/"), 405)
        assert "method not allowed" in refused


async def test_index_shows_the_log_and_witness_keys(tmp_path: Path) -> None:
    """What clients check the log with (its bundle pins it) and the
    notary's own witness key are on its page (issue 30, item 11)."""
    from notary.protocol import tlog
    from notary.state import crypto

    witness = tlog.cosigner_key("w.example.test/witness", bytes(range(1, 33)))
    other_log = tlog.verifier_key("other.test/log", bytes(range(2, 34)))
    async with open_web_notary(tmp_path, {}, log={
        "enabled": True, "origin": "notary.test/v2/log",
        "witnesses": [{"url": "https://127.0.0.1:1/v2/witness", "key": witness,
                       "pin": "AB" * 20}],
    }, witness={"enabled": True, "name": "notary.test/witness", "logs": [other_log]}) as notary:
        html = assert_page(await get(notary.port, "/"), 200)
    raw = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(tmp_path / "v2.key"))
    assert "<h3>Transparency log</h3>" in html
    assert "<code>notary.test/v2/log</code>" in html
    assert tlog.verifier_key("notary.test/v2/log", raw) in html
    assert witness in html
    assert tlog.cosigner_key("notary.test/witness", raw) in html
    (tmp_path / "plain").mkdir()
    async with open_web_notary(tmp_path / "plain", {}) as notary:
        plain = assert_page(await get(notary.port, "/"), 200)
    assert "Transparency log" not in plain and "As a witness" not in plain


async def test_bundle_download_and_static_assets(tmp_path: Path) -> None:
    async with open_web_notary(tmp_path, {}) as notary:
        response = await get(notary.port, "/test.notary")
        assert response.status == 200
        assert response.headers[b"content-type"] == b"application/octet-stream"
        assert response.headers[b"content-disposition"] == b'attachment; filename="test.notary"'
        assert response.headers[b"x-content-type-options"] == b"nosniff"
        assert response.body == (tmp_path / "n" / "test.notary").read_bytes()
        html = (await get(notary.port, "/")).body.decode()
        for path, content_type in (
            (re.search(r'href="(/static/notary\.css\?v=\w+)"', html), b"text/css; charset=utf-8"),
            (re.search(r'src="(/static/notary\.js\?v=\w+)"', html),
             b"text/javascript; charset=utf-8"),
        ):
            assert path is not None
            asset = await get(notary.port, path.group(1))
            assert asset.status == 200 and asset.headers[b"content-type"] == content_type
            assert b"immutable" in asset.headers[b"cache-control"]
            assert asset.headers[b"etag"].strip(b'"') in path.group(1).encode()
        assert_page(await get(notary.port, "/static/../notary.key"), 404)
        assert_page(await get(notary.port, "/static/"), 404)


async def test_site_page_draws_the_timeline(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_web_notary(tmp_path, {SITE: [site.host]}) as notary:
            await seed_three_certificates(notary, site)
            html = assert_page(await get(notary.port, f"/site/{SITE}+{site.port}"), 200)
            assert f'data-lanes="3" data-runs="{sum(SEEDED_RUNS)}"' in html
            assert html.count('<rect class="run"') == sum(SEEDED_RUNS)
            runs = [int(n) for n in re.findall(r'<g class="lane [^"]*" [^>]*data-runs="(\d+)"', html)]
            assert runs == list(SEEDED_RUNS)
            assert html.count('<li class="certificate') == 3
            # Spellings normalise as in the Convergence path.
            same = assert_page(await get(notary.port, f"/site/WWW.Example.TEST.+{site.port}"), 200)
            assert same.count('<rect class="run"') == sum(SEEDED_RUNS)


async def test_unknown_and_bad_targets(tmp_path: Path) -> None:
    async with open_web_notary(tmp_path, {}) as notary:
        html = assert_page(await get(notary.port, "/site/never.example.test+443"), 200)
        assert "Nothing observed yet" in html
        assert 'action="/site/never.example.test+443/check"' in html
        for path, message in (
            ("/site/no-port", "missing port"),
            ("/site/a+b+443", "more than one"),
            ("/site/bad_host+443", "invalid character"),
            ("/site/%ff+443", "percent-encoded UTF-8"),
            ("/site/" + "a" * 1100 + "+443", "too long"),
        ):
            assert message in assert_page(await get(notary.port, path), 400), path
        assert_page(await get(notary.port, "/site/a.example.test+443/more"), 400)


async def test_an_xss_attempt_through_a_target_name_is_inert(tmp_path: Path) -> None:
    attack = '<script>alert("x")</script>'
    encoded = "%3Cscript%3Ealert(%22x%22)%3C%2Fscript%3E"
    async with open_web_notary(tmp_path, {}) as notary:
        for path in (f"/site/{encoded}+443", f"/site?host={encoded}&port=443",
                     f"/site/{encoded}+443/check"):
            response = await (post(notary.port, path) if path.endswith("/check")
                              else get(notary.port, path))
            html = assert_page(response, 400)
            assert attack not in html and "<script>" not in html
            assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
            assert re.findall(r"<script[^>]*>", html) == [
                re.search(r'<script src="/static/notary\.js\?v=\w+" defer>', html).group(0)  # type: ignore[union-attr]
            ]


async def test_the_lookup_form_redirects_to_the_normalised_target(tmp_path: Path) -> None:
    async with open_web_notary(tmp_path, {}) as notary:
        response = await get(notary.port, "/site?host=WWW.Example.TEST.&port=0443&watch=1")
        assert response.status == 303
        assert response.headers[b"location"] == b"/site/www.example.test+443?watch=1"
        response = await get(notary.port, "/site?host=%5B::1%5D&port=8443")
        assert response.headers[b"location"] == b"/site/%5B%3A%3A1%5D+8443"
        watched = assert_page(await get(notary.port, "/site/www.example.test+443?watch=1"), 200)
        assert '<input type="checkbox" id="watch" checked>' in watched
        html = assert_page(await get(notary.port, "/site?host=x&port=99999"), 400)
        assert "port must be a number" in html and 'value="x"' in html
        assert "fields could not be read" in assert_page(
            await get(notary.port, "/site?" + "&".join(f"f{i}=1" for i in range(20))), 400
        )


async def test_check_now_probes_and_reports(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_web_notary(tmp_path, {SITE: [site.host]}) as notary:
            path = f"/site/{SITE}+{site.port}"
            answer = await post(notary.port, path + "/check", accept="application/json")
            assert answer.status == 200
            assert answer.headers[b"content-type"] == b"application/json"
            assert json.loads(answer.body) == {
                "outcome": "observed", "target": f"{SITE}:{site.port}",
                "message": "Checked just now: the notary observed the site's certificate.",
            }
            assert site.handshakes_completed + site.handshakes_failed >= 1
            # Within the target's probe spacing ([limits], 4 a minute) the
            # observation just made answers; after it, a check probes again
            # however fresh the observation is.
            site.replace_certificate(SITE)
            again = await post(notary.port, path + "/check", accept="application/json")
            assert json.loads(again.body)["outcome"] == "observed"
            assert 'data-lanes="1"' in (await get(notary.port, path)).body.decode()
            notary.clock.advance(16)
            redirect = await post(notary.port, path + "/check")
            assert redirect.status == 303
            assert redirect.headers[b"location"] == f"{path}?checked=observed".encode()
            html = assert_page(await get(notary.port, f"{path}?checked=observed"), 200)
            assert 'data-lanes="2"' in html and "the notary observed" in html
            # Failures say no more than v2 verdicts do.
            dead = await post(notary.port, f"/site/127.0.0.1+{closed_port()}/check",
                              accept="application/json")
            assert json.loads(dead.body)["outcome"] == "unreachable"
            refused = await post(notary.port, "/site/10.0.0.1+443/check",
                                 accept="application/json")
            assert json.loads(refused.body)["outcome"] == "refused"
            # Another site's page cannot make its visitors' browsers ask.
            handshakes = site.handshakes_completed + site.handshakes_failed
            forged = await post(notary.port, path + "/check", origin="https://evil.example")
            assert "asked from this notary&#x27;s own page" in assert_page(forged, 403)
            assert site.handshakes_completed + site.handshakes_failed == handshakes
            ours = await post(notary.port, path + "/check", accept="application/json",
                              origin=f"https://127.0.0.1:{notary.port}")
            assert ours.status == 200
            assert_page(await get(notary.port, path + "/check"), 405)
            assert (await get(notary.port, path + "/check")).headers[b"allow"] == b"POST"


async def test_checks_are_rate_limited_like_queries(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_web_notary(
            tmp_path, {SITE: [site.host]},
            limits={"exempt_clients": (), "probes_per_s_per_prefix": 0.01, "probe_burst": 1},
            http={"max_connections": 100},
        ) as notary:
            path = f"/site/{SITE}+{site.port}/check"
            first = await post(notary.port, path, accept="application/json")
            assert json.loads(first.body)["outcome"] == "observed"
            limited = await post(notary.port, f"/site/127.0.0.1+{site.port}/check",
                                 accept="application/json")
            assert limited.status == 429 and int(limited.headers[b"retry-after"]) >= 1
            assert json.loads(limited.body)["outcome"] == "limited"
            page = await post(notary.port, f"/site/127.0.0.1+{site.port}/check")
            assert_page(page, 429)
            assert notary.config.server.api == (Endpoint("127.0.0.1", 0),)


def test_a_reloaded_bundle_changes_the_identity_shown(tmp_path: Path) -> None:
    from notary.protocol.bundle import BundleHost, make_bundle
    from notary.server.api import ApiHandler
    from notary.server.web import WebPages
    from notary.state import crypto
    from notary.web.pages import NotaryProfile

    key = crypto.generate_rsa_key()
    pem = crypto.certificate_pem(crypto.make_self_signed_certificate(key, "127.0.0.1"))
    bundle = make_bundle(
        name="Renamed notary", location="https://127.0.0.1/r.notary", region="NZ",
        hosts=[BundleHost("127.0.0.1", 443, 80, pem.decode("ascii"))],
    )
    web = WebPages(None, NotaryProfile(name="Old", version="0"))  # type: ignore[arg-type]
    handler = ApiHandler(None, index_text="", web=web)  # type: ignore[arg-type]
    handler.bundle_bytes = bundle.to_json()  # as Reloader.apply does on SIGHUP
    assert (web.profile.name, web.profile.region) == ("Renamed notary", "NZ")
    assert web.profile.hosts[0].sha1_pin == bundle.hosts[0].sha1_pin
