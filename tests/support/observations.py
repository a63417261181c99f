"""Certificates and probe results for store tests, made locally with trustme."""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from functools import cache

import trustme

from notary.config import StoreConfig
from notary.model.observations import Certificate, ProbeResult, Timeline
from notary.model.targets import Target


@cache
def _ca() -> trustme.CA:
    return trustme.CA()


@cache
def certificate(name: str = "www.example.test") -> Certificate:
    """A leaf certificate for ``name``; the same object for the same name."""
    pem = _ca().issue_cert(name).cert_chain_pems[0].bytes().decode("ascii")
    return Certificate.from_der(ssl.PEM_cert_to_DER_cert(pem))


def probe_result(
    host: str = "www.example.test",
    port: int = 443,
    *,
    cert: str | None = None,
    address: str = "192.0.2.1",
    at: int = 1_700_000_000,
) -> ProbeResult:
    """``host:port`` served the certificate of ``cert`` (default: of ``host``)."""
    leaf = certificate(cert or host)
    return ProbeResult(
        target=Target(host, port), leaf=leaf, chain=(leaf.der,), address=address, observed_at=at
    )


def store_section(**changes: object) -> StoreConfig:
    """The ``[store]`` section with ``changes``; targets are kept for ever
    (no retention) unless ``forget_unasked_after_s`` says otherwise."""
    settings: dict[str, object] = {"forget_unasked_after_s": None, **changes}
    return StoreConfig(**settings)  # type: ignore[arg-type]


def sightings_timeline(
    sightings: Iterable[tuple[str, str, int]],
    host: str = "www.example.test",
    port: int = 443,
) -> Timeline:
    """The timeline of ``host:port`` after probes that saw, for each
    ``(cert, address, at)``, the certificate of the name ``cert`` served
    from ``address`` at ``at`` (Unix seconds): a site served at several
    addresses, built as the prober's results would build it
    (``Timeline.merged``), without a network."""
    timeline = Timeline(Target(host, port))
    for cert, address, at in sightings:
        timeline = timeline.merged(probe_result(host, port, cert=cert, address=address, at=at))
    return timeline
