"""A notary with its web pages (v2 on, a served bundle) and a site whose
history has three certificates, for the web page tests.

``seed_three_certificates`` probes the site through the notary's own prober
at moments set with the notary's clock, over about three weeks before now,
swapping the site's certificate between them (merge window: the default
48 h): certificate A in runs 1-2 (a gap of four days between), B in one
run, C in runs 1-2. Only loopback is ever contacted.

``assert_page`` checks what every page carries (its status, HTML, the
security headers) and gives its text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from notary.web.headers import CONTENT_SECURITY_POLICY
from tests.support.notaries import NotaryUnderTest, RawResponse, open_v2_notary
from tests.support.tls_targets import TLSTarget

SITE = "www.example.test"
DAY_S = 86400
#: Runs per certificate that ``seed_three_certificates`` makes, oldest first.
SEEDED_RUNS = (2, 1, 2)
HTML = b"text/html; charset=utf-8"


@asynccontextmanager
async def open_web_notary(
    tmp_path: Path, names: dict[str, list[str]], **sections: object
) -> AsyncIterator[NotaryUnderTest]:
    """A notary with v2 (live figures, watches) and a served bundle."""
    async with open_v2_notary(tmp_path, names, serve_bundle=True, **sections) as notary:
        yield notary


async def seed_three_certificates(notary: NotaryUnderTest, site: TLSTarget) -> None:
    """Give ``site`` (served as :data:`SITE`) the history described above;
    the clock is back to now afterwards."""
    records = notary.running.records
    target = site.target(SITE)
    # (days from the start, replace the certificate first)
    steps = ((0, False), (0.05, False), (4, False),  # A: runs 1 and 2
             (6, True),                              # B: one run
             (9, True), (13, False))                 # C: runs 1 and 2
    start_offset = -21 * DAY_S
    try:
        for days, replace in steps:
            if replace:
                site.replace_certificate(SITE)
            notary.clock.offset = start_offset + days * DAY_S
            await records.refresh(target)
    finally:
        notary.clock.offset = 0.0


def assert_page(response: RawResponse, status: int) -> str:
    assert response.status == status, response.body[:300]
    assert response.headers[b"content-type"] == HTML
    assert response.headers[b"content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers[b"x-content-type-options"] == b"nosniff"
    assert response.headers[b"referrer-policy"] == b"no-referrer"
    return response.body.decode()
