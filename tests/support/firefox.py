"""A real, headless Firefox with the add-on of clients/firefox/, driven over
Marionette, and the loopback lab it browses: a test CA trusted by a
throwaway profile (certutil), HTTPS sites and v2 notaries with certificates
from that CA, a hosts proxy mapping test names to loopback addresses, and
a captive-portal canonical page.

Network safety, three ways: every name and every address but loopback goes
to the hosts proxy (``network.proxy.*``, loopback exempt), which serves only
the names a test maps and records anything else in ``refused`` (a test
asserts it stays empty); the native resolver answers every name with
loopback (``network.dns.native-is-localhost``); and :data:`LOOPBACK_PREFS`
turns off Firefox's own background traffic (updates, telemetry, safe
browsing, remote settings, captive-portal detection's default URL,
prefetching, DNS over HTTPS...). ``tests/test_firefox_addon.py`` checks
that the running profile has these prefs.

Missing Firefox (Debian ``firefox-esr``), ``certutil`` (``libnss3-tools``)
or ``marionette_driver``: :func:`require_firefox` skips with the reason,
and fails under CI (``CI`` set, as .ci/run's environment has it), where
``.ci/install-tools tests`` installs them.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import shutil
import socket
import socketserver
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme

from notary.protocol.bundle import BundleHost, make_bundle
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, open_notary
from tests.support.tls_targets import StaticResolver, static_resolver

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "firefox" / "tools"))
from build_xpi import build_xpi  # noqa: E402

try:
    from marionette_driver.addons import Addons
    from marionette_driver.marionette import Marionette
except ImportError:  # pragma: no cover - the test extra installs it
    Marionette = Addons = None

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")
CERTUTIL = shutil.which("certutil")
ADDON_ID = "notary-check@notary.invalid"
#: No test connection or page load waits longer than this.
TIMEOUT_S = 30.0


def in_ci() -> bool:
    """True under CI (.ci/run runs with ``CI=true``): a missing browser is
    then a failure, never a skip."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing() -> str | None:
    """Why the Firefox tests cannot run here, or None."""
    if FIREFOX is None:
        return "Firefox is not installed (Debian firefox-esr: .ci/install-tools tests)"
    if CERTUTIL is None:
        return "certutil is not installed (Debian libnss3-tools: .ci/install-tools tests)"
    if Marionette is None:
        return "marionette_driver is not installed (pip install -e '.[test]')"
    return None


def require_firefox() -> None:
    """Skip (fail under CI) when Firefox, certutil or Marionette is missing;
    skip in the pure-Python pass of ``make test``, which these tests would
    repeat without exercising the twins."""
    if os.environ.get("NOTARY_NO_EXTENSIONS"):
        pytest.skip("the Firefox tests run once, in make test's compiled pass: "
                    "they do not exercise the pure-Python twins")
    reason = missing()
    if reason is not None:
        if in_ci():
            pytest.fail(f"{reason}; CI must run the Firefox tests")
        pytest.skip(reason)


#: Firefox's own traffic, off: what a test profile must never reach.
#: (The proxy and the resolver below catch anything these miss.)
LOOPBACK_PREFS: dict[str, object] = {
    "app.update.auto": False,
    "app.update.enabled": False,
    "app.update.disabledForTesting": True,
    "app.normandy.enabled": False,
    "app.normandy.api_url": "",
    "app.shield.optoutstudies.enabled": False,
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.blockedURIs.enabled": False,
    "browser.safebrowsing.downloads.enabled": False,
    "browser.safebrowsing.downloads.remote.enabled": False,
    "browser.safebrowsing.update.enabled": False,
    "browser.safebrowsing.provider.mozilla.updateURL": "",
    "browser.safebrowsing.provider.google4.updateURL": "",
    "browser.search.update": False,
    "browser.region.network.url": "",
    "browser.region.update.enabled": False,
    "browser.newtabpage.enabled": False,
    "browser.startup.homepage": "about:blank",
    "browser.topsites.contile.enabled": False,
    "datareporting.healthreport.uploadEnabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.enabled": False,
    "toolkit.telemetry.unified": False,
    "toolkit.telemetry.archive.enabled": False,
    "toolkit.telemetry.server": "http://127.0.0.1:9/telemetry",
    "extensions.update.enabled": False,
    "extensions.getAddons.cache.enabled": False,
    "extensions.blocklist.enabled": False,
    "extensions.systemAddon.update.enabled": False,
    "messaging-system.rsexperimentloader.enabled": False,
    # Remote settings: honoured with MOZ_REMOTE_SETTINGS_DEVTOOLS=1 (set at start).
    "services.settings.server": "http://127.0.0.1:9/v1",
    "security.remote_settings.crlite_filters.enabled": False,
    "security.remote_settings.intermediates.enabled": False,
    "security.OCSP.enabled": 0,
    "media.gmp-manager.updateEnabled": False,
    "geo.provider.network.url": "",
    "network.connectivity-service.enabled": False,
    "network.connectivity-service.IPv4.url": "http://127.0.0.1:9/ipv4",
    "network.connectivity-service.IPv6.url": "http://127.0.0.1:9/ipv6",
    "security.certerrors.mitm.priming.enabled": False,
    "browser.discovery.enabled": False,
    "datareporting.usage.uploadEnabled": False,
    "doh-rollout.disable-heuristics": True,
    "dom.push.serverURL": "ws://127.0.0.1:9/",
    "network.dns.disablePrefetch": True,
    "network.dns.native-is-localhost": True,
    "network.prefetch-next": False,
    "network.predictor.enabled": False,
    "network.http.speculative-parallel-limit": 0,
    "network.trr.mode": 5,
    "dom.push.connection.enabled": False,
    "identity.fxaccounts.enabled": False,
    "browser.ping-centre.telemetry": False,
    # Captive-portal detection on, against the lab's canonical page only.
    "network.captive-portal-service.enabled": True,
    "captivedetect.canonicalContent": "success\n",
}


def proxy_script(proxy_port: int) -> str:
    """The lab's proxy auto-config: loopback direct, every other host to the
    hosts proxy (nothing resolved: the proxy gets the name)."""
    return (
        "function FindProxyForURL(url, host) {"
        " if (host === 'localhost' || /^127\\./.test(host) || host === '::1' || host === '[::1]')"
        " return 'DIRECT';"
        f" return 'PROXY 127.0.0.1:{proxy_port}'; }}"
    )


def lab_prefs(proxy_port: int, captive_url: str) -> dict[str, object]:
    """:data:`LOOPBACK_PREFS` with the lab's proxy and captive-portal page."""
    return {
        **LOOPBACK_PREFS,
        "captivedetect.canonicalURL": captive_url,
        # A proxy auto-config rather than manual settings: the add-on's
        # proxy.onRequest then applies to loopback too (manual settings'
        # no_proxies_on made Firefox ignore it there), and it may send a
        # question to a lab notary through another's relay.
        "network.proxy.type": 2,
        "network.proxy.autoconfig_url": "data:application/x-ns-proxy-autoconfig,"
        + _quote(proxy_script(proxy_port)),
        "network.proxy.allow_hijacking_localhost": True,
        # Each page load fetches every resource (the measurements, and the
        # checks of sub-resources); no favicon request (each is one more
        # connection to the site).
        "browser.chrome.site_icons": False,
        "browser.cache.disk.enable": False,
        "browser.cache.memory.enable": False,
    }


# -- servers of the lab (threads: they serve while the Trio notaries and the
# -- Marionette client run elsewhere) -----------------------------------------------


class _Pipe:
    """Copy bytes both ways between two sockets until either side ends."""

    @staticmethod
    def run(a: socket.socket, b: socket.socket) -> None:
        def copy(source: socket.socket, sink: socket.socket) -> None:
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                for s in (source, sink):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        other = threading.Thread(target=copy, args=(b, a), daemon=True)
        other.start()
        copy(a, b)
        other.join(TIMEOUT_S)
        a.close()
        b.close()


class HostsProxy:
    """Firefox's proxy for every name and non-loopback address: ``CONNECT
    name:port`` goes to the loopback addresses a test mapped it to (in turn,
    one per connection: a site at several addresses); anything else is
    answered 403 and recorded in ``refused``."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self.refused: list[str] = []
        self.connections: dict[tuple[str, int], int] = {}
        self._turn: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def map(self, name: str, port: int, *addresses: str, to_port: int | None = None) -> None:
        self.routes[(name, port)] = [(a, to_port or port) for a in addresses]

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(TIMEOUT_S)
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 8192:
                chunk = client.recv(4096)
                if not chunk:
                    break
                head += chunk
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, _, rest = line.partition(" ")
            authority = rest.split(" ", 1)[0]
            host, _, port_text = authority.rpartition(":")
            key = (host.lower(), int(port_text)) if method == "CONNECT" and port_text.isdigit() else None
            with self._lock:
                routes = self.routes.get(key) if key else None
                if not routes:
                    self.refused.append(line)
                else:
                    turn = self._turn.get(key, 0)
                    self._turn[key] = turn + 1
                    self.connections[key] = self.connections.get(key, 0) + 1
                    destination = routes[turn % len(routes)]
            if not routes:
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                client.close()
                return
            upstream = socket.create_connection(destination, timeout=TIMEOUT_S)
            client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            client.settimeout(None)
            upstream.settimeout(None)
            _Pipe.run(client, upstream)
        except (OSError, ValueError):
            client.close()

    def close(self) -> None:
        self._listener.close()


Page = tuple[str, bytes]  # (content type, body)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _SiteHTTPServer

    def _answer(self, body: bool) -> None:
        site = self.server.site
        site.requests.append((self.command, self.path, dict(self.headers.items())))
        path = self.path.split("?", 1)[0]
        if path == "/echo-cookie":
            page: Page | None = ("text/plain", f"cookie: {self.headers.get('Cookie', '-')}".encode())
        else:
            page = site.pages.get(path)
        if page is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        content_type, data = page
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if path == "/set-cookie":
            self.send_header("Set-Cookie", "session=secret; Secure; SameSite=Lax; Path=/")
        if site.close_connections:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def log_message(self, *args: object) -> None:
        pass


class _LoopbackHTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """http.server without its reverse DNS lookup of the bound address
    (``server_bind``'s ``getfqdn``): tests resolve no name."""

    daemon_threads = True

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = host, port

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that leaves mid-handshake (a notary's probe takes the
        certificate and goes) is no error of the site."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _SiteHTTPServer(_LoopbackHTTPServer):
    site: Site

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = self.socket.accept()
        sock.settimeout(TIMEOUT_S)
        self.site.accepted += 1
        return self.site.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address


@dataclass
class Site:
    """An HTTPS site on one loopback address with one certificate.

    ``pages``: path -> (content type, bytes); ``/echo-cookie`` answers the
    Cookie header received and ``/set-cookie`` sets one. ``requests`` records
    (method, path, headers) of each request; ``accepted`` counts connections.
    """

    address: str
    certificate: trustme.LeafCert
    port: int = 0
    pages: dict[str, Page] = field(default_factory=dict)
    close_connections: bool = False
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    accepted: int = 0

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.certificate.configure_cert(self.context)
        self._server = _SiteHTTPServer((self.address, self.port), _Handler, bind_and_activate=True)
        self._server.site = self
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def der(self) -> bytes:
        return ssl.PEM_cert_to_DER_cert(self.certificate.cert_chain_pems[0].bytes().decode("ascii"))

    def url(self, path: str = "/", host: str | None = None) -> str:
        return f"https://{host or self.address}:{self.port}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def html_page(title: str, body: str = "") -> Page:
    return ("text/html; charset=utf-8",
            f"<!doctype html><html><head><title>{title}</title></head><body><h1>{title}</h1>{body}</body></html>".encode())


def _png_pixel() -> bytes:
    """A 1x1 opaque PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00\x2b\x57\x97")) + chunk(b"IEND", b""))


#: A 1x1 PNG, the lab's image resource.
PIXEL: Page = ("image/png", _png_pixel())


class CaptivePortal:
    """The canonical page Firefox's captive-portal detection fetches:
    ``success`` until ``locked`` is set (then a portal's login page)."""

    def __init__(self) -> None:
        portal = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"<html>Please sign in to the lab's Wi-Fi</html>" if portal.locked else b"success\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.locked = False
        self._server = _LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/canonical.html"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# -- the browser -----------------------------------------------------------------------


@dataclass
class PageView:
    url: str
    title: str
    text: str


class Browser:
    """Firefox with the add-on, as a person uses it: visits pages, reads the
    add-on's popup, block page and options page. Synchronous (Marionette):
    call it from a worker thread of a Trio test."""

    def __init__(self, marionette: Marionette, addon_host: str) -> None:
        self.m = marionette
        self.addon = f"moz-extension://{addon_host}"

    def visit(self, url: str) -> PageView:
        self.m.navigate(url)
        return self.page()

    def page(self) -> PageView:
        """The page shown now; the block page once its script has filled
        it in (it asks the background page for its report, after load)."""
        if self.m.get_url().startswith(f"{self.addon}/src/pages/block.html"):
            self.wait_for(
                "return document.getElementById('vote').textContent"
                " || document.getElementById('lead').textContent.startsWith('This report')")
        title, text = self.m.execute_script(
            "return [document.title, document.body ? document.body.innerText : '']")
        return PageView(self.m.get_url(), title, text)

    def wait_for(self, script: str, args: Sequence[object] = (), timeout_s: float = TIMEOUT_S) -> object:
        """Poll ``script`` (returning a value) until it is truthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.m.execute_script(script, list(args))
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def configure(self, settings: Mapping[str, object], bundles: Sequence[str],
                  always_trust: Mapping[str, Sequence[str]] | None = None) -> None:
        """Replace the add-on's settings and notaries with the options page's
        import (what a user pastes from an export)."""
        document = json.dumps({"settings": dict(settings), "notaries": list(bundles),
                               "alwaysTrust": dict(always_trust or {})})
        self.m.navigate(f"{self.addon}/src/pages/options.html")
        self.m.execute_script(
            "document.getElementById('document').value = arguments[0];"
            "document.getElementById('import-result').textContent = '';"
            "document.getElementById('import').click();", [document])
        result = self.wait_for("return document.getElementById('import-result').textContent")
        assert isinstance(result, str) and result.startswith("imported"), result

    def options_text(self) -> str:
        self.m.navigate(f"{self.addon}/src/pages/options.html")
        self.wait_for("return document.querySelector('.notary, #notaries p')")
        return str(self.m.execute_script("return document.body.innerText"))

    def popup(self, page_url: str) -> dict[str, object]:
        """What the toolbar button's popup shows for the tab that loaded
        ``page_url`` (the popup page, opened in the tab)."""
        self.m.navigate(f"{self.addon}/src/pages/popup.html?url={_quote(page_url)}")
        self.wait_for("return document.getElementById('status').textContent !== 'Notary check'")
        return self.m.execute_script("""
            const rows = [...document.querySelectorAll('#notaries tbody tr')].map(
                (tr) => [...tr.cells].map((td) => td.innerText));
            return {status: document.getElementById('status').textContent,
                    words: document.getElementById('words').textContent,
                    resources: document.getElementById('resources').textContent,
                    rows: document.getElementById('notaries').hidden ? [] : rows};""")

    def screenshot(self, path: Path, *, width: int, height: int) -> None:
        """A PNG of the page in a window of ``width`` x ``height``."""
        self.m.set_window_rect(width=width, height=height)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.m.screenshot(format="binary", full=False))

    def pref(self, name: str) -> object:
        with self.m.using_context("chrome"):
            return self.m.execute_script("""
                const [name] = arguments;
                switch (Services.prefs.getPrefType(name)) {
                  case Services.prefs.PREF_BOOL: return Services.prefs.getBoolPref(name);
                  case Services.prefs.PREF_INT: return Services.prefs.getIntPref(name);
                  case Services.prefs.PREF_STRING: return Services.prefs.getStringPref(name);
                  default: return null;
                }""", [name])

    def accept_dialog(self) -> None:
        """Answer OK to the page's ``confirm()`` (or ``alert()``)."""
        from marionette_driver.marionette import Alert

        wait_until(lambda: _dialog_open(self.m))
        Alert(self.m).accept()

    def proxy_for(self, url: str) -> tuple[str, str, int]:
        """How Firefox would route a request for ``url``: (type, host, port)
        of the proxy its settings give (``("direct", "", -1)`` for none).
        Computed by the proxy service alone: nothing is connected or
        resolved (the lab's proxy auto-config calls no DNS function)."""
        with self.m.using_context("chrome"):
            route = self.m.execute_async_script("""
                const [spec, resolve] = arguments;
                const { NetUtil } = ChromeUtils.importESModule("resource://gre/modules/NetUtil.sys.mjs");
                const channel = NetUtil.newChannel({ uri: spec, loadUsingSystemPrincipal: true });
                Cc["@mozilla.org/network/protocol-proxy-service;1"].getService(Ci.nsIProtocolProxyService)
                    .asyncResolve(channel, 0, { onProxyAvailable(request, ch, info) {
                        resolve(info ? [info.type, info.host, info.port] : ["direct", "", -1]);
                    } });""", [url])
        return str(route[0]), str(route[1]), int(route[2])

    def accept_certificate(self, host: str, port: int, der: bytes) -> None:
        """What "Accept the Risk and Continue" stores: a certificate
        exception for host:port (nsICertOverrideService)."""
        with self.m.using_context("chrome"):
            self.m.execute_script("""
                const [host, port, b64] = arguments;
                const cert = Cc["@mozilla.org/security/x509certdb;1"]
                    .getService(Ci.nsIX509CertDB).constructX509FromBase64(b64);
                Cc["@mozilla.org/security/certoverride;1"].getService(Ci.nsICertOverrideService)
                    .rememberValidityOverride(host, port, {}, cert, false);""",
                [host, port, base64.b64encode(der).decode("ascii")])

    def recheck_captive_portal(self) -> str:
        """Ask Firefox's captive-portal service to look again; its state."""
        with self.m.using_context("chrome"):
            self.m.execute_script("""
                const service = Cc["@mozilla.org/network/captive-portal-service;1"]
                    .getService(Ci.nsICaptivePortalService);
                service.recheckCaptivePortal();""")
        return self.captive_state()

    def captive_state(self) -> str:
        with self.m.using_context("chrome"):
            return str(self.m.execute_script("""
                const service = Cc["@mozilla.org/network/captive-portal-service;1"]
                    .getService(Ci.nsICaptivePortalService);
                return ["unknown", "not_captive", "unlocked_portal", "locked_portal"][service.state];"""))


def _dialog_open(m: Marionette) -> bool:
    from marionette_driver.errors import NoAlertPresentException
    from marionette_driver.marionette import Alert

    try:
        Alert(m).text  # noqa: B018 - raises without a dialog
    except NoAlertPresentException:
        return False
    return True


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def make_profile(directory: Path, ca: trustme.CA) -> Path:
    """A throwaway Firefox profile whose NSS database trusts ``ca`` for TLS."""
    profile = directory / "profile"
    profile.mkdir(parents=True)
    ca_file = directory / "lab-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    run = lambda *args: subprocess.run(  # noqa: E731
        [CERTUTIL, *args, "-d", f"sql:{profile}"], check=True, capture_output=True, timeout=60)
    run("-N", "--empty-password")
    run("-A", "-n", "notary lab CA", "-t", "C,,", "-i", str(ca_file))
    return profile


@dataclass
class Lab:
    """What one module's tests share: the CA, the proxy, the captive page
    and the browser (one Firefox start per module)."""

    ca: trustme.CA
    proxy: HostsProxy
    captive: CaptivePortal
    browser: Browser
    directory: Path

    def leaf(self, *names: str, rsa: bool = False) -> trustme.LeafCert:
        key_type = trustme.KeyType.RSA if rsa else trustme.KeyType.ECDSA
        return self.ca.issue_cert(*names, key_type=key_type)


def open_lab(directory: Path, *, with_addon: bool = True, ca: trustme.CA | None = None,
             prefs: Mapping[str, object] | None = None) -> Iterator[Lab]:
    """Start the lab and Firefox (with the add-on installed temporarily
    unless ``with_addon`` is false; ``ca``: the lab's CA, a new one by
    default); stop them after the block."""
    ca = ca or trustme.CA(key_type=trustme.KeyType.RSA)
    proxy = HostsProxy()
    captive = CaptivePortal()
    profile = make_profile(directory, ca)
    os.environ["MOZ_REMOTE_SETTINGS_DEVTOOLS"] = "1"
    os.environ.setdefault("MOZ_DISABLE_CONTENT_SANDBOX", "1")
    marionette = Marionette(
        bin=FIREFOX, headless=True, profile=str(profile), port=0,
        prefs={**lab_prefs(proxy.port, captive.url), **(prefs or {})},
        gecko_log=str(directory / "gecko.log"), startup_timeout=60,
    )
    try:
        marionette.start_session()
        marionette.timeout.page_load = TIMEOUT_S
        marionette.timeout.script = TIMEOUT_S
        addon_host = ""
        if with_addon:
            xpi = build_xpi(directory / "notary-check.xpi")
            addon_id = Addons(marionette).install(str(xpi), temp=True)
            assert addon_id == ADDON_ID
            with marionette.using_context("chrome"):
                addon_host = marionette.execute_script(
                    "return WebExtensionPolicy.getByID(arguments[0]).mozExtensionHostname", [addon_id])
        yield Lab(ca, proxy, captive, Browser(marionette, addon_host), directory)
    finally:
        try:
            marionette.cleanup()
        finally:
            proxy.close()
            captive.close()


# -- notaries of the lab ---------------------------------------------------------------


@dataclass
class LabNotary:
    notary: NotaryUnderTest
    bundle: str
    name: str
    host: str
    resolver: StaticResolver


def notary_files(lab: Lab, directory: Path, host: str) -> tuple[Path, Path, Path, str, str]:
    """A lab notary's TLS key and certificate (from the lab's CA, an RSA key:
    it signs Convergence answers too) and Ed25519 key: their files, the
    certificate's PEM and the v2 public key in base64."""
    directory.mkdir(parents=True, exist_ok=True)
    leaf = lab.leaf(host, rsa=True)
    key_file, cert_file, v2_file = directory / "tls.key", directory / "tls.crt", directory / "v2.key"
    leaf.private_key_pem.write_to_path(str(key_file))
    leaf.cert_chain_pems[0].write_to_path(str(cert_file))
    v2_key = crypto.generate_ed25519_key()
    crypto.write_ed25519_private_key(v2_file, v2_key)
    v2_public = base64.b64encode(crypto.ed25519_public_raw(v2_key)).decode("ascii")
    return key_file, cert_file, v2_file, leaf.cert_chain_pems[0].bytes().decode("ascii"), v2_public


@asynccontextmanager
async def open_lab_notary(
    lab: Lab, directory: Path, host: str, *, name: str | None = None,
    names: dict[str, list[str]] | None = None, legacy: bool = False, **sections: Any,
) -> AsyncIterator[LabNotary]:
    """A v2 notary on ``host`` (:func:`notary_files`) and its bundle pinning
    its certificate and its Ed25519 key (``legacy``: no v2 key, as a 2011
    bundle: the add-on asks it with the Convergence API); ``names`` is its
    resolver's map (``LabNotary.resolver.mapping``, to edit)."""
    key_file, cert_file, v2_file, pem, v2_public = notary_files(lab, directory, host)
    name = name or f"Notary {host}"
    resolver = static_resolver(names or {})
    async with open_notary(
        directory / "n", resolver=resolver, host=host,
        server={"key_file": key_file, "cert_file": cert_file},
        v2={"key_file": v2_file}, answers={"failures_at_deadline": False}, **sections,
    ) as notary:
        bundle = make_bundle(
            name=name, location=f"https://{host}/lab.notary",
            hosts=[BundleHost(host, notary.port, notary.relay_port, pem,
                              v2_key=None if legacy else v2_public)],
        )
        yield LabNotary(notary, bundle.to_json().decode("utf-8"), name, host, resolver)


def wait_until(condition: Callable[[], object], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)
