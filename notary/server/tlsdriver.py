"""The HTTPS listeners' TLS driver, compiled or pure (issue 35): this module
picks ``notary.server._fasttls`` (Cython over OpenSSL's own API) or its twin
``notary.server._fasttls_py`` (Python's ``ssl.SSLSocket``) at import time,
by the rules of ``notary.extensions`` (``NOTARY_NO_EXTENSIONS``,
``NOTARY_REQUIRE_EXTENSION``). Both behave the same; the twin's docstrings
describe them. ``IMPLEMENTATION`` says which one was chosen.
"""

from __future__ import annotations

from notary.extensions import load

__all__ = ["IMPLEMENTATION", "WANT_READ", "WANT_WRITE", "Connection", "ServerContext"]

_module, IMPLEMENTATION = load("notary.server._fasttls")

ServerContext = _module.ServerContext
Connection = _module.Connection
WANT_READ: int = _module.WANT_READ
WANT_WRITE: int = _module.WANT_WRITE
