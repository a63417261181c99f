"""The site page of a site that serves several certificates at once (issue
31, item 6): one lane per certificate labelled with the addresses that
served it, the current set's certificates marked, and a badge for a split
or rotating site, under the pages' escaping and CSP rules.

Rendering tests use timelines built from sightings at several addresses
(``tests.support.observations``); the served-page tests make the notary see
a split site by moving the site's name between loopback addresses (a DNS
change, ``StaticResolver``) and probing after each move."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from notary.model.observations import Observation, Timeline
from notary.model.targets import Target
from notary.web import pages, timeline_svg
from tests.support.http_client import get
from tests.support.observations import certificate, sightings_timeline
from tests.support.web import SITE, assert_page, open_split_site

SVG = "{http://www.w3.org/2000/svg}"
DAY = 86400
NOW = 1_770_000_000
TARGET = Target(SITE, 443)
HOSTILE = '<script>alert("x")</script>'


def split_site() -> Timeline:
    return sightings_timeline([
        ("a", "127.0.0.2", NOW - 300), ("b", "127.0.0.3", NOW - 200),
        ("c", "127.0.0.4", NOW - 100), ("c", "::1", NOW - 50),
        ("old", "127.0.0.2", NOW - 9 * DAY),
    ])


def rotating_site() -> Timeline:
    return sightings_timeline([
        ("a", "127.0.0.5", NOW - 30), ("b", "127.0.0.5", NOW - 20), ("a", "127.0.0.6", NOW - 10),
    ])


def page(timeline: Timeline | None, fresh_for_s: int | None = DAY) -> str:
    return pages.site_page(
        TARGET, timeline, now=NOW, assets=pages.AssetLinks(), fresh_for_s=fresh_for_s
    ).decode()


def lanes(html: str) -> list[ET.Element]:
    svg = re.search(r"<svg .*?</svg>", html, re.S)
    assert svg is not None
    root = ET.fromstring(svg.group(0))
    return [g for g in root.iter(f"{SVG}g") if "lane" in g.get("class", "").split()]


def test_each_lane_shows_the_addresses_that_served_its_certificate() -> None:
    html = page(split_site())
    drawn = {g.get("data-sha256"): g for g in lanes(html)}
    c = drawn[certificate("c").sha256.hex()]
    assert c.get("data-addresses") == "::1 127.0.0.4"  # newest first, as observed
    texts = ["".join(t.itertext()) for t in c.iter(f"{SVG}text")]
    assert texts[1] == "::1 +1"
    title = "".join(next(c.iter(f"{SVG}title")).itertext())
    assert title == "certificate #4, currently served, served from ::1, 127.0.0.4"
    old = drawn[certificate("old").sha256.hex()]
    assert old.get("data-current") == "false" and "current" not in old.get("class", "").split()
    assert [g.get("data-current") for g in lanes(html)] == ["false", "true", "true", "true"]


def test_a_split_site_gets_its_badge() -> None:
    html = page(split_site())
    badge = re.search(r'<p class="badge badge-split" id="consistency"[^>]*>(.*?)</p>', html)
    assert badge is not None
    assert re.sub(r"<[^>]+>", "", badge.group(1)).startswith(
        "Split site: 3 certificates served at once from 4 addresses; each address serves "
        "its own certificate. This notary vouches for each of them"
    )
    assert 'data-consistency="split"' in html
    assert html.count('<span class="tag tag-current">served now</span>') == 3
    assert html.count('<span class="tag">not served now</span>') == 1


def test_a_rotating_site_gets_its_badge() -> None:
    html = page(rotating_site())
    assert 'class="badge badge-rotating"' in html
    assert "Rotating site</strong>: 2 certificates served at once from 2 addresses" in html


def test_a_stable_site_and_an_unknown_window_get_no_badge() -> None:
    stable = sightings_timeline([("a", "192.0.2.1", NOW - 10), ("a", "192.0.2.2", NOW)])
    html = page(stable)
    assert "badge" not in html and 'data-consistency="stable"' in html
    assert lanes(html)[0].get("data-current") == "true"
    # Without the freshness window nothing is said of what is served now.
    html = page(split_site(), fresh_for_s=None)
    assert "badge" not in html and "data-consistency" not in html and "served now" not in html
    assert {g.get("data-current") for g in lanes(html)} == {"false"}


def test_address_lines_fit_the_label_column() -> None:
    long_v6 = "2001:db8:1234:5678:9abc:def0:1234:5678"
    assert timeline_svg.address_line(()) == "no address recorded"
    assert timeline_svg.address_line(("192.0.2.1",)) == "192.0.2.1"
    assert timeline_svg.address_line(("192.0.2.1", "192.0.2.2")) == "192.0.2.1 +1"
    for addresses in ((long_v6,), (long_v6, "192.0.2.1", "192.0.2.2")):
        line = timeline_svg.address_line(addresses)
        assert len(line) <= timeline_svg.MAX_LANE_ADDRESS_CHARS and "…" in line
    assert timeline_svg.address_line((long_v6, "::1")).endswith("… +1")


def test_addresses_are_escaped_and_the_page_keeps_its_rules() -> None:
    # Addresses come from the store: escaped like every other string.
    timeline = Timeline(TARGET, (
        Observation(certificate("a"), NOW - 10, NOW, (HOSTILE, "192.0.2.1")),
        Observation(certificate("b"), NOW - 10, NOW - 5, ("192.0.2.1",)),
    ))
    html = page(timeline)
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert 'class="badge badge-rotating"' in html
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/notary.js" defer>']
    assert " style=" not in html and "<style" not in html
    lanes(html)  # still well-formed SVG


# -- served by a notary -----------------------------------------------------------------


@pytest.mark.parametrize("layout", ["split", "rotating"])
async def test_the_served_page_of_a_site_that_moved_between_addresses(
    tmp_path: Path, layout: str
) -> None:
    """The notary probes the name while it resolves to one loopback address
    after another (each with its own certificate); for "rotating" the first
    address changes its certificate before the last probe."""
    async with open_split_site(tmp_path) as split:
        notary, first = split.notary, split.sites[0]
        if layout == "rotating":
            first.replace_certificate(SITE)
            await split.probe_at(first)
        html = assert_page(await get(notary.port, f"/site/{SITE}+{first.port}"), 200)
    if layout == "split":
        assert "Split site</strong>: 3 certificates served at once from 3 addresses" in html
        assert sorted(g.get("data-addresses") for g in lanes(html)) == [
            "127.0.0.1", "127.0.0.2", "127.0.0.3"
        ]
    else:
        assert "Rotating site</strong>: 4 certificates served at once from 3 addresses" in html
    assert all(g.get("data-current") == "true" for g in lanes(html))
