"""The security headers of the web pages and the caching of their assets.

Every HTML answer carries :data:`PAGE_HEADERS`: a strict Content-Security-
Policy (scripts, styles, fetches and WebSockets from this origin only, no
inline script or style, no plug-ins, no framing, forms posting only here),
``nosniff`` and no referrer (a site page's address names the site looked
up). ``connect-src 'self'`` also admits ``wss://`` to this host and port
(CSP Level 3; Chromium checks it in ``tests/test_web_browser.py``).
"""

from __future__ import annotations

from notary.protocol.hotpath import browser_headers

__all__ = [
    "ASSET_CACHE_CONTROL",
    "CONTENT_SECURITY_POLICY",
    "HTML_CONTENT_TYPE",
    "PAGE_HEADERS",
    "asset_headers",
    "is_cross_site",
    "is_cross_site_request",
    "page_headers",
]

CONTENT_SECURITY_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HTML_CONTENT_TYPE = b"text/html; charset=utf-8"
#: Assets are linked with their content hash in the query (``?v=``), so a
#: browser may keep them as long as it likes: a new version has a new URL.
ASSET_CACHE_CONTROL = b"public, max-age=31536000, immutable"

PAGE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"Content-Security-Policy", CONTENT_SECURITY_POLICY),
    (b"X-Content-Type-Options", b"nosniff"),
    (b"Referrer-Policy", b"no-referrer"),
    (b"X-Frame-Options", b"DENY"),
    (b"Cache-Control", b"no-store"),
)


def page_headers(*extra: tuple[bytes, bytes]) -> tuple[tuple[bytes, bytes], ...]:
    """The headers of an HTML answer: :data:`PAGE_HEADERS` and ``extra``."""
    return PAGE_HEADERS + extra


def asset_headers(etag: bytes) -> tuple[tuple[bytes, bytes], ...]:
    """The headers of a static asset whose content hash is ``etag``."""
    return (
        (b"X-Content-Type-Options", b"nosniff"),
        (b"Cache-Control", ASSET_CACHE_CONTROL),
        (b"ETag", b'"' + etag + b'"'),
    )


#: Origins of browser extensions: the user's own agent (a notary client
#: add-on), not another site's page.
EXTENSION_SCHEMES = (b"moz-extension", b"chrome-extension", b"safari-web-extension")


def is_cross_site(origin: bytes | None, host: bytes | None, fetch_site: bytes | None) -> bool:
    """Whether a browser sent this request for another site's page (a form or
    script there posting here): ``Sec-Fetch-Site`` says so (``cross-site``,
    or ``same-site``: another host of the same site), or ``Origin`` names
    another host and port than ``Host`` (``null``: an opaque origin, a
    sandboxed frame or a redirect chain, counts as another). A request with
    neither header (curl, an old browser, the 2011 add-on) is not, nor one
    from a browser extension (``EXTENSION_SCHEMES``): the check is a
    defence for visitors' browsers, not an authentication."""
    if fetch_site is not None:
        return fetch_site.strip().lower() in (b"cross-site", b"same-site")
    if origin is None:
        return False
    scheme, found, authority = origin.strip().lower().partition(b"://")
    if not found or host is None:
        return True
    if scheme in EXTENSION_SCHEMES:
        return False
    return authority.rstrip(b"/") != host.strip().lower()


def is_cross_site_request(headers: tuple[tuple[bytes, bytes], ...]) -> bool:
    """:func:`is_cross_site` for a request's ``headers`` (the first of each),
    in one pass (``browser_headers``, compiled on the request path): the
    query endpoints call it on every request, the cache hit's fast path
    included."""
    found = browser_headers(headers)
    return found is not None and is_cross_site(*found)
