"""Make docs/screenshots/index.png and site.png: a demo notary on loopback
with a local TLS site whose history has three certificates, rendered by
headless Chromium (as in tests/test_web_browser.py, whose set-up it reuses).

    .venv/bin/python docs/screenshots/make_screenshots.py

Needs Debian's chromium (.ci/install-tools tests) and the test extra
(playwright). Only loopback is contacted.
"""

from __future__ import annotations

import sys
import tempfile
from functools import partial
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from tests.support.tls_targets import open_tls_target  # noqa: E402
from tests.support.web import SITE, open_web_notary, seed_three_certificates  # noqa: E402
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

OUT = Path(__file__).resolve().parent
#: Keeps each PNG well under 300 KB.
VIEWPORT = {"width": 1000, "height": 1250}


def shoot(base: str, site_path: str) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_context(ignore_https_errors=True, viewport=VIEWPORT).new_page()
        page.goto(base + "/")
        page.locator("#figures-status").filter(has_text="Live: updated").wait_for()
        page.screenshot(path=str(OUT / "index.png"))
        page.goto(base + site_path)
        page.screenshot(path=str(OUT / "site.png"))
        browser.close()


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        async with open_tls_target(names=[SITE]) as site:
            async with open_web_notary(Path(directory), {SITE: [site.host]}) as notary:
                await seed_three_certificates(notary, site)
                await trio.to_thread.run_sync(partial(
                    shoot, f"https://127.0.0.1:{notary.port}", f"/site/{SITE}+{site.port}"
                ))
    for name in ("index.png", "site.png"):
        print(f"{OUT / name}: {(OUT / name).stat().st_size // 1024} KB")


if __name__ == "__main__":
    trio.run(main)
