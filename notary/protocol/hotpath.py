"""The request path's hot parts (issue 21), compiled or pure: this module
picks ``notary.protocol._fastrequest`` (Cython) or its twin
``notary.protocol._fastrequest_py`` at import time, by the rules of
``notary.extensions`` (``NOTARY_NO_EXTENSIONS``, ``NOTARY_REQUIRE_EXTENSION``).
Both behave the same; the twin's docstrings describe them.
``IMPLEMENTATION`` says which one was chosen: ``"compiled"`` or ``"pure"``.
"""

from __future__ import annotations

from notary.extensions import load

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_HEADERS",
    "DEFAULT_MAX_HEADER_BYTES",
    "IMPLEMENTATION",
    "ConvergenceQueries",
    "Request",
    "RequestReader",
    "browser_headers",
    "first_header",
    "plain_form_fingerprint",
]

_module, IMPLEMENTATION = load("notary.protocol._fastrequest")

DEFAULT_MAX_HEADER_BYTES: int = _module.DEFAULT_MAX_HEADER_BYTES
DEFAULT_MAX_HEADERS: int = _module.DEFAULT_MAX_HEADERS
DEFAULT_MAX_BODY_BYTES: int = _module.DEFAULT_MAX_BODY_BYTES
Request = _module.Request
RequestReader = _module.RequestReader
first_header = _module.first_header
browser_headers = _module.browser_headers
plain_form_fingerprint = _module.plain_form_fingerprint
ConvergenceQueries = _module.ConvergenceQueries
