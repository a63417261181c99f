"""What a notary saw: certificates, probe results and per-target timelines.

Pure values and pure functions (no I/O, no clock): the store persists them, the
cache holds them, the protocol modules serialise them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from notary.protocol.targets import Target

#: How many distinct addresses are remembered per observation (newest first).
MAX_ADDRESSES_PER_OBSERVATION = 8


@dataclass(frozen=True, slots=True)
class Certificate:
    """A leaf certificate as DER plus the hashes every protocol needs."""

    der: bytes
    sha1: bytes
    sha256: bytes
    md5: bytes
    spki_sha256: bytes

    @classmethod
    def from_der(cls, der: bytes) -> Certificate:
        """Hash ``der``. Raises ``ValueError`` if it is not a certificate."""
        cert = x509.load_der_x509_certificate(der)
        spki = cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return cls(
            der=der,
            sha1=hashlib.sha1(der).digest(),
            sha256=hashlib.sha256(der).digest(),
            md5=hashlib.md5(der).digest(),
            spki_sha256=hashlib.sha256(spki).digest(),
        )


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One successful probe: ``target`` served ``leaf`` (and ``chain``, the
    DER of every certificate it sent, leaf first) from ``address`` at
    ``observed_at`` (Unix seconds)."""

    target: Target
    leaf: Certificate
    chain: tuple[bytes, ...]
    address: str
    observed_at: int


@dataclass(frozen=True, slots=True)
class Observation:
    """A certificate seen for a target from ``first_seen`` to ``last_seen``."""

    certificate: Certificate
    first_seen: int
    last_seen: int
    addresses: tuple[str, ...] = ()

    def is_fresh(self, now: int, fresh_for_s: int) -> bool:
        return self.last_seen >= now - fresh_for_s


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every certificate observed for one target, newest ``last_seen`` first."""

    target: Target
    observations: tuple[Observation, ...] = field(default=())

    def __post_init__(self) -> None:
        ordered = tuple(
            sorted(
                self.observations,
                # sha256 makes the order total: equal times still give one
                # order, hence one signed answer.
                key=lambda o: (o.last_seen, o.first_seen, o.certificate.sha256),
                reverse=True,
            )
        )
        object.__setattr__(self, "observations", ordered)

    def find_sha1(self, sha1: bytes) -> Observation | None:
        for observation in self.observations:
            if observation.certificate.sha1 == sha1:
                return observation
        return None

    @property
    def newest(self) -> Observation | None:
        return self.observations[0] if self.observations else None

    def merged(self, result: ProbeResult) -> Timeline:
        """The timeline after ``result``: the seen certificate's ``last_seen``
        moves forward (never back), its address is remembered, or a new
        observation starts."""
        sha256 = result.leaf.sha256
        kept = []
        found = None
        for observation in self.observations:
            if observation.certificate.sha256 == sha256:
                found = observation
            else:
                kept.append(observation)
        if found is None:
            updated = Observation(
                certificate=result.leaf,
                first_seen=result.observed_at,
                last_seen=result.observed_at,
                addresses=(result.address,),
            )
        else:
            addresses = (result.address, *tuple(a for a in found.addresses if a != result.address))
            updated = replace(
                found,
                first_seen=min(found.first_seen, result.observed_at),
                last_seen=max(found.last_seen, result.observed_at),
                addresses=addresses[:MAX_ADDRESSES_PER_OBSERVATION],
            )
        return Timeline(self.target, (updated, *kept))
