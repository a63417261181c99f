"""DANE (RFC 6698, with RFC 7671's operational rules): does a TLSA RRset
vouch for the certificate chain a target presented? Pure: the DNS lookup
and its DNSSEC status are the caller's (issue 20's verifier backend).

Rules this module keeps:

1. Usable records (RFC 7671 section 4.1, RFC 7672 section 2.2): usages
   DANE-TA (2) and DANE-EE (3), selectors Cert (0) and SPKI (1), matching
   types Full (0), SHA2-256 (1) and SHA2-512 (2), the data of the length its
   matching type gives. PKIX-TA (0) and PKIX-EE (1) are *unusable* here: the
   notary exists because CAs can be broken into, so it does not lean on the
   system's CA store; an RRset of only unusable records is as if there were
   none. Unusable records never fail a match.
2. DANE-EE (3): the leaf matches; nothing else is checked (RFC 7671 section
   5.1: no name check, no validity period, no chain).
3. DANE-TA (2): a certificate of the presented chain other than the leaf
   matches (the server must send its trust anchor, RFC 7671 section 5.2.2),
   and the leaf chains to it through the presented certificates under the
   usual checks, the name ``host`` and validity at ``now`` included
   (``cryptography``'s verifier with that anchor as the only one). The
   leaf need not follow the CA/Browser Forum's profile beyond carrying a
   subjectAltName (a private PKI's chain often does not); the issuers'
   checks are the Web PKI's.
4. The first usable record that matches wins, DANE-EE records first
   (the cheaper check); its index in the RRset is reported as evidence.

Error handling: ``Tlsa.parse`` raises ``ValueError`` for a malformed
presentation; ``match`` never raises on hostile certificates (a chain that
does not parse matches nothing).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum, IntEnum

from cryptography import x509
from cryptography.x509 import verification
from cryptography.x509.verification import Criticality, ExtensionPolicy

from notary.model.observations import subject_public_key_info

__all__ = [
    "CONVERGENCE_STATUS", "DECIDES", "DaneMatch", "DaneOutcome", "DaneVerdict", "DnssecStatus",
    "MatchingType", "Selector", "Tlsa", "TlsaLookup", "Usage", "association", "deciding_backend",
    "match", "verdict",
]


class Usage(IntEnum):
    PKIX_TA = 0
    PKIX_EE = 1
    DANE_TA = 2
    DANE_EE = 3


class Selector(IntEnum):
    CERT = 0
    SPKI = 1


class MatchingType(IntEnum):
    FULL = 0
    SHA2_256 = 1
    SHA2_512 = 2


#: The length of the data each hashing matching type gives.
_DIGEST_BYTES = {MatchingType.SHA2_256: 32, MatchingType.SHA2_512: 64}
_HASHES = {MatchingType.SHA2_256: hashlib.sha256, MatchingType.SHA2_512: hashlib.sha512}


@dataclass(frozen=True, slots=True)
class Tlsa:
    """One TLSA record: certificate usage, selector, matching type, and the
    certificate association data."""

    usage: int
    selector: int
    matching_type: int
    data: bytes

    @classmethod
    def parse(cls, text: str) -> Tlsa:
        """A record from its presentation form, ``"3 1 1 0123ab..."``
        (the data's hex may be split by spaces)."""
        fields = text.split()
        if len(fields) < 4:
            raise ValueError(f"a TLSA record has four fields: {text!r}")
        try:
            numbers = [int(field) for field in fields[:3]]
            data = bytes.fromhex("".join(fields[3:]))
        except ValueError:
            raise ValueError(f"not a TLSA record: {text!r}") from None
        if not all(0 <= number <= 255 for number in numbers):
            raise ValueError(f"TLSA fields are 0-255: {text!r}")
        return cls(*numbers, data)

    def __str__(self) -> str:
        return f"{self.usage} {self.selector} {self.matching_type} {self.data.hex()}"

    @property
    def usable(self) -> bool:
        """Rule 1."""
        if self.usage not in (Usage.DANE_TA, Usage.DANE_EE):
            return False
        if self.selector not in (Selector.CERT, Selector.SPKI):
            return False
        if self.matching_type == MatchingType.FULL:
            return bool(self.data)
        return len(self.data) == _DIGEST_BYTES.get(self.matching_type, -1)  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True)
class DaneMatch:
    """The evidence of a match: the record, its index in the RRset, and
    which certificate of the chain it matched (0: the leaf)."""

    record: Tlsa
    index: int
    certificate: int


def association(der: bytes, selector: int, matching_type: int) -> bytes:
    """The certificate association data of the DER certificate ``der`` for
    ``selector`` and ``matching_type`` (both usable). Raises ``ValueError``
    for a certificate whose SubjectPublicKeyInfo cannot be found."""
    selected = der if selector == Selector.CERT else subject_public_key_info(der)
    if matching_type == MatchingType.FULL:
        return selected
    return _HASHES[MatchingType(matching_type)](selected).digest()


def match(
    records: Sequence[Tlsa], chain: Sequence[bytes], host: str, now: datetime
) -> DaneMatch | None:
    """The first usable record of ``records`` that vouches for ``chain``
    (DER, leaf first, as the target presented it) for the name ``host`` at
    ``now`` (rules 2-4); None when none does."""
    if not chain:
        return None
    usable = [(i, r) for i, r in enumerate(records) if r.usable]
    for index, record in sorted(usable, key=lambda item: item[1].usage != Usage.DANE_EE):
        if record.usage == Usage.DANE_EE:
            if _matches(record, chain[0]):
                return DaneMatch(record, index, 0)
            continue
        for position in range(1, len(chain)):
            if _matches(record, chain[position]) and _chains_to(chain, position, host, now):
                return DaneMatch(record, index, position)
    return None


def _matches(record: Tlsa, der: bytes) -> bool:
    try:
        return association(der, record.selector, record.matching_type) == record.data
    except ValueError:
        return False


#: What a DANE-TA leaf must carry (rule 3): a subjectAltName, for the name check.
_LEAF = ExtensionPolicy.permit_all().require_present(
    x509.SubjectAlternativeName, Criticality.AGNOSTIC, None
)


def _chains_to(chain: Sequence[bytes], anchor: int, host: str, now: datetime) -> bool:
    """Rule 3: the leaf verifies up to ``chain[anchor]`` as the only trust
    anchor, through the other presented certificates, for ``host`` at ``now``."""
    try:
        certificates = [x509.load_der_x509_certificate(der) for der in chain]
        store = verification.Store([certificates[anchor]])
        verifier = (
            verification.PolicyBuilder().store(store).time(now)
            .extension_policies(ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=_LEAF)
            .build_server_verifier(_subject(host))
        )
        verifier.verify(certificates[0], certificates[1:])
    except (ValueError, verification.VerificationError):
        return False
    return True


def _subject(host: str) -> verification.Subject:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class DnssecStatus(Enum):
    """What the validating resolver said of ``_PORT._tcp.HOST``'s TLSA
    (RFC 7672 section 2.2's treatment as the model):"""

    SECURE = "secure"  # records, validated (AD)
    SECURE_DENIAL = "secure-denial"  # no such records, proven (AD on NXDOMAIN or NODATA)
    INSECURE = "insecure"  # an answer or denial without AD: an unsigned zone
    BOGUS = "bogus"  # SERVFAIL from a validating resolver: validation failed
    RESOLVER_FAILURE = "resolver-failure"  # no answer in time, or a refusal


@dataclass(frozen=True, slots=True)
class TlsaLookup:
    """One lookup's result: its status, the records (SECURE only), their
    TTL (how long a verdict on them may be reused), when it was made."""

    status: DnssecStatus
    records: tuple[Tlsa, ...] = ()
    ttl: int = 0
    checked_at: int = 0


class DaneOutcome(Enum):
    """The verdict of the DANE backend (issue 20), and what each protocol
    answers: ``CONVERGENCE_STATUS``."""

    MATCH = "match"  # secure records, one vouches for the chain
    MISMATCH = "mismatch"  # secure usable records, none vouches
    NO_TLSA = "no-tlsa"  # secure denial, or only unusable records: DANE does not decide
    INSECURE = "insecure"  # the zone is not signed: DANE does not decide
    BOGUS = "bogus"  # validation failed: never a match
    RESOLVER_FAILURE = "resolver-failure"


#: Convergence's status for each outcome (303: inconclusive, which the 2011
#: client already understands; 503: the notary cannot tell now).
CONVERGENCE_STATUS = {
    DaneOutcome.MATCH: 200, DaneOutcome.MISMATCH: 409, DaneOutcome.NO_TLSA: 303,
    DaneOutcome.INSECURE: 303, DaneOutcome.BOGUS: 503, DaneOutcome.RESOLVER_FAILURE: 503,
}


#: The outcomes on which DANE decides when it runs before the network
#: perspective (``["dane", "perspective"]``): the site publishes secure
#: TLSA records, or DNSSEC failed. A bogus answer or a silent resolver is
#: never handed to the perspective: an attacker who can break the site's
#: DNS answers could otherwise turn DANE off (RFC 7672 section 2.2).
DECIDES = frozenset({
    DaneOutcome.MATCH, DaneOutcome.MISMATCH, DaneOutcome.BOGUS, DaneOutcome.RESOLVER_FAILURE,
})


def deciding_backend(backends: Sequence[str], outcome: DaneOutcome | None) -> str:
    """Which backend decides a target's answer (``"dane"`` or
    ``"perspective"``) under the operator's ``[verify] backends`` and the
    target's DANE ``outcome`` (None: not checked): DANE alone decides
    everything; "DANE then perspective" lets DANE decide on ``DECIDES``
    and the perspective elsewhere (no TLSA, an unsigned zone)."""
    if "dane" not in backends:
        return "perspective"
    if "perspective" not in backends or outcome in DECIDES:
        return "dane"
    return "perspective"


@dataclass(frozen=True, slots=True)
class DaneVerdict:
    """A verdict on the certificate the probe saw (``leaf_sha256``,
    ``leaf_sha1``), from ``lookup``, with its evidence (``matched``), to be
    reused until ``reuse_until`` (Unix seconds)."""

    outcome: DaneOutcome
    lookup: TlsaLookup
    matched: DaneMatch | None = None
    leaf_sha256: bytes = b""
    leaf_sha1: bytes = b""
    reuse_until: int = 0

    def vouches_for(self, sha256: bytes | None, sha1: bytes | None) -> bool:
        """Whether this is a match for a certificate with the given hashes
        (each given one must be the judged leaf's)."""
        if self.outcome is not DaneOutcome.MATCH:
            return False
        return sha256 in (None, self.leaf_sha256) and sha1 in (None, self.leaf_sha1)


def verdict(
    lookup: TlsaLookup, chain: Sequence[bytes], host: str, now: datetime, *,
    max_reuse_s: int = 0, failure_reuse_s: int = 0, min_reuse_s: int = 0,
) -> DaneVerdict:
    """The DANE verdict on ``chain`` (what the probe saw of ``host``) given
    the TLSA ``lookup``. It may be reused for the lookup's TTL, at least
    ``min_reuse_s`` (a TTL of 0, or a denial without an SOA, would have it
    expire at once) and at most ``max_reuse_s``; one on a failed lookup
    (bogus, resolver failure) for ``failure_reuse_s``."""
    status = lookup.status
    matched = None
    if status is DnssecStatus.SECURE:
        if not any(record.usable for record in lookup.records):
            outcome = DaneOutcome.NO_TLSA
        else:
            matched = match(lookup.records, chain, host, now)
            outcome = DaneOutcome.MATCH if matched is not None else DaneOutcome.MISMATCH
    else:
        outcome = {
            DnssecStatus.SECURE_DENIAL: DaneOutcome.NO_TLSA,
            DnssecStatus.INSECURE: DaneOutcome.INSECURE,
            DnssecStatus.BOGUS: DaneOutcome.BOGUS,
            DnssecStatus.RESOLVER_FAILURE: DaneOutcome.RESOLVER_FAILURE,
        }[status]
    failed = status in (DnssecStatus.BOGUS, DnssecStatus.RESOLVER_FAILURE)
    reuse_s = failure_reuse_s if failed else min(max(lookup.ttl, min_reuse_s), max_reuse_s)
    leaf = chain[0] if chain else b""
    return DaneVerdict(
        outcome, lookup, matched,
        leaf_sha256=hashlib.sha256(leaf).digest() if leaf else b"",
        leaf_sha1=hashlib.sha1(leaf).digest() if leaf else b"",
        reuse_until=lookup.checked_at + max(reuse_s, 0),
    )

