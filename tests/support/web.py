"""A notary with its web pages (v2 on, a served bundle) and a site whose
history has three certificates, for the web page tests.

``seed_three_certificates`` probes the site through the notary's own prober
at moments set with the notary's clock, over about three weeks before now,
swapping the site's certificate between them (merge window: the default
48 h): certificate A in runs 1-2 (a gap of four days between), B in one
run, C in runs 1-2. Only loopback is ever contacted.

``open_split_site`` is a web notary that has probed :data:`SITE` at three
loopback addresses, each serving its own certificate (issue 31).

``assert_page`` checks what every page carries (its status, HTML, the
security headers) and gives its text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from notary.web.headers import CONTENT_SECURITY_POLICY
from tests.support.notaries import NotaryUnderTest, RawResponse, open_v2_notary
from tests.support.tls_targets import StaticResolver, TLSTarget, open_tls_target, static_resolver

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


@dataclass
class SplitSite:
    """A web notary and :data:`SITE` served at 127.0.0.1-3 on one port,
    each address with its own certificate, the name resolved by
    ``resolver`` (the notary's)."""

    notary: NotaryUnderTest
    sites: list[TLSTarget]
    resolver: StaticResolver

    async def probe_at(self, site: TLSTarget) -> None:
        """The notary probes :data:`SITE` while it resolves to ``site`` alone."""
        self.resolver.mapping[SITE] = [site.host]
        await self.notary.running.records.refresh(self.sites[0].target(SITE))


@asynccontextmanager
async def open_split_site(tmp_path: Path) -> AsyncIterator[SplitSite]:
    """A :class:`SplitSite` whose notary has probed each address in turn."""
    resolver = static_resolver({})
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_tls_target(names=[SITE]))
        sites = [first]
        for host in ("127.0.0.2", "127.0.0.3"):
            sites.append(await stack.enter_async_context(
                open_tls_target(names=[SITE], host=host, port=first.port)
            ))
        notary = await stack.enter_async_context(
            open_web_notary(tmp_path, {}, resolver=resolver)
        )
        split = SplitSite(notary, sites, resolver)
        for site in sites:
            await split.probe_at(site)
        yield split


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
