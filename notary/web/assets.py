"""The static assets of the web pages (``notary/web/static/``), read once
from the installed package and served from memory.

Only the files named in :data:`ASSET_TYPES` are served, so a request path
never reaches the file system. Each asset has an ETag (a prefix of its
SHA-256) that also versions its URL (``/static/notary.css?v=<etag>``), so
browsers may cache it for good (``notary.web.headers.ASSET_CACHE_CONTROL``).

Resource handling: ``notary.server.web`` calls :func:`load_assets` once,
when it is imported: before a worker drops its privileges (``[node]
user``), after which the package files may not be readable.

Error handling: :func:`load_assets` raises ``FileNotFoundError`` when the
package was installed without its assets (a packaging bug worth failing at
start for).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from notary.web.pages import AssetLinks

__all__ = ["ASSET_TYPES", "STATIC_PREFIX", "Asset", "StaticAssets", "load_assets"]

STATIC_PREFIX = "/static/"
#: Every asset served, with its content type.
ASSET_TYPES: dict[str, bytes] = {
    "notary.css": b"text/css; charset=utf-8",
    "notary.js": b"text/javascript; charset=utf-8",
}


@dataclass(frozen=True, slots=True)
class Asset:
    name: str
    body: bytes
    content_type: bytes
    etag: bytes


@dataclass(frozen=True, slots=True)
class StaticAssets:
    """The assets by URL path (``/static/<name>``) and the page's links."""

    by_path: dict[bytes, Asset]
    links: AssetLinks

    def get(self, path: bytes) -> Asset | None:
        return self.by_path.get(path)


def load_assets() -> StaticAssets:
    """Read every asset of :data:`ASSET_TYPES` from the package."""
    folder = Path(__file__).parent / "static"
    by_path = {}
    for name, content_type in ASSET_TYPES.items():
        body = (folder / name).read_bytes()
        etag = hashlib.sha256(body).hexdigest()[:16].encode("ascii")
        by_path[(STATIC_PREFIX + name).encode("ascii")] = Asset(name, body, content_type, etag)
    css = by_path[b"/static/notary.css"]
    js = by_path[b"/static/notary.js"]
    links = AssetLinks(
        stylesheet=f"{STATIC_PREFIX}{css.name}?v={css.etag.decode()}",
        script=f"{STATIC_PREFIX}{js.name}?v={js.etag.decode()}",
    )
    return StaticAssets(by_path, links)
