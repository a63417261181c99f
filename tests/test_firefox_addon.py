"""The Firefox add-on (clients/firefox/) in a real, headless Firefox ESR,
driven over Marionette (tests/support/firefox.py), against real notaries
of this project on loopback.

One Firefox per module; each test starts its own notaries and sites and
configures the add-on through its options page (an import, as a user
pastes an export). Cases (issue 33): notaries agree -> the page loads and
the button says verified; a rogue certificate from the same trusted CA
that the notaries never saw (DigiNotar) -> the add-on's block page, and a
sub-resource from it is cancelled; a site serving several certificates
from several addresses -> loads; one of two notaries down -> the vote as
the threshold says; a notary whose pin is wrong or whose answer is
tampered -> not counted; a notary asked through another's relay; a locked
captive portal; internal addresses and an organisation's own notaries;
strict mode's withheld cookies; a self-signed notary; one question per new
certificate and none when cached; adding and removing a notary. The
profile stays on loopback (its prefs, and nothing reached the proxy but
the lab's names).

Screenshots of the popup and the block page go to
``$NOTARY_TEST_ARTIFACTS`` (default ``tests/artifacts/``); docs/firefox.md's are
made with ``NOTARY_TEST_ARTIFACTS=docs/screenshots`` (docs/firefox-reference.md).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import trio
from cryptography.hazmat.primitives.serialization import Encoding

from notary.model.targets import Target
from notary.protocol.bundle import BundleHost, make_bundle
from notary.state import crypto
from tests.support.firefox import (
    PIXEL,
    Lab,
    Site,
    _Handler,
    html_page,
    open_lab,
    open_lab_notary,
    require_firefox,
    wait_until,
)
from tests.support.notaries import open_notary
from tests.support.tls_targets import closed_port

T = TypeVar("T")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_firefox()
    yield from open_lab(tmp_path_factory.mktemp("firefox"))


@pytest.fixture
def sites() -> Iterator[Callable[..., Site]]:
    """Make sites that are closed after the test."""
    made: list[Site] = []

    def make(address: str, certificate: Any, **fields: Any) -> Site:
        site = Site(address, certificate, **fields)
        made.append(site)
        return site

    yield make
    for site in made:
        site.close()


def artifacts() -> Path:
    return Path(os.environ.get("NOTARY_TEST_ARTIFACTS") or Path(__file__).parent / "artifacts")


async def drive(function: Callable[[], T]) -> T:
    """Run Marionette calls in a worker thread while the notaries serve."""
    return await trio.to_thread.run_sync(function)


def absent_notary_bundle(lab: Lab, host: str, name: str) -> str:
    """The bundle of a notary whose host does not answer (nothing listens)."""
    leaf = lab.leaf(host, rsa=True)
    return make_bundle(
        name=name, location=f"https://{host}/lab.notary",
        hosts=[BundleHost(host, closed_port(), closed_port(), leaf.cert_chain_pems[0].bytes().decode("ascii"),
                          v2_key=base64.b64encode(crypto.ed25519_public_raw(crypto.generate_ed25519_key())).decode())],
    ).to_json().decode("utf-8")


def sha1_pin(pem: str) -> str:
    """A certificate's SHA-1 as the add-on's pages spell it (AB:CD:...)."""
    return ":".join(f"{b:02X}" for b in hashlib.sha1(ssl.PEM_cert_to_DER_cert(pem)).digest())


def v2_key_file(directory: Path) -> Path:
    """An Ed25519 key in ``directory`` (made once)."""
    path = directory / "v2.key"
    if not path.exists():
        crypto.write_ed25519_private_key(path, crypto.generate_ed25519_key())
    return path


def v2_public(directory: Path) -> str:
    key = crypto.load_ed25519_private_key(v2_key_file(directory))
    return base64.b64encode(crypto.ed25519_public_raw(key)).decode("ascii")


LAB_SETTINGS = {"checkInternalAddresses": True, "timeoutMs": 5000}


#: What keeps the lab's Firefox from leaving loopback, by concern, as the
#: running browser must report it (written out here, not read from the
#: prefs the lab passes: a pref dropped there fails this test).
STAYS_ON_LOOPBACK: dict[str, dict[str, object]] = {
    "no telemetry": {
        "toolkit.telemetry.enabled": False, "toolkit.telemetry.unified": False,
        "toolkit.telemetry.archive.enabled": False, "datareporting.healthreport.uploadEnabled": False,
        "datareporting.policy.dataSubmissionEnabled": False, "datareporting.usage.uploadEnabled": False,
        "browser.ping-centre.telemetry": False, "app.normandy.enabled": False,
        "app.shield.optoutstudies.enabled": False, "messaging-system.rsexperimentloader.enabled": False,
    },
    "no updates": {
        "app.update.auto": False, "app.update.disabledForTesting": True, "extensions.update.enabled": False,
        "extensions.systemAddon.update.enabled": False, "extensions.blocklist.enabled": False,
        "media.gmp-manager.updateEnabled": False, "browser.search.update": False,
        "browser.safebrowsing.update.enabled": False, "browser.region.update.enabled": False,
        "security.remote_settings.crlite_filters.enabled": False,
        "security.remote_settings.intermediates.enabled": False,
    },
    "no background connections": {
        "browser.safebrowsing.malware.enabled": False, "browser.safebrowsing.phishing.enabled": False,
        "browser.safebrowsing.downloads.remote.enabled": False, "security.OCSP.enabled": 0,
        "dom.push.connection.enabled": False, "identity.fxaccounts.enabled": False,
        "network.connectivity-service.enabled": False, "security.certerrors.mitm.priming.enabled": False,
        "browser.newtabpage.enabled": False, "browser.topsites.contile.enabled": False,
        "browser.discovery.enabled": False,
    },
    "no DNS over HTTPS": {"network.trr.mode": 5, "doh-rollout.disable-heuristics": True},
    "no name resolved off the machine": {
        "network.dns.native-is-localhost": True, "network.dns.disablePrefetch": True,
        "network.prefetch-next": False, "network.predictor.enabled": False,
        "network.http.speculative-parallel-limit": 0,
        "network.proxy.type": 2, "network.proxy.allow_hijacking_localhost": True,
    },
}

#: Prefs holding an address Firefox would connect to: each on loopback (or empty).
LOOPBACK_URLS = (
    "captivedetect.canonicalURL", "services.settings.server", "toolkit.telemetry.server",
    "app.normandy.api_url", "browser.region.network.url", "geo.provider.network.url",
    "network.connectivity-service.IPv4.url", "network.connectivity-service.IPv6.url",
    "dom.push.serverURL", "browser.safebrowsing.provider.google4.updateURL",
    "browser.safebrowsing.provider.mozilla.updateURL",
)


def test_profile_keeps_firefox_on_loopback(lab: Lab) -> None:
    """The running profile turns off Firefox's own traffic (telemetry,
    updates, background services, DNS over HTTPS), points every address it
    keeps at loopback (captive-portal detection included), resolves no name
    off the machine, and sends every name and non-loopback address to the
    lab's proxy, which forwards only the names a test maps."""
    for concern, prefs in STAYS_ON_LOOPBACK.items():
        for name, value in prefs.items():
            assert lab.browser.pref(name) == value, f"{concern}: {name}"
    for name in LOOPBACK_URLS:
        url = str(lab.browser.pref(name) or "")
        assert url == "" or urlsplit(url).hostname == "127.0.0.1", f"{name} = {url}"
    assert lab.browser.pref("captivedetect.canonicalURL") == lab.captive.url
    for url in ("https://example.invalid/", "http://example.invalid/", "https://192.0.2.1/",
                "https://[2001:db8::1]/"):
        assert lab.browser.proxy_for(url) == ("http", "127.0.0.1", lab.proxy.port), url
    for url in ("https://127.0.0.2:8443/", "https://localhost/"):
        assert lab.browser.proxy_for(url) == ("direct", "", -1), url


async def test_notaries_agree_the_page_loads_verified(lab: Lab, sites: Any, tmp_path: Path) -> None:
    site = sites("127.0.0.2", lab.leaf("127.0.0.2"), pages={
        "/": html_page("A site the notaries know", '<img id="px" src="/pixel.png">'), "/pixel.png": PIXEL,
    })
    # A asks with the v2 API, B (a bundle without v2 key) with Convergence's.
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Notary A") as a, \
            open_lab_notary(lab, tmp_path / "b", "127.0.0.4", name="Notary B", legacy=True) as b:

        def browse() -> tuple[Any, Any, str]:
            lab.browser.configure({**LAB_SETTINGS, "threshold": "consensus"}, [a.bundle, b.bundle])
            page = lab.browser.visit(site.url())
            image = lab.browser.m.execute_script("return document.getElementById('px').naturalWidth")
            popup = lab.browser.popup(site.url())
            lab.browser.m.set_window_rect(width=560, height=480)
            body = lab.browser.m.find_element("css selector", "body")
            (artifacts() / "firefox-popup.png").parent.mkdir(parents=True, exist_ok=True)
            (artifacts() / "firefox-popup.png").write_bytes(
                lab.browser.m.screenshot(element=body, format="binary"))
            lab.browser.m.set_window_rect(width=1100, height=900)
            return page, (image, popup), lab.browser.options_text()

        page, (image, popup), options = await drive(browse)
    assert page.title == "A site the notaries know"
    assert image == 1
    assert popup["status"] == f"Verified: 127.0.0.2:{site.port}"
    assert popup["words"] == "verified by 2 of 2 notaries"
    assert sorted(row[0] for row in popup["rows"]) == ["Notary A", "Notary B"]
    assert all(row[1] == "vouches" for row in popup["rows"])
    # The options page shows each notary's pins and its recent reliability.
    assert "Notary A" in options and "certificate SHA-1" in options and "v2 key" in options
    assert "Convergence API (RSA)" in options and "v2 API (Ed25519)" in options
    assert options.count("1 vouched") == 2


async def test_rogue_certificate_from_the_same_ca_is_blocked(lab: Lab, sites: Any, tmp_path: Path) -> None:
    """DigiNotar: the browser's CA check passes (same trusted CA), but the
    notaries, on other network paths, see the genuine certificate."""
    genuine = sites("127.0.0.5", lab.leaf("bank.test"), pages={"/": html_page("Genuine bank")})
    rogue = sites("127.0.0.6", lab.leaf("bank.test"), pages={
        "/": html_page("Rogue bank"), "/pixel.png": PIXEL, "/echo-cookie": ("text/plain", b"")})
    # On the browser's path, bank.test is the attacker's server.
    lab.proxy.map("bank.test", genuine.port, "127.0.0.6", to_port=rogue.port)
    friendly = sites("127.0.0.7", lab.leaf("127.0.0.7"), pages={
        "/": html_page("A page with a rogue image", f'<img id="px" src="https://bank.test:{genuine.port}/pixel.png">'),
    })
    names = {"bank.test": ["127.0.0.5"]}
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Notary A", names=names) as a, \
            open_lab_notary(lab, tmp_path / "b", "127.0.0.4", name="Notary B", names=names) as b:
        url = genuine.url("/", host="bank.test")

        def browse() -> Any:
            lab.browser.configure(LAB_SETTINGS, [a.bundle, b.bundle])
            blocked = lab.browser.visit(url)
            lab.browser.screenshot(artifacts() / "firefox-block.png", width=1000, height=1000)
            with_image = lab.browser.visit(friendly.url())
            image = lab.browser.m.execute_script("return document.getElementById('px').naturalWidth")
            popup = lab.browser.popup(friendly.url())
            # The user chooses "trust this certificate once".
            lab.browser.visit(url)
            lab.browser.m.find_element("id", "once").click()
            wait_until(lambda: lab.browser.m.get_url() == url and lab.browser.m.execute_script(
                "return document.readyState === 'complete'"))
            trusted = lab.browser.page()
            return blocked, (with_image, image, popup), trusted

        blocked, (with_image, image, popup), trusted = await drive(browse)
    assert blocked.url.startswith(lab.browser.addon + "/src/pages/block.html?id=")
    assert "Your notaries do not vouch for this site's certificate" in blocked.text
    assert f"bank.test:{genuine.port} by public notaries" in blocked.text
    assert blocked.text.count("objects") == 2
    assert rogue.requests and not genuine.requests  # only the notaries' probes reached it
    # A sub-resource from the rogue server is cancelled; the page loads.
    assert with_image.title == "A page with a rogue image"
    assert image == 0
    assert "1 requests blocked" in popup["resources"]
    assert trusted.title == "Rogue bank"


async def test_site_serving_several_certificates_loads(lab: Lab, sites: Any, tmp_path: Path) -> None:
    """A name served from two addresses, each with its own certificate; the
    notaries saw both."""
    first = sites("127.0.0.8", lab.leaf("multi.test"), close_connections=True,
                  pages={"/": html_page("Several certificates")})
    second = sites("127.0.0.9", lab.leaf("multi.test"), port=first.port, close_connections=True,
                   pages={"/": html_page("Several certificates")})
    lab.proxy.map("multi.test", first.port, "127.0.0.8", "127.0.0.9")
    names = {"multi.test": ["127.0.0.8"]}
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Notary A", names=names) as a:
        # The notary sees each address in turn (a notary of issue 31 probes
        # every address of a name at once).
        target = Target("multi.test", first.port)
        await a.notary.running.records.refresh(target)
        a.resolver.mapping["multi.test"] = ["127.0.0.9"]
        a.notary.clock.advance(1)
        await a.notary.running.records.refresh(target)
        url = first.url("/", host="multi.test")

        def browse() -> list[Any]:
            lab.browser.configure({**LAB_SETTINGS, "threshold": "consensus"}, [a.bundle])
            return [(lab.browser.visit(url), lab.browser.popup(url)) for _ in range(2)]

        visits = await drive(browse)
    for page, popup in visits:
        assert page.title == "Several certificates"
        assert popup["words"] == "verified by 1 of 1 notaries"
    # Firefox reached both addresses (one certificate each), beside the probes.
    assert [m for m, _, _ in first.requests] == ["GET"]
    assert [m for m, _, _ in second.requests] == ["GET"]


async def test_one_of_two_notaries_down_votes_as_the_threshold_says(lab: Lab, sites: Any, tmp_path: Path) -> None:
    site = sites("127.0.0.10", lab.leaf("127.0.0.10"), pages={"/": html_page("One notary answers")})
    down = absent_notary_bundle(lab, "127.0.0.11", "Notary down")
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Notary A") as a, \
            open_lab_notary(lab, tmp_path / "c", "127.0.0.20", name="Notary C") as c:
        # C's bundle pins another certificate than C serves: Firefox trusts
        # C's (the lab CA's), the add-on does not, and C is not heard.
        wrong_pin = json.loads(c.bundle)
        wrong_pin["hosts"][0]["certificate"] = lab.leaf("127.0.0.20", rsa=True).cert_chain_pems[0].bytes().decode()
        wrong_pin = json.dumps(wrong_pin)

        def browse() -> Any:
            lab.browser.configure({**LAB_SETTINGS, "threshold": "consensus"}, [a.bundle, wrong_pin])
            pinned = lab.browser.popup(lab.browser.visit(site.url()).url)
            lab.browser.configure({**LAB_SETTINGS, "threshold": "consensus"}, [a.bundle, down])
            stands_aside = (lab.browser.visit(site.url()), lab.browser.popup(site.url()))
            lab.browser.configure({**LAB_SETTINGS, "threshold": "majority", "strictVote": True}, [a.bundle, down])
            counts_against = lab.browser.visit(site.url())
            return pinned, stands_aside, counts_against

        pinned, (page, popup), counted = await drive(browse)
    assert sorted((row[0], row[1]) for row in pinned["rows"]) == [("Notary A", "vouches"), ("Notary C", "no answer")]
    assert "its host presented a certificate its bundle does not pin" in pinned["rows"][1 if pinned["rows"][1][0] == "Notary C" else 0][2]
    assert page.title == "One notary answers"
    assert popup["words"] == "verified by 1 of 2 notaries"
    assert sorted((row[0], row[1]) for row in popup["rows"]) == [("Notary A", "vouches"), ("Notary down", "no answer")]
    assert counted.url.startswith(lab.browser.addon + "/src/pages/block.html")
    assert "1 of 2 counted notaries vouch (threshold: majority, silent notaries count against)" in counted.text


class _Tamperer(_Handler):
    """Forwards the add-on's queries to a real notary and turns each
    ``mismatch`` of the signed answer into a ``match``."""

    def do_POST(self) -> None:
        site = self.server.site
        body = self.rfile.read(int(self.headers["Content-Length"]))
        upstream = http.client.HTTPSConnection(
            site.upstream[0], site.upstream[1], timeout=10, context=ssl._create_unverified_context())
        upstream.request("POST", self.path, body, {"Content-Type": "application/json"})
        answer = upstream.getresponse().read().replace(b'"verdict":"mismatch"', b'"verdict":"match"')
        site.tampered += answer.count(b'"verdict":"match"')
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


async def test_tampered_answer_is_not_counted(lab: Lab, sites: Any, tmp_path: Path) -> None:
    """An answer altered on its way (by whoever holds the notary's TLS key,
    or a terminator in front of it) fails its Ed25519 signature: that
    notary's failure, never a vote for the rogue certificate."""
    genuine = sites("127.0.0.5", lab.leaf("bank.test"), pages={"/": html_page("Genuine bank")})
    rogue = sites("127.0.0.6", lab.leaf("bank.test"), pages={"/": html_page("Rogue bank")})
    lab.proxy.map("bank.test", genuine.port, "127.0.0.6", to_port=rogue.port)
    async with open_lab_notary(lab, tmp_path / "b", "127.0.0.4", name="Notary B",
                               names={"bank.test": ["127.0.0.5"]}) as b:
        tamperer = sites("127.0.0.12", lab.leaf("127.0.0.12", rsa=True))
        tamperer.upstream = (b.host, b.notary.port)
        tamperer.tampered = 0
        tamperer._server.RequestHandlerClass = _Tamperer
        document = json.loads(b.bundle)
        document["hosts"][0].update(host="127.0.0.12", ssl_port=tamperer.port,
                                    certificate=tamperer.certificate.cert_chain_pems[0].bytes().decode())
        tampered_bundle = json.dumps(document)

        def browse() -> Any:
            lab.browser.configure({**LAB_SETTINGS, "threshold": "minority"}, [tampered_bundle])
            return lab.browser.visit(genuine.url("/", host="bank.test"))

        page = await drive(browse)
    assert tamperer.tampered == 1
    assert page.url.startswith(lab.browser.addon + "/src/pages/block.html")
    assert "bad signed answer: bad answer signature" in page.text
    assert "0 of 1 counted notaries vouch" in page.text


async def test_notary_asked_through_a_relay(lab: Lab, sites: Any, tmp_path: Path) -> None:
    """The add-on's question goes through notary R's bounce relay to notary
    B's port 4242 (R dials B's real port: [relay] dial_port, for a lab of
    several notaries on one machine): R sees who asks, B what is asked."""
    site = sites("127.0.0.13", lab.leaf("127.0.0.13"), pages={"/": html_page("Asked through a relay")})
    async with open_lab_notary(lab, tmp_path / "b", "127.0.0.14", name="Notary B") as b:
        async with open_lab_notary(lab, tmp_path / "r", "127.0.0.15", name="Relay R",
                                   relay={"destinations": "public", "dial_port": b.notary.port}) as r:

            def browse() -> Any:
                lab.browser.configure({**LAB_SETTINGS, "relay": "Relay R"}, [b.bundle, r.bundle])
                return lab.browser.visit(site.url()), lab.browser.popup(site.url())

            page, popup = await drive(browse)
            relayed = r.notary.running.relay_handler.statistics()
    assert page.title == "Asked through a relay"
    assert popup["words"] == "verified by 1 of 1 notaries"
    assert popup["rows"][0][0] == "Notary B\nvia relay Relay R"
    assert relayed.tunnels_opened >= 1


async def test_locked_captive_portal_lets_its_page_through_unverified(lab: Lab, sites: Any, tmp_path: Path) -> None:
    genuine = sites("127.0.0.5", lab.leaf("portal.test"), pages={"/": html_page("Genuine")})
    portal = sites("127.0.0.6", lab.leaf("portal.test"), pages={"/": html_page("Sign in to the Wi-Fi")})
    lab.proxy.map("portal.test", genuine.port, "127.0.0.6", to_port=portal.port)
    url = genuine.url("/", host="portal.test")
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Notary A",
                               names={"portal.test": ["127.0.0.5"]}) as a:

        def browse() -> Any:
            lab.browser.configure(LAB_SETTINGS, [a.bundle])
            lab.captive.locked = True
            lab.browser.recheck_captive_portal()
            wait_until(lambda: lab.browser.captive_state() == "locked_portal")
            locked = lab.browser.visit(url), lab.browser.popup(url)
            lab.captive.locked = False
            lab.browser.recheck_captive_portal()
            wait_until(lambda: lab.browser.captive_state() != "locked_portal")
            return locked, lab.browser.visit(url)

        (page, popup), after = await drive(browse)
    assert page.title == "Sign in to the Wi-Fi"
    assert popup["status"] == f"Captive portal: portal.test:{genuine.port}"
    assert "unverified until you sign in" in popup["words"]
    assert after.url.startswith(lab.browser.addon + "/src/pages/block.html")  # checking resumed


async def test_internal_addresses_and_an_organisations_own_notaries(lab: Lab, sites: Any, tmp_path: Path) -> None:
    internal = sites("127.0.0.16", lab.leaf("127.0.0.16"), pages={"/": html_page("Internal by address")})
    intranet = sites("127.0.0.17", lab.leaf("intranet.test"), pages={"/": html_page("Intranet")})
    lab.proxy.map("intranet.test", intranet.port, "127.0.0.17")
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Public notary") as public, \
            open_lab_notary(lab, tmp_path / "o", "127.0.0.18", name="Corp notary",
                            names={"intranet.test": ["127.0.0.17"]}) as corp:
        url = intranet.url("/", host="intranet.test")

        def browse() -> Any:
            lab.browser.configure(
                {"internalDomains": [{"domain": "intranet.test", "notaries": ["Corp notary"]}]},
                [public.bundle, corp.bundle])
            return ((lab.browser.visit(internal.url()), lab.browser.popup(internal.url())),
                    (lab.browser.visit(url), lab.browser.popup(url)))

        (page, popup), (intra, intra_popup) = await drive(browse)
    assert page.title == "Internal by address"
    assert popup["status"] == f"Internal site: 127.0.0.16:{internal.port}"
    assert popup["words"] == "a loopback address: not checkable by public notaries"
    assert intra.title == "Intranet"
    assert intra_popup["words"] == "verified by 1 of 1 notaries (organisation notaries for intranet.test)"
    assert [row[0] for row in intra_popup["rows"]] == ["Corp notary"]


async def test_strict_mode_sends_no_cookie_before_the_host_is_verified(lab: Lab, sites: Any, tmp_path: Path) -> None:
    genuine = sites("127.0.0.5", lab.leaf("shop.test"), pages={"/": html_page("Genuine shop")})
    rogue = sites("127.0.0.6", lab.leaf("shop.test"), pages={"/set-cookie": html_page("Rogue shop")})
    lab.proxy.map("shop.test", genuine.port, "127.0.0.6", to_port=rogue.port)
    good = sites("127.0.0.19", lab.leaf("127.0.0.19"), pages={"/set-cookie": html_page("Good shop")})
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Notary A",
                               names={"shop.test": ["127.0.0.5"]}) as a:

        def browse() -> Any:
            # Cookies set earlier, while checking was paused.
            lab.browser.configure({**LAB_SETTINGS, "enabled": False}, [a.bundle])
            lab.browser.visit(genuine.url("/set-cookie", host="shop.test"))
            lab.browser.visit(good.url("/set-cookie"))
            lab.browser.configure({**LAB_SETTINGS, "strictMode": True}, [a.bundle])
            rogue_page = lab.browser.visit(genuine.url("/echo-cookie", host="shop.test"))
            good_page = lab.browser.visit(good.url("/echo-cookie"))
            return rogue_page, good_page

        rogue_page, good_page = await drive(browse)
    sent = {path: headers.get("Cookie") for method, path, headers in rogue.requests}
    assert sent["/set-cookie"] is None
    assert "/echo-cookie" in sent and sent["/echo-cookie"] is None  # withheld, then blocked
    assert rogue_page.url.startswith(lab.browser.addon + "/src/pages/block.html")
    assert good_page.text == "cookie: session=secret"  # verified first, then sent


async def test_self_signed_notary_accepted_once_in_firefox(lab: Lab, sites: Any, tmp_path: Path) -> None:
    """A notary whose host certificate is self-signed (make run's): once the
    user has accepted that certificate in Firefox (a certificate exception,
    as "Accept the Risk and Continue" stores it), the add-on asks it, and
    still holds it to the bundle's pin."""
    site = sites("127.0.0.21", lab.leaf("127.0.0.21"), pages={"/": html_page("Checked by a self-signed notary")})
    async with open_notary(tmp_path / "s", host="127.0.0.22", v2={"key_file": v2_key_file(tmp_path)},
                           answers={"failures_at_deadline": False}) as notary:
        bundle = make_bundle(
            name="Self-signed notary", location="https://127.0.0.22/local.notary",
            hosts=[BundleHost("127.0.0.22", notary.port, notary.relay_port,
                              crypto.certificate_pem(notary.certificate).decode("ascii"),
                              v2_key=v2_public(tmp_path))],
        ).to_json().decode("utf-8")
        der = notary.certificate.public_bytes(Encoding.DER)

        def browse() -> Any:
            lab.browser.configure(LAB_SETTINGS, [bundle])
            before = lab.browser.popup(lab.browser.visit(site.url()).url)
            lab.browser.accept_certificate("127.0.0.22", notary.port, der)
            lab.browser.configure(LAB_SETTINGS, [bundle])
            return before, lab.browser.popup(lab.browser.visit(site.url()).url)

        before, after = await drive(browse)
    assert before["rows"][0][1] == "no answer"  # Firefox refuses the untrusted certificate
    assert after["words"] == "verified by 1 of 1 notaries"


async def test_one_round_trip_per_new_certificate_none_when_cached(lab: Lab, sites: Any, tmp_path: Path) -> None:
    """A page of 12 resources from two hosts asks the notary once per
    certificate (the page's, then the other host's, whose six resources
    share one question); the same page again asks nothing. A question is a
    nonce: the add-on sends one again, with its nonce, when Firefox does not
    deliver its answer within a second (background.js, ``transport``), which
    a loaded machine now and then shows."""
    other = sites("127.0.0.24", lab.leaf("127.0.0.24"), pages={f"/{i}.png": PIXEL for i in range(6)})
    images = "".join(f'<img src="/{i}.png"><img src="{other.url(f"/{i}.png")}">' for i in range(6))
    page = sites("127.0.0.23", lab.leaf("127.0.0.23"), pages={
        "/": html_page("Twelve resources", images), **{f"/{i}.png": PIXEL for i in range(6)}})
    async with open_lab_notary(lab, tmp_path / "a", "127.0.0.3", name="Notary A") as a:
        service = a.notary.running.service
        answered = service.answered["v2"]
        nonces: list[str | None] = []
        answer_v2 = service.answer_v2

        async def recording(request: Any, client: bytes | None = None) -> Any:
            nonces.append(request.nonce)
            return await answer_v2(request, client)

        service.answer_v2 = recording

        def browse() -> list[tuple[int, int]]:
            lab.browser.configure(LAB_SETTINGS, [a.bundle])
            seen = []
            for _ in range(2):
                lab.browser.visit(page.url())
                loaded = lab.browser.wait_for(
                    "return [...document.images].every((i) => i.complete)"
                    " && [...document.images].filter((i) => i.naturalWidth === 1).length")
                seen.append((int(loaded), len(set(nonces))))
            return seen

        (first, after_first), (second, after_second) = await drive(browse)
    assert first == second == 12
    assert after_first == 2 and set(answered) == {200}
    assert after_second == 2
    assert None not in nonces


async def test_add_a_notary_from_a_url_and_a_file_then_remove_it(lab: Lab, sites: Any, tmp_path: Path) -> None:
    """The options page shows a bundle's pins before it is trusted (from
    its HTTPS URL or a file), keeps it on "Trust this notary", and drops it
    on "Remove" once the user confirms."""
    by_url = absent_notary_bundle(lab, "127.0.0.26", "Notary by URL")
    by_file = absent_notary_bundle(lab, "127.0.0.27", "Notary from a file")
    (tmp_path / "file.notary").write_text(by_file, encoding="utf-8")
    host = sites("127.0.0.25", lab.leaf("127.0.0.25"),
                 pages={"/lab.notary": ("application/octet-stream", by_url.encode())})
    pins = {name: sha1_pin(json.loads(text)["hosts"][0]["certificate"])
            for name, text in (("url", by_url), ("file", by_file))}
    m = lab.browser.m

    def preview_and_accept() -> str:
        lab.browser.wait_for("return !document.getElementById('preview').hidden")
        shown = str(m.execute_script("return document.getElementById('preview').innerText"))
        m.find_element("id", "accept").click()
        lab.browser.wait_for("return document.getElementById('preview').hidden")
        return shown

    def cards() -> list[str]:
        return list(m.execute_script(
            "return [...document.querySelectorAll('.notary-name')].map((e) => e.textContent)"))

    def browse() -> Any:
        lab.browser.configure(LAB_SETTINGS, [])
        m.navigate(f"{lab.browser.addon}/src/pages/options.html")
        m.find_element("id", "bundle-url").send_keys(host.url("/lab.notary"))
        m.find_element("id", "fetch").click()
        from_url = preview_and_accept()
        m.find_element("id", "bundle-file").send_keys(str(tmp_path / "file.notary"))
        from_file = preview_and_accept()
        lab.browser.wait_for("return document.querySelectorAll('.notary-name').length === 2")
        both = cards()
        m.find_element("css selector", ".notary .danger").click()
        lab.browser.accept_dialog()
        lab.browser.wait_for("return document.querySelectorAll('.notary-name').length === 1")
        return from_url, from_file, both, cards()

    from_url, from_file, both, left = await drive(browse)
    assert from_url.startswith("Notary by URL") and pins["url"] in from_url
    assert from_file.startswith("Notary from a file") and pins["file"] in from_file
    assert "v2 key" in from_url and "Compare these pins" in from_url
    assert sorted(both) == ["Notary by URL", "Notary from a file"]
    assert left == [n for n in both if n != both[0]]


def test_nothing_left_loopback(lab: Lab) -> None:
    """Whatever Firefox tried beyond the lab's names reached the proxy,
    which refused it: nothing did."""
    assert lab.proxy.refused == []
