"""A world for the client's tests, on loopback: a site on 127.0.0.1, an
impostor serving its own certificate for the same name on 127.0.0.5 (same
port), and three notaries on 127.0.0.1-3, the third one's route to the
site leading to the impostor (``open_world``); the bundle that pins one
notary (``bundle_of``); and ``notary.client.check`` of the site, its name
resolved by a static resolver (``run_check``). Every server stops when the
world's block exits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from notary.client import check as client
from notary.model.targets import Target
from notary.protocol.bundle import Bundle, BundleHost, make_bundle
from notary.state import crypto
from tests.support.notaries import NotaryUnderTest, open_notary
from tests.support.tls_targets import open_tls_target, static_resolver

SITE = "site.example.test"
MITM_HOST = "127.0.0.5"
NOTARY_HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def bundle_of(notary: NotaryUnderTest, name: str) -> Bundle:
    host = notary.running.api[0].host
    pem = crypto.certificate_pem(notary.certificate).decode("ascii")
    relay_port = notary.running.relay[0].port if notary.running.relay else 80
    return make_bundle(
        name=name,
        location=f"https://{host}/{name}.notary",
        hosts=[BundleHost(host, notary.port, relay_port, pem)],
    )


@asynccontextmanager
async def open_world(tmp_path: Path, *, with_v2: bool = False) -> AsyncIterator[tuple[object, list[NotaryUnderTest]]]:
    """The site on 127.0.0.1, an impostor on 127.0.0.5 (same port, its own
    certificate for the same name), and three notaries: the third one's route
    to the site leads to the impostor."""
    async with AsyncExitStack() as stack:
        site = await stack.enter_async_context(open_tls_target(names=[SITE]))
        await stack.enter_async_context(
            open_tls_target(names=[SITE], host=MITM_HOST, port=site.port)
        )
        notaries = []
        for index, host in enumerate(NOTARY_HOSTS):
            route = MITM_HOST if index == 2 else site.host
            sections = {}
            if with_v2:
                key_path = tmp_path / f"v2-{index}.key"
                crypto.write_ed25519_private_key(key_path, crypto.generate_ed25519_key())
                sections["v2"] = {"key_file": key_path}
            notaries.append(await stack.enter_async_context(
                open_notary(tmp_path / f"n{index}", host=host, names={SITE: [route]}, **sections)
            ))
        yield site, notaries


async def run_check(site, bundles, **options) -> client.CheckReport:
    options.setdefault("relay", None)
    options.setdefault("timeout_s", 10.0)
    return await client.check(
        Target(SITE, site.port), bundles, resolver=static_resolver({SITE: [site.host]}),
        **options,
    )
