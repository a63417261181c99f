"""The web pages rendered in a real browser: headless Chromium (Debian's
``chromium``, installed by ``.ci/install-tools tests``) driven by
Playwright with the system executable (Playwright never downloads one).

One notary, one local TLS site with three certificates in its history:
``/`` shows live figures over the WebSocket, ``/site/...`` draws three
lanes and five runs, "check now" (pressed from the keyboard) makes a fourth
lane appear, an XSS attempt through a target name stays text, and no page
breaks its Content-Security-Policy. A site served from three loopback
addresses with a certificate each shows its split badge and its lanes'
addresses, wide and on a phone. Screenshots go to ``$NOTARY_TEST_ARTIFACTS``
(default ``tests/artifacts/``).

Network safety: the browser only connects to 127.0.0.1, and its resolver
maps every name but ``localhost`` to "not found".
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.support.tls_targets import TLSTarget, open_tls_target
from tests.support.web import (
    SEEDED_RUNS,
    SITE,
    open_split_site,
    open_web_notary,
    seed_three_certificates,
)

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None
)
pytestmark = [
    pytest.mark.skipif(
        sync_playwright is None, reason="playwright is not installed (pip install -e '.[test]')"
    ),
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian chromium is not installed (.ci/install-tools tests)"
    ),
]

CHROMIUM_ARGS = [
    # Containers (CI runs as root) lack the user namespaces Chromium's
    # sandbox needs; the pages it loads are our own, from loopback.
    "--no-sandbox",
    # Loopback only: every host name but localhost fails to resolve, and
    # nothing phones home.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
XSS = "<img src=x onerror=alert(1)>"
TIMEOUT_MS = 10_000


def artifacts_dir() -> Path:
    directory = Path(
        os.environ.get("NOTARY_TEST_ARTIFACTS") or Path(__file__).parent / "artifacts"
    )
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@dataclass
class BrowserReport:
    csp: str | None = None
    figures_status: str = ""
    lanes_before: int = 0
    runs_before: int = 0
    runs_per_lane: list[int] = field(default_factory=list)
    lanes_after: int = 0
    check_status: str = ""
    xss_status: int = 0
    xss_text: str = ""
    injected_images: int = 0
    phone_overflow: bool = True
    dialogs: list[str] = field(default_factory=list)
    csp_violations: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)


def browse(base: str, site_path: str, site: TLSTarget, shots: Path) -> BrowserReport:
    """Drive Chromium through the pages (in a worker thread: Playwright's
    sync API; the notary keeps running in the Trio thread)."""
    assert sync_playwright is not None and CHROMIUM is not None
    report = BrowserReport()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            # The notary's certificate is self-signed (clients pin it).
            context = browser.new_context(
                ignore_https_errors=True, viewport={"width": 1100, "height": 900}
            )
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)

            def on_console(message: object) -> None:
                text = message.text  # type: ignore[attr-defined]
                if "Content Security Policy" in text:
                    report.csp_violations.append(text)

            def on_dialog(dialog: object) -> None:
                report.dialogs.append(dialog.message)  # type: ignore[attr-defined]
                dialog.dismiss()  # type: ignore[attr-defined]

            page.on("console", on_console)
            page.on("dialog", on_dialog)
            page.on("pageerror", lambda error: report.page_errors.append(str(error)))

            response = page.goto(base + "/")
            assert response is not None
            report.csp = response.headers.get("content-security-policy")
            # The figures arrive over wss:// (connect-src 'self').
            status = page.locator("#figures-status")
            status.filter(has_text="Live: updated").wait_for()
            report.figures_status = status.inner_text()
            page.screenshot(path=str(shots / "index.png"), full_page=True)

            page.goto(base + site_path)
            report.lanes_before = page.locator("svg.timeline g.lane").count()
            report.runs_before = page.locator("svg.timeline rect.run").count()
            report.runs_per_lane = [
                int(value) for value in page.locator("svg.timeline g.lane").evaluate_all(
                    "lanes => lanes.map(lane => lane.getAttribute('data-runs'))"
                )
            ]
            page.screenshot(path=str(shots / "site.png"), full_page=True)

            trio.from_thread.run_sync(site.replace_certificate, SITE)
            page.focus("#check-form button")
            page.keyboard.press("Enter")
            # (A locator, not wait_for_function: that one evals a string,
            # which the page's CSP rightly refuses.)
            page.locator("svg.timeline g.lane").nth(3).wait_for()
            report.lanes_after = page.locator("svg.timeline g.lane").count()
            live = page.locator("#live-status")
            live.filter(has_text="observed").wait_for()
            report.check_status = live.inner_text()
            page.screenshot(path=str(shots / "site-after-check.png"), full_page=True)

            phone = context.new_page()
            phone.set_viewport_size({"width": 390, "height": 844})
            phone.goto(base + site_path)
            report.phone_overflow = phone.evaluate(
                "document.documentElement.scrollWidth > window.innerWidth"
            )
            phone.screenshot(path=str(shots / "site-phone.png"), full_page=True)
            phone.close()

            response = page.goto(base + "/site/" + XSS.replace(" ", "%20") + "+443")
            assert response is not None
            report.xss_status = response.status
            report.xss_text = page.locator("code.asked").inner_text()
            report.injected_images = page.locator("img").count()
            page.screenshot(path=str(shots / "xss.png"), full_page=True)
        finally:
            browser.close()
    return report


async def test_pages_in_headless_chromium(tmp_path: Path) -> None:
    async with open_tls_target(names=[SITE]) as site:
        async with open_web_notary(tmp_path, {SITE: [site.host]}) as notary:
            await seed_three_certificates(notary, site)
            base = f"https://127.0.0.1:{notary.port}"
            site_path = f"/site/{SITE}+{site.port}"
            with trio.fail_after(60):
                report = await trio.to_thread.run_sync(
                    partial(browse, base, site_path, site, artifacts_dir())
                )
    assert report.csp is not None and "script-src 'self'" in report.csp
    assert report.figures_status.startswith("Live: updated")
    assert report.lanes_before == 3
    assert report.runs_before == sum(SEEDED_RUNS)
    assert report.runs_per_lane == list(SEEDED_RUNS)
    assert report.lanes_after == 4
    assert "observed" in report.check_status
    assert not report.phone_overflow
    assert report.xss_status == 400
    assert report.xss_text == XSS + "+443"  # shown as text...
    assert report.injected_images == 0  # ...never as an element
    assert report.dialogs == []
    assert report.csp_violations == []
    assert report.page_errors == []


@dataclass
class SplitReport:
    badge: str = ""
    badge_visible: bool = False
    lanes: int = 0
    current_lanes: int = 0
    address_lines: list[str] = field(default_factory=list)
    phone_overflow: bool = True
    csp_violations: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)


def browse_split(base: str, site_path: str, shots: Path) -> SplitReport:
    """The page of a split site, wide and on a phone (in a worker thread)."""
    assert sync_playwright is not None and CHROMIUM is not None
    report = SplitReport()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(
                ignore_https_errors=True, viewport={"width": 1100, "height": 900}
            )
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.on("console", lambda message: report.csp_violations.append(message.text)
                    if "Content Security Policy" in message.text else None)
            page.on("pageerror", lambda error: report.page_errors.append(str(error)))
            page.goto(base + site_path)
            badge = page.locator("#consistency")
            report.badge_visible = badge.is_visible()
            report.badge = badge.inner_text()
            report.lanes = page.locator("svg.timeline g.lane").count()
            report.current_lanes = page.locator("svg.timeline g.lane.current").count()
            report.address_lines = page.locator("svg.timeline text.lane-addresses").evaluate_all(
                "texts => texts.map(text => text.textContent)"
            )
            page.screenshot(path=str(shots / "site-split.png"), full_page=True)
            phone = context.new_page()
            phone.set_viewport_size({"width": 390, "height": 844})
            phone.goto(base + site_path)
            report.phone_overflow = phone.evaluate(
                "document.documentElement.scrollWidth > window.innerWidth"
            )
            phone.screenshot(path=str(shots / "site-split-phone.png"), full_page=True)
        finally:
            browser.close()
    return report


async def test_a_split_site_in_headless_chromium(tmp_path: Path) -> None:
    """Issue 31: the name moves between three loopback addresses, each with
    its own certificate; the page shows the split badge and a lane per
    certificate with its address."""
    async with open_split_site(tmp_path) as split:
        notary, first = split.notary, split.sites[0]
        base = f"https://127.0.0.1:{notary.port}"
        with trio.fail_after(60):
            report = await trio.to_thread.run_sync(
                partial(browse_split, base, f"/site/{SITE}+{first.port}", artifacts_dir())
            )
    assert report.badge_visible
    assert report.badge.startswith("Split site: 3 certificates served at once from 3 addresses")
    assert (report.lanes, report.current_lanes) == (3, 3)
    assert sorted(report.address_lines) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert not report.phone_overflow
    assert report.csp_violations == [] and report.page_errors == []
