"""The web pages on the HTTPS API listener: routing, and what the pages
need from the query service and the live figures (the rendering is
``notary.web``, pure).

Routes (``WebPages.handles`` says which paths are ours; ``ApiHandler``
routes them here and keeps every other path, and its query fast path, as
before):

* ``GET /``: the notary's identity, a site lookup, live figures, what it
  offers (``/?host=...`` stays the Perspectives query when it is served).
* ``GET /site?host=H&port=P[&watch=1]``: the lookup form; 303 to the
  site's page, or a 400 page naming the problem.
* ``GET /site/<host>+<port>``: the site's certificate timeline; a target
  normalised as in the Convergence path (``notary.model.targets``); 400
  page for a bad one, a page saying nothing was observed for an unknown one.
* ``POST /site/<host>+<port>/check``: "check now" (``QueryService.check_now``):
  JSON ``{"outcome", "message", "target"}`` when the request accepts
  ``application/json`` (the page's script), else 303 back to the page with
  ``?checked=<outcome>``. Over the client's rate: 429 with ``Retry-After``.
  Asked from another site's page (``Origin``, ``Sec-Fetch-Site``): 403.
* ``GET /static/<name>``: the stylesheet and the script.

Every HTML answer carries ``notary.web.headers.PAGE_HEADERS`` (CSP and
friends). A site page costs one query of the client's rate, a check one
query and one probe (``[limits]``), like the protocols' queries.

Error handling: every problem becomes an answer (400, 404, 405, 429, 503
pages); ``WebPages.answer`` raises nothing but cancellation.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from urllib.parse import parse_qsl, unquote

from notary import __version__
from notary.config import Config
from notary.errors import BadTarget, StoreError
from notary.model.ratelimit import RateLimited
from notary.model.targets import Target, make_target, parse_convergence_target
from notary.protocol import bundle as bundle_format
from notary.protocol import tlog
from notary.protocol.http import Request
from notary.service.figures import LiveFigures
from notary.service.query import Answer, QueryService
from notary.web import pages
from notary.web.assets import STATIC_PREFIX, StaticAssets, load_assets
from notary.web.headers import HTML_CONTENT_TYPE, asset_headers, is_cross_site, page_headers
from notary.web.pages import CHECK_OUTCOMES, NotaryHost, NotaryProfile

__all__ = ["SITE_PREFIX", "WebPages", "notary_profile"]

SITE_PREFIX = b"/site/"
LOOKUP_PATH = b"/site"
CHECK_SUFFIX = b"/check"
#: Longest raw ``host+port`` segment looked at (as ``/target/``).
MAX_SEGMENT_BYTES = 1024
#: Most fields read from a query string.
MAX_QUERY_FIELDS = 8
JSON_CONTENT_TYPE = b"application/json"

#: Read at import: before a worker drops its privileges (``notary.web.assets``).
ASSETS = load_assets()


def notary_profile(
    config: Config,
    *,
    bundle_bytes: bytes | None,
    bundle_path: str | None,
    v2_key_id: str | None,
    relay_mode: str | None,
    figures_interval_s: float,
    api_ports: Sequence[int] = (),
    perspectives_ports: Sequence[int] = (),
    v2_public_raw: bytes | None = None,
) -> NotaryProfile:
    """Who the notary is (its bundle: name, region, hosts and pins; its
    log's and witness's keys, made from ``config`` and the v2 public key
    ``v2_public_raw``) and what it offers (from ``config``; the ports it is
    bound to when given, else the configured ones), for ``/``."""
    name: str = "Certificate notary (no bundle served)"
    region: str | None = None
    hosts: tuple[NotaryHost, ...] = ()
    if bundle_bytes is not None:
        name, region, hosts = _identity(bundle_bytes)
    api = ", ".join(str(p) for p in api_ports or [e.port for e in config.server.api])
    offers = [("Convergence (2011)", f"GET/POST /target/<host>+<port> on ports {api}")]
    if config.perspectives.key_file is not None:
        ports = ", ".join(
            str(p) for p in perspectives_ports or [e.port for e in config.perspectives.listen]
        )
        offers.append(("Perspectives (2008)", f"GET /?host=&port=&service_type=2 on port "
                       f"{ports or 'none'} and the API ports"))
    if v2_key_id is not None:
        offers.append(("v2 API (Ed25519)", "POST /v2/query, GET /v2/key, WebSocket /v2/ws "
                       "(queries, watches, live figures)"))
    relay = "off"
    if relay_mode is not None:
        relay = {
            "bundles": "bounce relay to the hosts of the operator's trusted bundles",
            "public": "bounce relay to port 4242 of any allowed host",
        }.get(relay_mode, relay_mode)
    limits = config.limits
    policies = (
        ("Fresh for", _duration(config.answers.fresh_for_s)
         + ": an observation this recent answers without a new probe"),
        ("Probe again after", _duration(config.answers.reprobe_after_s) + " at the earliest"),
        ("Runs merge within", _duration(config.store.merge_window_s)),
        ("Rescanning", f"on, up to {config.rescan.probes_per_s:g} probes/s"
         if config.rescan.enabled else "off"),
        ("Query rate", f"{limits.queries_per_s_per_prefix:g}/s per client network "
         f"(burst {limits.query_burst})"),
        ("On-demand probes", f"{limits.probes_per_s_per_prefix:g}/s per client network, "
         f"{limits.probes_per_minute_per_target} per minute per site"),
        ("Targets probed", "public addresses only" if not config.server.allow_targets
         else "public addresses and " + ", ".join(config.server.allow_targets)),
    )
    log = config.log.bundle_log(v2_public_raw) if v2_public_raw is not None else None
    witness = config.witness
    return NotaryProfile(
        log_origin=log.origin if log is not None else None,
        log_key=log.key if log is not None else None,
        log_witnesses=log.witnesses if log is not None else (),
        witness_key=tlog.cosigner_key(witness.name, v2_public_raw)
        if witness.enabled and v2_public_raw is not None else None,
        name=name,
        version=__version__,
        region=region,
        hosts=hosts,
        v2_key_ids=(v2_key_id,) if v2_key_id is not None else (),
        bundle_href=bundle_path,
        offers=tuple(offers),
        relay=relay,
        policies=policies,
        figures_interval_s=figures_interval_s,
    )


def _identity(bundle_bytes: bytes) -> tuple[str, str | None, tuple[NotaryHost, ...]]:
    """Name, region and hosts (with pins) of a served bundle."""
    parsed = bundle_format.parse_bundle(bundle_bytes)
    hosts = tuple(
        NotaryHost(h.host, h.ssl_port, h.http_port, h.sha1_pin, _sha256_pin(h.certificate_pem))
        for h in parsed.hosts
    )
    return parsed.name, parsed.region, hosts


def _sha256_pin(certificate_pem: str) -> str:
    lines = [line for line in certificate_pem.splitlines() if line and "-----" not in line]
    der = base64.b64decode("".join(lines))
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


class WebPages:
    """Serves the pages for one notary (see the module docstring).

    ``profile``: the identity shown on ``/`` (``notary_profile``);
    ``figures``: the live figures (None: none, and no live updates);
    ``live``: the notary has a WebSocket (watches). ``clock``: Unix seconds,
    for the chart's right edge. ``fresh_for_s``: ``[answers] fresh_for_s``,
    what a site page counts as served now (its current set: the badge of a
    split or rotating site).

    Resource handling: borrows the query service and the figures; the
    static assets are read once, when this module is imported."""

    def __init__(
        self,
        service: QueryService,
        profile: NotaryProfile,
        *,
        figures: LiveFigures | None = None,
        live: bool = False,
        clock: Callable[[], float] = time.time,
        assets: StaticAssets | None = None,
        fresh_for_s: int = 86400,
    ) -> None:
        self._service = service
        self._fresh_for_s = fresh_for_s
        self.profile = profile
        #: The live figures (None: none).
        self.figures = figures
        self._live = live
        self._clock = clock
        self._assets = assets or ASSETS

    def use_bundle(self, bundle_bytes: bytes) -> None:
        """Show the identity of a new served bundle (read and validated by
        the caller, as on reload)."""
        name, region, hosts = _identity(bundle_bytes)
        self.profile = replace(self.profile, name=name, region=region, hosts=hosts)

    @staticmethod
    def handles(path: bytes) -> bool:
        """Whether ``path`` is a page or asset of ours (``/`` included)."""
        return (
            path == b"/" or path == LOOKUP_PATH or path.startswith(SITE_PREFIX)
            or path.startswith(STATIC_PREFIX.encode())
        )

    async def answer(
        self, request: Request, path: bytes, query: bytes, client: bytes | None
    ) -> Answer:
        """The answer to a request for one of our paths: (status, body,
        content type, extra headers)."""
        method = request.method
        if path.startswith(SITE_PREFIX) and path.endswith(CHECK_SUFFIX):
            if method != b"POST":
                return self._error(405, "use POST to ask for a check", allow=b"POST")
            return await self._check(request, path[len(SITE_PREFIX):-len(CHECK_SUFFIX)], client)
        if method != b"GET":
            return self._error(405, "method not allowed", allow=b"GET")
        if path == b"/":
            figures = await self.figures.current() if self.figures is not None else None
            links = self._assets.links
            return self._page(200, pages.index_page(self.profile, figures, assets=links))
        if path == LOOKUP_PATH:
            return self._lookup(query)
        if path.startswith(SITE_PREFIX):
            return await self._site(path[len(SITE_PREFIX):], query, client)
        asset = self._assets.get(path)
        if asset is None:
            return self._error(404, "no such file")
        return Answer(200, asset.body, asset.content_type, asset_headers(asset.etag))

    # -- pages

    def _page(self, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> Answer:
        return Answer(status, body, HTML_CONTENT_TYPE, page_headers(*extra))

    def _error(
        self, status: int, message: str, *, allow: bytes | None = None,
        host: str = "", port: str = "443", asked: str | None = None,
        extra: tuple[tuple[bytes, bytes], ...] = (),
    ) -> Answer:
        headers = ((b"Allow", allow),) if allow is not None else ()
        body = pages.error_page(
            status, message, assets=self._assets.links, host=host, port=port, asked=asked
        )
        return self._page(status, body, *headers, *extra)

    def _lookup(self, query: bytes) -> Answer:
        try:
            fields = dict(parse_qsl(
                query.decode("utf-8"), max_num_fields=MAX_QUERY_FIELDS, errors="strict"
            ))
        except (UnicodeDecodeError, ValueError):
            return self._error(400, "the form's fields could not be read")
        host, port = fields.get("host", "").strip(), fields.get("port", "443").strip() or "443"
        try:
            target = make_target(host, port)
        except BadTarget as exc:
            return self._error(400, exc.message, host=host, port=port, asked=f"{host} port {port}")
        location = pages.site_path(target) + ("?watch=1" if fields.get("watch") == "1" else "")
        return Answer(
            303, b"", HTML_CONTENT_TYPE, page_headers((b"Location", location.encode("ascii")))
        )

    async def _site(self, segment: bytes, query: bytes, client: bytes | None) -> Answer:
        parsed = self._target(segment)
        if not isinstance(parsed, Target):
            return parsed
        try:
            fields = dict(parse_qsl(query.decode("ascii"), max_num_fields=MAX_QUERY_FIELDS))
        except (UnicodeDecodeError, ValueError):
            fields = {}
        try:
            record = await self._service.record_of(parsed, client)
        except RateLimited as exc:
            return self._error(429, "too many requests; retry later", extra=(
                (b"Retry-After", b"%d" % exc.retry_after_s),))
        except StoreError:
            return self._error(503, "the observation store cannot be read now; retry later")
        body = pages.site_page(
            parsed, record.timeline if record is not None else None, now=int(self._clock()),
            assets=self._assets.links, checked=fields.get("checked"),
            watch=fields.get("watch") == "1", live=self._live,
            backend=self._service.backend_of(record),
            dane=record.dane if record is not None else None,
            fresh_for_s=self._fresh_for_s,
        )
        return self._page(200, body)

    async def _check(self, request: Request, segment: bytes, client: bytes | None) -> Answer:
        if is_cross_site(
            request.header(b"origin"), request.header(b"host"), request.header(b"sec-fetch-site")
        ):
            # Another site's page must not make its visitors' browsers spend
            # their probe budget here (CSRF); our own page's requests pass.
            return self._error(403, "checks are asked from this notary's own page")
        wants_json = JSON_CONTENT_TYPE in (request.header(b"accept") or b"")
        parsed = self._target(segment)
        if not isinstance(parsed, Target):
            return parsed
        try:
            outcome = await self._service.check_now(parsed, client)
        except RateLimited as exc:
            retry = ((b"Retry-After", b"%d" % exc.retry_after_s),)
            if wants_json:
                return Answer(429, _json(parsed, "limited"), JSON_CONTENT_TYPE, retry)
            return self._error(429, "too many checks; retry later", extra=retry)
        if wants_json:
            return Answer(200, _json(parsed, outcome), JSON_CONTENT_TYPE, (
                (b"Cache-Control", b"no-store"), (b"X-Content-Type-Options", b"nosniff"),
            ))
        location = f"{pages.site_path(parsed)}?checked={outcome}"
        return Answer(
            303, b"", HTML_CONTENT_TYPE, page_headers((b"Location", location.encode("ascii")))
        )

    def _target(self, segment: bytes) -> Target | Answer:
        """The target a raw ``host+port`` segment names, or the 400 page."""
        if len(segment) > MAX_SEGMENT_BYTES:
            return self._error(400, "target too long")
        try:
            text = unquote(segment.decode("ascii"), errors="strict")
        except (UnicodeDecodeError, ValueError):
            return self._error(400, "target is not valid percent-encoded UTF-8")
        try:
            return parse_convergence_target(text)
        except BadTarget as exc:
            host, _, port = text.rpartition("+")
            return self._error(400, exc.message, host=host or text, port=port or "443", asked=text)


def _json(target: Target, outcome: str) -> bytes:
    return json.dumps({
        "message": CHECK_OUTCOMES.get(outcome, outcome),
        "outcome": outcome,
        "target": target.key,
    }, sort_keys=True).encode()
