"""The web pages' pure parts (notary.web, notary.service.figures): escaping,
the SVG timeline (lanes, runs, gaps, bounds), certificate details, the
security headers and the live figures' arithmetic."""

from __future__ import annotations

import datetime
import hashlib
import re
import xml.etree.ElementTree as ET

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from notary.model.observations import Certificate, Observation, Timeline
from notary.model.targets import Target
from notary.service.figures import figures_between
from notary.web import headers, pages, timeline_svg
from notary.web.assets import load_assets
from notary.web.certificates import details_of
from notary.web.headers import CONTENT_SECURITY_POLICY, page_headers
from tests.support.odd_certificates import ODD_KEYS, odd_certificate

SVG = "{http://www.w3.org/2000/svg}"
TARGET = Target("www.example.test", 443)
DAY = 86400
NOW = 1_750_000_000
HOSTILE = '<script>alert("x")</script>'


def fake_certificate(seed: int) -> Certificate:
    der = b"not a certificate %d" % seed
    return Certificate(
        der=der, sha1=hashlib.sha1(der).digest(), sha256=hashlib.sha256(der).digest(),
        md5=hashlib.md5(der).digest(), spki_sha256=hashlib.sha256(der + b"spki").digest(),
    )


def observation(seed: int, runs: tuple[tuple[int, int], ...]) -> Observation:
    return Observation(
        certificate=fake_certificate(seed), first_seen=runs[0][0], last_seen=runs[-1][1],
        addresses=("192.0.2.1",), runs=runs,
    )


def three_certificates() -> Timeline:
    start = NOW - 30 * DAY
    return Timeline(TARGET, (
        observation(1, ((start, start + 3600), (start + 5 * DAY, start + 6 * DAY))),
        observation(2, ((start + 8 * DAY, start + 9 * DAY),)),
        observation(3, ((start + 12 * DAY, start + 12 * DAY), (start + 20 * DAY, NOW))),
    ))


def hostile_certificate() -> Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTILE)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(0x1234)
        .not_valid_before(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("evil.example.test")]), False)
        .sign(key, hashes.SHA256())
    )
    return Certificate.from_der(cert.public_bytes(serialization.Encoding.DER))


def lanes_of(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter(f"{SVG}g") if "lane" in g.get("class", "").split()]


def test_esc_escapes_markup_and_quotes() -> None:
    assert pages.esc(HOSTILE + "'&") == (
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&#x27;&amp;"
    )


def test_the_chart_has_a_lane_per_certificate_and_a_bar_per_run() -> None:
    timeline = three_certificates()
    chart = timeline_svg.timeline_svg(
        timeline, start=NOW - 31 * DAY, end=NOW + DAY, label="t"
    )
    lanes = lanes_of(chart.svg)
    assert (chart.lanes, chart.runs) == (3, 5) and len(lanes) == 3
    assert [int(g.get("data-runs")) for g in lanes] == [2, 1, 2]  # oldest first
    assert [len(g.findall(f"{SVG}rect")) for g in lanes] == [2, 1, 2]
    assert lanes[0].get("data-sha256") == fake_certificate(1).sha256.hex()
    assert (chart.lanes_left_out, chart.runs_left_out) == (0, 0)


def test_gaps_between_runs_stay_visible_and_single_sightings_are_drawn() -> None:
    chart = timeline_svg.timeline_svg(
        three_certificates(), start=NOW - 31 * DAY, end=NOW + DAY, label="t"
    )
    first, _, third = lanes_of(chart.svg)
    bars = [(float(r.get("x")), float(r.get("width"))) for r in first.findall(f"{SVG}rect")]
    (x1, w1), (x2, _) = bars
    assert x1 + w1 < x2  # the gap between the two runs is empty
    single = third.findall(f"{SVG}rect")[0]  # a run of one sighting
    assert float(single.get("width")) == timeline_svg.MIN_RUN_WIDTH
    # Bars follow time: each lane starts right of the one above's start.
    starts = [float(g.findall(f"{SVG}rect")[0].get("x")) for g in lanes_of(chart.svg)]
    assert starts == sorted(starts)


def test_the_chart_is_bounded() -> None:
    many = Timeline(TARGET, tuple(
        observation(i, ((NOW - 1000 + i, NOW - 1000 + i),))
        for i in range(timeline_svg.MAX_LANES + 7)
    ))
    chart = timeline_svg.timeline_svg(many, start=NOW - 2000, end=NOW, label="t")
    assert (chart.lanes, chart.lanes_left_out) == (timeline_svg.MAX_LANES, 7)
    runs = tuple((NOW - 10 * i * DAY, NOW - 10 * i * DAY) for i in range(300, 0, -1))
    busy = Timeline(TARGET, (observation(1, runs),))
    chart = timeline_svg.timeline_svg(busy, start=NOW - 4000 * DAY, end=NOW, label="t")
    assert (chart.runs, chart.runs_left_out) == (timeline_svg.MAX_RUNS_PER_LANE, 100)


def test_certificate_details_are_read_and_hostile_text_is_escaped() -> None:
    certificate = hostile_certificate()
    details = details_of(certificate)
    assert "<script" in details.subject and details.names == ("evil.example.test",)
    assert details.not_before == int(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC).timestamp())
    assert details.serial == "1234"
    timeline = Timeline(TARGET, (Observation(certificate, NOW - 10, NOW, ('"><b>x',)),))
    html = pages.site_page(TARGET, timeline, now=NOW, assets=pages.AssetLinks()).decode()
    assert "<script>alert" not in html and "<b>x" not in html
    assert "&lt;script\\&gt;alert(\\&quot;x\\&quot;)" in html
    assert "&quot;&gt;&lt;b&gt;x" in html
    assert details_of(fake_certificate(9)).subject == "(unreadable)"  # never raises


@pytest.mark.parametrize(
    ("make_key", "shown"),
    [
        (lambda: rsa.generate_private_key(65537, 2048), "RSA 2048"),
        (lambda: ec.generate_private_key(ec.SECP384R1()), "EC secp384r1"),
        (ed25519.Ed25519PrivateKey.generate, "Ed25519"),
    ],
    ids=["rsa", "ec", "ed25519"],
)
def test_the_key_type_is_shown(make_key, shown: str) -> None:
    key = make_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "k.example.test")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC))
        .sign(key, None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256())
    )
    certificate = Certificate.from_der(cert.public_bytes(serialization.Encoding.DER))
    assert details_of(certificate).key_type == shown
    timeline = Timeline(TARGET, (Observation(certificate, NOW - 10, NOW),))
    html = pages.site_page(TARGET, timeline, now=NOW, assets=pages.AssetLinks()).decode()
    assert f"<dt>Key</dt><dd>{shown}</dd>" in html


@pytest.mark.parametrize("kind", ODD_KEYS)
def test_a_key_cryptography_cannot_load_is_shown_as_unknown(kind: str) -> None:
    certificate = Certificate.from_der(odd_certificate(kind, "odd.example.test").der)
    details = details_of(certificate)
    assert details.key_type == "unknown"
    assert details.names == ("odd.example.test",)  # the rest still reads
    assert details.subject == "CN=odd.example.test"
    timeline = Timeline(TARGET, (Observation(certificate, NOW - 10, NOW),))
    html = pages.site_page(TARGET, timeline, now=NOW, assets=pages.AssetLinks()).decode()
    assert "<dt>Key</dt><dd>unknown</dd>" in html
    assert details_of(fake_certificate(9)).key_type == "(unreadable)"


def test_pages_use_no_inline_script_or_style() -> None:
    profile = pages.NotaryProfile(
        name=HOSTILE, version="0", region="DE", v2_key_ids=("abc",), bundle_href="/x.notary",
        hosts=(pages.NotaryHost("127.0.0.1", 443, 80, "AA:BB", "CC:DD"),),
        offers=(("Convergence", HOSTILE),), policies=(("p", "v"),), figures_interval_s=5,
    )
    rendered = [
        pages.index_page(profile, {"queries_per_s": 1.25}, assets=pages.AssetLinks()),
        pages.site_page(TARGET, three_certificates(), now=NOW, assets=pages.AssetLinks()),
        pages.site_page(TARGET, None, now=NOW, assets=pages.AssetLinks(), live=True),
        pages.error_page(400, "bad", assets=pages.AssetLinks(), asked=HOSTILE),
    ]
    for page in (p.decode() for p in rendered):
        assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/notary.js" defer>']
        assert " style=" not in page and "<style" not in page
        assert "<script>alert" not in page
        assert re.search(r"<\w+ on\w+=", page) is None
    index = rendered[0].decode()
    assert "&lt;script&gt;" in index and 'data-figure="queries_per_s">1.2' in index
    assert 'href="/x.notary" download' in index and "(DE)" in index


def test_the_site_page_of_an_unknown_target_offers_a_check() -> None:
    target = Target("::1", 8443)
    html = pages.site_page(target, None, now=NOW, assets=pages.AssetLinks()).decode()
    assert "Nothing observed yet" in html and 'data-lanes="0"' in html
    assert 'action="/site/%5B%3A%3A1%5D+8443/check"' in html
    assert "<h1 class=\"target\">[::1]:8443</h1>" in html


def test_only_known_check_outcomes_are_announced() -> None:
    html = pages.site_page(TARGET, None, now=NOW, assets=pages.AssetLinks(), checked=HOSTILE)
    assert b"notice" not in html
    html = pages.site_page(TARGET, None, now=NOW, assets=pages.AssetLinks(), checked="refused")
    assert pages.esc(pages.CHECK_OUTCOMES["refused"]).encode() in html


def test_error_pages_cut_and_escape_what_was_asked() -> None:
    html = pages.error_page(
        400, "bad <target>", assets=pages.AssetLinks(), host=HOSTILE * 100, asked=HOSTILE * 100,
    ).decode()
    assert "bad &lt;target&gt;" in html and "<script>alert" not in html
    asked = re.search(r'<code class="asked">(.*?)</code>', html).group(1)  # type: ignore[union-attr]
    assert len(asked) < pages.MAX_ECHO_CHARS * 7 and asked.endswith("…")


def test_headers_carry_the_strict_policy() -> None:
    headers = dict(page_headers((b"Location", b"/x")))
    assert headers[b"Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    policy = CONTENT_SECURITY_POLICY.decode()
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'",
                      "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'",
                      "form-action 'self'"):
        assert directive in policy
    assert "unsafe" not in policy
    assert headers[b"X-Content-Type-Options"] == b"nosniff"
    assert headers[b"Referrer-Policy"] == b"no-referrer"
    assert headers[b"Location"] == b"/x"


def test_assets_ship_with_the_package_and_are_versioned() -> None:
    assets = load_assets()
    css = assets.get(b"/static/notary.css")
    js = assets.get(b"/static/notary.js")
    assert css is not None and js is not None and assets.get(b"/static/../app.py") is None
    assert assets.links.stylesheet == f"/static/notary.css?v={css.etag.decode()}"
    assert b"innerHTML" not in js.body and b"eval(" not in js.body


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [("queries_per_s", 12.345, "12.3"), ("cache_hit_ratio", 0.5, "50.0 %"),
     ("uptime_s", 90061, "1d 1h 1m"), ("uptime_s", 3700, "1h 1m"),
     ("targets_known", 12345, "12,345"), ("probes_per_s", None, "n/a")],
)
def test_figures_are_formatted(key: str, value: float | None, shown: str) -> None:
    assert pages.format_figure(key, value) == shown


def test_figures_between_two_samples() -> None:
    first = {"queries": 100.0, "cache_hits": 30.0, "cache_misses": 10.0, "probes": 20.0,
             "uptime_s": 50.0}
    assert figures_between(None, first, 0) == {
        "queries_per_s": 2.0, "cache_hit_ratio": 0.75, "probes_per_s": 0.4,
        "targets_known": None, "uptime_s": 50.0,
    }
    second = {**first, "queries": 150.0, "probes": 25.0, "targets_known": 7.0, "uptime_s": 60}
    figures = figures_between(first, second, 10.0)
    assert figures["queries_per_s"] == 5.0 and figures["probes_per_s"] == 0.5
    assert figures["cache_hit_ratio"] is None  # no lookups in the interval
    assert figures["targets_known"] == 7.0
    restarted = figures_between(second, {**second, "queries": 10.0}, 10.0)
    assert restarted["queries_per_s"] == 1.0  # a counter that went back counts from 0


@pytest.mark.parametrize("origin, host, fetch_site, cross", [
    (None, b"n.example:4242", None, False),  # curl: neither header
    (b"https://n.example:4242", b"n.example:4242", None, False),
    (b"https://N.Example:4242", b"n.example:4242", None, False),
    (b"https://evil.example", b"n.example:4242", None, True),
    (b"https://n.example:4243", b"n.example:4242", None, True),  # another port
    (b"null", b"n.example:4242", None, True),  # an opaque origin
    (b"https://n.example:4242", None, None, True),
    (None, b"n.example", b"same-origin", False),
    (None, b"n.example", b"none", False),  # typed in by the user
    (b"https://n.example", b"n.example", b"cross-site", True),
    (b"https://a.n.example", b"n.example", b"same-site", True),
])
def test_cross_site_requests_are_recognised(
    origin: bytes | None, host: bytes | None, fetch_site: bytes | None, cross: bool
) -> None:
    assert headers.is_cross_site(origin, host, fetch_site) is cross


@pytest.mark.parametrize(("host", "named"), [
    ("127.0.0.21", "an IP address: no TLSA records, nothing looked up"),
    ("::1", "an IP address: no TLSA records, nothing looked up"),
    ("www.example.test", "_443._tcp.www.example.test"),
])
def test_the_verification_section_names_what_dane_looked_up(host: str, named: str) -> None:
    """An IP literal has no TLSA records and none is looked up (issue 30,
    item 16): the page said ``_443._tcp.127.0.0.21``."""
    from notary.model.dane import DaneOutcome, DaneVerdict, DnssecStatus, TlsaLookup

    dane = DaneVerdict(DaneOutcome.INSECURE, TlsaLookup(DnssecStatus.INSECURE, checked_at=1))
    section = pages.verification_section(Target(host, 443), "perspective", dane)
    assert f"DANE ({named}, checked" in section


def test_the_verification_section_says_how_many_served_certificates_dane_vouches_for() -> None:
    """A split site (issue 31): each certificate judged on its own; the
    records that vouch for one of them are marked, the others are not."""
    from notary.model.dane import (
        DaneJudgement,
        DaneMatch,
        DaneOutcome,
        DaneVerdict,
        DnssecStatus,
        Tlsa,
        TlsaLookup,
    )

    records = tuple(Tlsa(3, 1, 1, bytes([i]) * 32) for i in range(3))
    lookup = TlsaLookup(DnssecStatus.SECURE, records, 300, 1)
    split = DaneVerdict(
        DaneOutcome.MATCH, lookup, DaneMatch(records[0], 0, 0), b"\1" * 32, b"\1" * 20,
        others=(DaneJudgement(b"\2" * 32, b"\2" * 20, DaneMatch(records[2], 2, 0)),
                DaneJudgement(b"\3" * 32, b"\3" * 20)),
    )
    section = pages.verification_section(Target("www.example.test", 443), "dane", split)
    assert ("DANE judged each of the 3 certificates the site serves now: "
            "its records vouch for 2 of them.") in section
    marked = re.findall(r"<li><code>([^<]*)</code>( \(vouches\))?</li>", section)
    assert marked == [(str(records[0]), " (vouches)"), (str(records[1]), ""),
                      (str(records[2]), " (vouches)")]
    single = DaneVerdict(DaneOutcome.MATCH, lookup, DaneMatch(records[1], 1, 0), b"\1" * 32,
                         b"\1" * 20)
    section = pages.verification_section(Target("www.example.test", 443), "dane", single)
    assert "DANE judged each" not in section and section.count("(vouches)") == 1
