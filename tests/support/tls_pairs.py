"""A server and a client TLS context that trust each other (a throwaway
trustme authority, a certificate for ``localhost``): for the tests that run
the notary's TLS streams over socket pairs."""

from __future__ import annotations

import ssl

import trustme


def server_and_client_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    authority = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    authority.issue_cert("localhost").configure_cert(server)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    authority.configure_trust(client)
    return server, client
