"""The HTML of the web pages: the notary's identity and live figures
(``/``), a site's certificate timeline (``/site/<host>+<port>``) and error
pages.

Pure functions from values to ``bytes`` (UTF-8). Rule: every string that
did not come from this module (names from the bundle, targets, certificate
fields, addresses, a client's input echoed back) goes through :func:`esc`
(``html.escape`` with quotes) before it is placed in text or in a quoted
attribute; URLs built from targets are percent-encoded first. No inline
script, no ``style`` attribute: the pages work under the strict CSP of
``notary.web.headers``; ``static/notary.js`` adds the live parts when it
runs, and every page is complete without it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from urllib.parse import quote

from notary.model.consistency import Consistency, ConsistencyKind, consistency_of
from notary.model.dane import DaneVerdict
from notary.model.observations import Observation, Timeline
from notary.model.targets import Target, format_convergence_target
from notary.web.certificates import details_of
from notary.web.timeline_svg import chart_lanes, timeline_svg

__all__ = [
    "CHECK_OUTCOMES",
    "FIGURES",
    "AssetLinks",
    "NotaryHost",
    "NotaryProfile",
    "check_path",
    "consistency_badge",
    "error_page",
    "esc",
    "format_figure",
    "index_page",
    "site_page",
    "site_path",
]

#: Longest input echoed back on an error page, in characters.
MAX_ECHO_CHARS = 200
#: The live figures: key in the ``figures`` document -> label.
FIGURES: tuple[tuple[str, str], ...] = (
    ("queries_per_s", "Queries per second"),
    ("cache_hit_ratio", "Cache hit rate"),
    ("probes_per_s", "Probes per second"),
    ("targets_known", "Targets known"),
    ("uptime_s", "Uptime"),
)
#: What a "check now" may report (``?checked=`` only ever shows these).
CHECK_OUTCOMES: Mapping[str, str] = {
    "observed": "Checked just now: the notary observed the site's certificate.",
    "unreachable": "Checked just now: the notary could not observe the site's certificate.",
    "refused": "This notary's policy does not allow probing this site.",
    "limited": "Too many checks: wait a little and try again.",
}


def esc(text: object) -> str:
    """``text`` safe in HTML text and in a quoted attribute value."""
    return escape(str(text), quote=True)


@dataclass(frozen=True, slots=True)
class AssetLinks:
    """Where the page finds its stylesheet and script (with a version
    query, see ``notary.web.assets``)."""

    stylesheet: str = "/static/notary.css"
    script: str = "/static/notary.js"


@dataclass(frozen=True, slots=True)
class NotaryHost:
    """A physical host of the notary, as its bundle pins it."""

    host: str
    ssl_port: int
    http_port: int
    sha1_pin: str
    sha256_pin: str


@dataclass(frozen=True, slots=True)
class NotaryProfile:
    """Who the notary is and what it offers, for ``/``. ``offers`` and
    ``policies``: (what, detail) pairs; ``bundle_href``: None when no
    bundle is served; ``figures_interval_s``: 0 when there are no live
    figures (no WebSocket). ``log_origin`` and ``log_key``: its
    transparency log's origin and verifier key (signed-note vkey; None: no
    log), ``log_witnesses`` the cosigner keys of the witnesses it asks;
    ``witness_key``: its own cosigner key as a witness (None: not one)."""

    name: str
    version: str
    region: str | None = None
    hosts: tuple[NotaryHost, ...] = ()
    v2_key_ids: tuple[str, ...] = ()
    bundle_href: str | None = None
    offers: tuple[tuple[str, str], ...] = ()
    relay: str = "off"
    policies: tuple[tuple[str, str], ...] = ()
    figures_interval_s: float = 0.0
    log_origin: str | None = None
    log_key: str | None = None
    log_witnesses: tuple[str, ...] = ()
    witness_key: str | None = None


def site_path(target: Target) -> str:
    """``/site/<host>+<port>``, percent-encoded."""
    return "/site/" + quote(format_convergence_target(target), safe="+")


def check_path(target: Target) -> str:
    return site_path(target) + "/check"


def when(moment: int | None) -> str:
    if moment is None:
        return "(unknown)"
    try:
        stamp = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "(out of range)"
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def _time(moment: int | None) -> str:
    if moment is None:
        return "(unknown)"
    try:
        iso = datetime.datetime.fromtimestamp(moment, datetime.UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return "(out of range)"
    return f'<time datetime="{esc(iso)}">{esc(when(moment))}</time>'


def format_figure(key: str, value: float | None) -> str:
    """A live figure as shown (``static/notary.js`` formats alike)."""
    if value is None:
        return "n/a"
    if key == "cache_hit_ratio":
        return f"{value * 100:.1f} %"
    if key == "uptime_s":
        minutes = int(value) // 60
        days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
        return f"{days}d {hours}h {minutes}m" if days else f"{hours}h {minutes}m"
    if key == "targets_known":
        return f"{int(value):,}"
    return f"{value:.1f}"


def _page(
    title: str, body: str, *, assets: AssetLinks, page: str, data: Mapping[str, str] = {}
) -> bytes:
    attributes = "".join(f' data-{name}="{esc(value)}"' for name, value in data.items())
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>"
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{esc(assets.stylesheet)}">'
        f'<script src="{esc(assets.script)}" defer></script>'
        f'</head><body data-page="{esc(page)}"{attributes}>'
        '<a class="skip" href="#main">Skip to the content</a>'
        '<header class="top"><a class="brand" href="/">notary</a>'
        '<span class="tagline">a certificate notary</span></header>'
        f'<main id="main">{body}</main>'
        '<footer><p>Answers for machines: <code>/target/&lt;host&gt;+&lt;port&gt;</code> '
        '(Convergence), <code>/v2/query</code>, <code>/v2/key</code>, '
        "<code>/v2/ws</code>.</p></footer>"
        "</body></html>\n"
    ).encode()


def _lookup_form(host: str = "", port: str = "443", *, watch_option: bool = True) -> str:
    watch = (
        '<p class="field-inline"><input type="checkbox" id="lookup-watch" name="watch" '
        'value="1"><label for="lookup-watch">Watch it: show changes live</label></p>'
        if watch_option else ""
    )
    return (
        '<form class="lookup" action="/site" method="get" role="search">'
        '<p class="field"><label for="lookup-host">Site (host name or IP address)</label>'
        f'<input id="lookup-host" name="host" type="text" required maxlength="1024" '
        f'autocomplete="off" spellcheck="false" inputmode="url" '
        f'placeholder="www.example.org" value="{esc(host[:MAX_ECHO_CHARS])}"></p>'
        '<p class="field field-port"><label for="lookup-port">Port</label>'
        f'<input id="lookup-port" name="port" type="text" inputmode="numeric" '
        f'pattern="[0-9]{{1,5}}" maxlength="5" required value="{esc(port[:8])}"></p>'
        f"{watch}"
        '<p><button type="submit">Look up</button></p></form>'
    )


def _pairs(pairs: Sequence[tuple[str, str]]) -> str:
    return "".join(f"<dt>{esc(what)}</dt><dd>{esc(detail)}</dd>" for what, detail in pairs)


def index_page(
    profile: NotaryProfile, figures: Mapping[str, float | None] | None, *, assets: AssetLinks
) -> bytes:
    """``/``: who the notary is, a site lookup, live figures, what it offers."""
    region = f' <span class="region">({esc(profile.region)})</span>' if profile.region else ""
    hosts = "".join(
        f"<tr><th scope=\"row\">{esc(h.host)}</th><td>{h.ssl_port}</td><td>{h.http_port}</td>"
        f'<td><code class="fingerprint">{esc(h.sha1_pin)}</code></td>'
        f'<td><code class="fingerprint">{esc(h.sha256_pin)}</code></td></tr>'
        for h in profile.hosts
    )
    identity = (
        '<div class="table-scroll"><table class="hosts"><caption>Hosts and the certificates '
        "clients pin</caption><thead><tr><th scope=\"col\">Host</th><th scope=\"col\">"
        'HTTPS port</th><th scope="col">Relay port</th><th scope="col">SHA-1 pin</th>'
        f'<th scope="col">SHA-256</th></tr></thead><tbody>{hosts}</tbody></table></div>'
        if hosts else "<p>This notary serves no bundle, so it publishes no pins here.</p>"
    )
    keys = "".join(f'<li><code class="fingerprint">{esc(k)}</code></li>' for k in profile.v2_key_ids)
    keys_html = (
        f'<h3>Ed25519 signing keys (v2)</h3><ul class="keys">{keys}</ul>'
        '<p><a href="/v2/key">The keys with their validity (JSON)</a></p>' if keys else ""
    ) + _log_keys(profile)
    bundle = (
        f'<p><a class="button" href="{esc(profile.bundle_href)}" download>'
        "Download the bundle</a> <span class=\"hint\">(<code>"
        f"{esc(profile.bundle_href.rsplit('/', 1)[-1])}</code>: add it to a Convergence "
        "client or <code>notary check</code>)</span></p>"
        if profile.bundle_href else ""
    )
    live = profile.figures_interval_s > 0
    figures_html = "".join(
        f'<div class="figure"><dt>{esc(label)}</dt><dd data-figure="{esc(key)}">'
        f"{esc(format_figure(key, (figures or {}).get(key)))}</dd></div>"
        for key, label in FIGURES
    )
    live_note = (
        f"Updated every {profile.figures_interval_s:g} s over the WebSocket while this "
        "page is open." if live else "Figures at the time the page was made."
    )
    body = (
        f'<section class="identity" aria-labelledby="name"><h1 id="name">{esc(profile.name)}'
        f"{region}</h1><p class=\"lead\">A certificate notary: it tells which certificate a "
        "site serves, seen from here, and since when. Compare its answers with other "
        f"notaries' before trusting a certificate.</p>{bundle}{identity}{keys_html}</section>"
        '<section aria-labelledby="lookup-title"><h2 id="lookup-title">Look up a site</h2>'
        f"{_lookup_form()}</section>"
        '<section aria-labelledby="figures-title"><h2 id="figures-title">Live figures</h2>'
        f'<dl class="figures" id="figures">{figures_html}</dl>'
        f'<p class="hint" id="figures-status" role="status" aria-live="polite">{live_note}</p>'
        "</section>"
        '<section aria-labelledby="offers-title"><h2 id="offers-title">What it offers</h2>'
        f'<dl class="pairs">{_pairs(profile.offers)}'
        f"<dt>Relay</dt><dd>{esc(profile.relay)}</dd></dl>"
        f'<h3>Policies</h3><dl class="pairs">{_pairs(profile.policies)}</dl></section>'
    )
    data = {"figures-interval": f"{profile.figures_interval_s:g}"} if live else {}
    return _page(f"{profile.name} — notary", body, assets=assets, page="index", data=data)


def _log_keys(profile: NotaryProfile) -> str:
    """The transparency log's origin and verifier key, the witnesses it
    asks, and the notary's own witness key: what a client checks the log
    and its cosignatures with (its bundle pins the log's)."""
    html = ""
    if profile.log_origin is not None and profile.log_key is not None:
        witnesses = "".join(
            f'<li><code class="fingerprint">{esc(w)}</code></li>' for w in profile.log_witnesses
        )
        html += (
            '<h3>Transparency log</h3><dl class="pairs">'
            f"<dt>Origin</dt><dd><code>{esc(profile.log_origin)}</code></dd>"
            "<dt>Verifier key (signed-note vkey of its checkpoints)</dt>"
            f'<dd><code class="fingerprint">{esc(profile.log_key)}</code></dd>'
            "<dt>Witnesses it asks to cosign</dt><dd>"
            + (f'<ul class="keys">{witnesses}</ul>' if witnesses else "none") + "</dd></dl>"
            '<p><a href="/v2/log/checkpoint">Its newest checkpoint</a></p>'
        )
    if profile.witness_key is not None:
        html += (
            '<h3>As a witness</h3><dl class="pairs">'
            "<dt>Cosigner key (vkey of its cosignatures)</dt>"
            f'<dd><code class="fingerprint">{esc(profile.witness_key)}</code></dd></dl>'
        )
    return html


def site_page(
    target: Target,
    timeline: Timeline | None,
    *,
    now: int,
    assets: AssetLinks,
    checked: str | None = None,
    watch: bool = False,
    live: bool = False,
    backend: str | None = None,
    dane: DaneVerdict | None = None,
    fresh_for_s: int | None = None,
) -> bytes:
    """``/site/<host>+<port>``: the certificate timeline of ``target`` and
    the details of each certificate. ``checked``: a key of
    :data:`CHECK_OUTCOMES` to announce (others are ignored); ``watch``: the
    live watch starts on; ``live``: the notary has a WebSocket to watch
    with. ``backend``: which backend decides the target's answers, on a
    notary running DANE (None: it does not, nothing is said), with the
    target's DANE verdict ``dane``. ``fresh_for_s``: the notary's
    ``[answers] fresh_for_s``, which makes the current set (docs/v2.md, S8):
    its certificates are marked, and a split or rotating site gets a badge
    (None: neither)."""
    key = target.key
    notice = CHECK_OUTCOMES.get(checked or "")
    notice_html = f'<p class="notice">{esc(notice)}</p>' if notice else ""
    watch_html = (
        '<p class="field-inline watch" hidden><input type="checkbox" id="watch"'
        f'{" checked" if watch else ""}><label for="watch">Watch: show changes live</label></p>'
        if live else ""
    )
    body = (
        '<nav class="crumbs" aria-label="Breadcrumb"><a href="/">This notary</a> &rsaquo; site</nav>'
        f'<h1 class="target">{esc(key)}</h1>{notice_html}'
        '<div class="actions">'
        f'<form id="check-form" method="post" action="{esc(check_path(target))}">'
        '<button type="submit">Check now</button></form>'
        f"{watch_html}</div>"
        '<p class="hint" id="live-status" role="status" aria-live="polite"></p>'
        f"{verification_section(target, backend, dane)}"
        f"{history_section(target, timeline, now=now, fresh_for_s=fresh_for_s)}"
    )
    data = {"host": target.host, "port": str(target.port)}
    return _page(f"{key} — notary", body, assets=assets, page="site", data=data)


#: What each DANE outcome means, for the site page.
DANE_OUTCOMES = {
    "match": "its DNSSEC-signed TLSA records vouch for a certificate the notary saw",
    "mismatch": "its DNSSEC-signed TLSA records vouch for none of the certificates it served",
    "no-tlsa": "it publishes no TLSA records (DNSSEC proves there are none)",
    "insecure": "its DNS zone is not signed, so TLSA records cannot be trusted",
    "bogus": "its DNS answers failed DNSSEC validation: nothing is vouched for",
    "resolver-failure": "the notary's validating resolver did not answer",
}


def verification_section(target: Target, backend: str | None, dane: DaneVerdict | None) -> str:
    """The ``#verification`` section of a site page on a notary running
    DANE: which backend decides, and the DANE evidence (empty when the
    notary does not run DANE)."""
    if backend is None:
        return ""
    decides = (
        "DANE decides this site's answers." if backend == "dane"
        else "The network perspective (what this notary sees over time) decides this "
        "site's answers."
    )
    if dane is None:
        evidence = "<p>DANE: not checked since the notary started; a check will look.</p>"
    else:
        vouching = {j.matched.index for j in dane.judgements if j.matched is not None}
        records = "".join(
            f'<li><code>{esc(record)}</code>{" (vouches)" if index in vouching else ""}</li>'
            for index, record in enumerate(dane.lookup.records)
        )
        judged = dane.judgements
        several = ""
        if len(judged) > 1:  # a site serving several certificates at once
            vouched = sum(1 for j in judged if j.matched is not None)
            several = (
                f"<p>DANE judged each of the {len(judged)} certificates the site serves now: "
                f"its records vouch for {vouched} of them.</p>"
            )
        looked_up = (
            "an IP address: no TLSA records, nothing looked up" if target.is_ip_literal
            else f"_{target.port}._tcp.{target.host}"
        )
        evidence = (
            f"<p>DANE ({esc(looked_up)}, checked "
            f"{esc(when(dane.lookup.checked_at))}): {esc(dane.outcome.value)}: "
            f"{esc(DANE_OUTCOMES[dane.outcome.value])}.</p>{several}"
            + (f'<ul class="tlsa">{records}</ul>' if records else "")
        )
    return (
        '<section id="verification" aria-labelledby="verification-title">'
        f'<h2 id="verification-title">Verification</h2><p>{esc(decides)}</p>{evidence}'
        "</section>"
    )


#: What a split or rotating site's badge says, after its name.
CONSISTENCY_BADGES = {
    ConsistencyKind.SPLIT: (
        "Split site", "each address serves its own certificate. This notary vouches for "
        "each of them: a client that sees any one of them gets a match."
    ),
    ConsistencyKind.ROTATING: (
        "Rotating site", "an address served more than one of them (one per connection, or "
        "a new certificate spreading across the addresses). This notary vouches for each "
        "of them: a client that sees any one of them gets a match."
    ),
}


def consistency_badge(consistency: Consistency | None) -> str:
    """The badge of a split or rotating site ("" for a stable one, or when
    the current set is not known): its name, how many certificates at how
    many addresses, and what the notary's answers mean for it. Text, not
    colour alone, says which it is."""
    if consistency is None or consistency.kind not in CONSISTENCY_BADGES:
        return ""
    name, meaning = CONSISTENCY_BADGES[consistency.kind]
    certificates, addresses = consistency.certificates, len(consistency.addresses)
    served = (
        f"{certificates} certificate{'s' if certificates != 1 else ''} served at once from "
        f"{addresses} address{'es' if addresses != 1 else ''}"
    )
    return (
        f'<p class="badge badge-{esc(consistency.kind.value)}" id="consistency" '
        f'data-kind="{esc(consistency.kind.value)}" data-certificates="{certificates}" '
        f'data-addresses="{addresses}"><strong class="badge-name">{esc(name)}</strong>: '
        f"{esc(served)}; {esc(meaning)}</p>"
    )


def history_section(
    target: Target, timeline: Timeline | None, *, now: int, fresh_for_s: int | None = None
) -> str:
    """The ``#history`` section of a site page (the part a live update
    replaces): the badge of a split or rotating site, summary, chart and
    certificate details, the current set's certificates marked (with
    ``fresh_for_s``: see :func:`site_page`)."""
    if timeline is None or not timeline.observations:
        return (
            '<section id="history" aria-labelledby="history-title" data-lanes="0">'
            '<h2 id="history-title">History</h2><p class="empty">Nothing observed yet for '
            f"{esc(target.key)}. Use “Check now” to have the notary look.</p></section>"
        )
    consistency = (
        consistency_of(timeline, now=now, fresh_for_s=fresh_for_s)
        if fresh_for_s is not None else None
    )
    current = frozenset(consistency.current) if consistency is not None else frozenset()
    lanes = chart_lanes(timeline)
    start = min(o.first_seen for o in lanes)
    end = max(now, max(o.last_seen for o in lanes))
    pad = max((end - start) // 50, 60)
    chart = timeline_svg(
        timeline, start=start - pad, end=end + pad,
        label=f"Certificates observed for {target.key} over time", current=current,
    )
    left_out = ""
    if chart.lanes_left_out or chart.runs_left_out:
        left_out = (
            f'<p class="hint">Shown: the {chart.lanes} certificates seen most recently and '
            f"their latest runs; {chart.lanes_left_out} older certificates and "
            f"{chart.runs_left_out} older runs are not shown.</p>"
        )
    summary = (
        f"{chart.lanes} certificate{'s' if chart.lanes != 1 else ''} in "
        f"{chart.runs} run{'s' if chart.runs != 1 else ''} of sightings, from "
        f"{when(start)} to {when(max(o.last_seen for o in lanes))}."
    )
    items = "".join(
        _certificate_item(index, observation, current=(
            observation.certificate.sha256 in current if consistency is not None else None
        ))
        for index, observation in enumerate(lanes)
    )
    kind = (
        f' data-consistency="{esc(consistency.kind.value)}"' if consistency is not None else ""
    )
    marked = (
        " Lanes in bold are the certificates served now (seen within the notary's "
        "freshness window)." if consistency is not None else ""
    )
    return (
        f'<section id="history" aria-labelledby="history-title" data-lanes="{chart.lanes}" '
        f'data-runs="{chart.runs}"{kind}><h2 id="history-title">History</h2>'
        f"{consistency_badge(consistency)}"
        f'<p class="summary">{esc(summary)}</p>'
        f'<figure class="chart">{chart.svg}<figcaption class="hint">One lane per certificate '
        "(oldest on top), labelled with the addresses that served it; one bar per run of "
        "sightings; a gap means the site served another certificate, or was not observed, "
        f"meanwhile.{marked}</figcaption></figure>"
        f'{left_out}<h2>Certificates</h2><ol class="certificates">{items}</ol></section>'
    )


def _certificate_item(index: int, observation: Observation, current: bool | None = None) -> str:
    """A certificate's entry in the list; ``current``: whether it is in the
    current set (None: not known, nothing said)."""
    certificate = observation.certificate
    details = details_of(certificate)
    runs = "".join(
        f"<li>{_time(start)} &ndash; {_time(end)}</li>"
        for start, end in sorted(observation.timespans)[-20:]
    )
    addresses = ", ".join(esc(a) for a in observation.addresses) or "(none recorded)"
    names = ", ".join(esc(n) for n in details.names) or "(none)"
    tag = ""
    if current is not None:
        tag = (
            ' <span class="tag tag-current">served now</span>' if current
            else ' <span class="tag">not served now</span>'
        )
    return (
        f'<li class="certificate lane-{index % 6}{" current" if current else ""}" '
        f'id="cert-{certificate.sha256.hex()[:16]}">'
        f"<h3>Certificate #{index + 1}{tag}</h3><dl class=\"pairs\">"
        f"<dt>Subject</dt><dd>{esc(details.subject)}</dd>"
        f"<dt>Issuer</dt><dd>{esc(details.issuer)}</dd>"
        f"<dt>Names</dt><dd>{names}</dd>"
        f"<dt>Valid</dt><dd>{_time(details.not_before)} &ndash; {_time(details.not_after)}</dd>"
        f"<dt>Key</dt><dd>{esc(details.key_type)}</dd>"
        f"<dt>First seen</dt><dd>{_time(observation.first_seen)}</dd>"
        f"<dt>Last seen</dt><dd>{_time(observation.last_seen)}</dd>"
        f"<dt>Runs (latest 20)</dt><dd><ul class=\"runs\">{runs}</ul></dd>"
        f"<dt>Served from</dt><dd>{addresses}</dd>"
        f'<dt>SHA-256</dt><dd><code class="fingerprint">{esc(details.sha256)}</code></dd>'
        f'<dt>SPKI SHA-256</dt><dd><code class="fingerprint">{esc(details.spki_sha256)}</code></dd>'
        f'<dt>SHA-1</dt><dd><code class="fingerprint">{esc(details.sha1)}</code></dd>'
        f"<dt>Serial</dt><dd><code>{esc(details.serial)}</code></dd>"
        "</dl></li>"
    )


def error_page(
    status: int, message: str, *, assets: AssetLinks, host: str = "", port: str = "443",
    asked: str | None = None,
) -> bytes:
    """An error page with ``message`` and the lookup form, refilled with
    ``host`` and ``port``; ``asked``: the raw input to show back (cut to
    :data:`MAX_ECHO_CHARS`)."""
    echo = ""
    if asked is not None:
        shown = asked[:MAX_ECHO_CHARS] + ("…" if len(asked) > MAX_ECHO_CHARS else "")
        echo = f'<p>You asked for: <code class="asked">{esc(shown)}</code></p>'
    body = (
        f'<h1>{status}: {esc(message)}</h1>{echo}'
        f'<section aria-labelledby="lookup-title"><h2 id="lookup-title">Look up a site</h2>'
        f"{_lookup_form(host, port)}</section>"
    )
    return _page(f"{status} — notary", body, assets=assets, page="error")
