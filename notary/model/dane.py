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
5. Several certificates (a site serving several at once, issue 31): each
   distinct leaf a probe saw is judged on its own against the one lookup
   (``verdict_on``), through each distinct chain it came with until one
   matches; the verdict keeps a judgement per certificate
   (``DaneVerdict.judgements``) and vouches for each certificate some
   record vouches for. Its outcome is ``MATCH`` when a record vouches for
   at least one of them, and its *main* certificate (``leaf_sha256``) is
   the first vouched for in SHA-256 order, else the first judged: never
   the order in which addresses answered, so a verdict on the same
   certificates and records is the same whichever address answered first.

Error handling: ``Tlsa.parse`` raises ``ValueError`` for a malformed
presentation; ``match`` never raises on hostile certificates (a chain that
does not parse matches nothing).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum, IntEnum

from cryptography import x509
from cryptography.x509 import verification
from cryptography.x509.verification import Criticality, ExtensionPolicy

from notary.model.observations import subject_public_key_info

__all__ = [
    "CONVERGENCE_STATUS", "DECIDES", "JUDGING", "DaneJudgement", "DaneMatch", "DaneOutcome",
    "DaneVerdict", "DnssecStatus", "MatchingType", "Presented", "Selector", "Tlsa", "TlsaLookup",
    "Usage", "association", "deciding_backend", "match", "verdict", "verdict_on",
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
        usage, selector, matching_type = numbers
        return cls(usage, selector, matching_type, data)

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


#: The outcomes that judge each certificate against secure usable records
#: (the others say the same of every certificate: no records, an unsigned
#: zone, a DNSSEC failure).
JUDGING = frozenset({DaneOutcome.MATCH, DaneOutcome.MISMATCH})


@dataclass(frozen=True, slots=True)
class Presented:
    """A certificate a probe saw, to judge: its SHA-256 and SHA-1, and the
    chain it came with (DER, leaf first; only the leaf when the chain was
    not kept, empty when not even the leaf's DER was: it then matches
    nothing)."""

    sha256: bytes
    sha1: bytes
    chain: tuple[bytes, ...]

    @classmethod
    def of(cls, chain: Sequence[bytes]) -> Presented:
        leaf = chain[0]
        return cls(hashlib.sha256(leaf).digest(), hashlib.sha1(leaf).digest(), tuple(chain))


@dataclass(frozen=True, slots=True)
class DaneJudgement:
    """DANE's verdict on one certificate: its hashes, and the record that
    vouches for it (``matched``; None: none does, or the records were not
    judged: ``DaneVerdict.outcome`` not in ``JUDGING``)."""

    sha256: bytes
    sha1: bytes
    matched: DaneMatch | None = None


@dataclass(frozen=True, slots=True)
class DaneVerdict:
    """A verdict on the certificates a probe saw, from ``lookup``, to be
    reused until ``reuse_until`` (Unix seconds).

    The *main* certificate (``leaf_sha256``, ``leaf_sha1``, its evidence
    ``matched``; rule 5) and, when several certificates were judged against
    secure usable records (``outcome`` in ``JUDGING``), the ``others``, in
    SHA-256 order: ``judgements`` lists them all. ``outcome`` is the main
    certificate's: ``MATCH`` when a record vouches for any of them."""

    outcome: DaneOutcome
    lookup: TlsaLookup
    matched: DaneMatch | None = None
    leaf_sha256: bytes = b""
    leaf_sha1: bytes = b""
    reuse_until: int = 0
    others: tuple[DaneJudgement, ...] = ()

    @property
    def main(self) -> DaneJudgement | None:
        """The main certificate's judgement (None: no certificate was
        judged, DNSSEC failed before a probe saw one)."""
        if not self.leaf_sha256:
            return None
        return DaneJudgement(self.leaf_sha256, self.leaf_sha1, self.matched)

    @property
    def judgements(self) -> tuple[DaneJudgement, ...]:
        """Every certificate judged, the main one included, in SHA-256 order."""
        main = self.main
        if main is None:
            return self.others
        if not self.others:
            return (main,)
        return tuple(sorted((main, *self.others), key=lambda j: j.sha256))

    def vouched(self, sha256: bytes | None, sha1: bytes | None) -> tuple[DaneJudgement, ...]:
        """The judgements of certificates a record vouches for that have the
        given hashes (each given one must be the certificate's)."""
        if self.outcome is not DaneOutcome.MATCH:
            return ()
        return tuple(
            j for j in self.judgements
            if j.matched is not None and sha256 in (None, j.sha256) and sha1 in (None, j.sha1)
        )

    def vouches_for(self, sha256: bytes | None, sha1: bytes | None) -> bool:
        """Whether this is a match for a certificate with the given hashes
        (each given one must be that of a certificate a record vouches for)."""
        return bool(self.vouched(sha256, sha1))

    def carrying(self, earlier: DaneVerdict | None, current: Collection[bytes]) -> DaneVerdict:
        """This verdict with the judgements of ``earlier`` (the target's
        verdict before it) on the certificates of ``current`` (the SHA-256s
        of the target's current set) this one did not judge (its probe did
        not see them: an address that did not answer this time), when both
        judged the same records (status and RRset, in whatever order: a
        resolver may rotate an RRset from one answer to the next): such a
        judgement is what judging again would give (its record's index is
        that in this verdict's RRset). Otherwise, or when either did not
        judge certificates (``JUDGING``), this verdict as it is. Never more
        judgements than ``current`` holds, and those of this verdict."""
        records = self.lookup.records
        if (
            earlier is None or self.outcome not in JUDGING or earlier.outcome not in JUDGING
            or earlier.lookup.status is not self.lookup.status
            or frozenset(earlier.lookup.records) != frozenset(records)
        ):
            return self
        mine = {j.sha256 for j in self.judgements}
        carried = [
            j if j.matched is None else replace(
                j, matched=replace(j.matched, index=records.index(j.matched.record)))
            for j in earlier.judgements if j.sha256 in current and j.sha256 not in mine
        ]
        if not carried:
            return self
        return _assembled(self.lookup, [*self.judgements, *carried], self.reuse_until)


def _assembled(
    lookup: TlsaLookup, judgements: Sequence[DaneJudgement], reuse_until: int,
    outcome: DaneOutcome | None = None,
) -> DaneVerdict:
    """The verdict of ``judgements`` (distinct certificates) on ``lookup``
    (rule 5): the main certificate, the others in SHA-256 order, and the
    outcome (given, or ``MATCH``/``MISMATCH`` by whether any is vouched for)."""
    ordered = sorted(judgements, key=lambda j: j.sha256)
    main = next((j for j in ordered if j.matched is not None), ordered[0] if ordered else None)
    if outcome is None:
        outcome = DaneOutcome.MISMATCH if main is None or main.matched is None else (
            DaneOutcome.MATCH)
    if main is None:
        return DaneVerdict(outcome, lookup, reuse_until=reuse_until)
    return DaneVerdict(
        outcome, lookup, main.matched, leaf_sha256=main.sha256, leaf_sha1=main.sha1,
        reuse_until=reuse_until,
        others=tuple(j for j in ordered if j is not main) if outcome in JUDGING else (),
    )


def verdict(
    lookup: TlsaLookup, chain: Sequence[bytes], host: str, now: datetime, *,
    max_reuse_s: int = 0, failure_reuse_s: int = 0, min_reuse_s: int = 0,
) -> DaneVerdict:
    """The DANE verdict on ``chain`` (what the probe saw of ``host``) given
    the TLSA ``lookup``: ``verdict_on`` that one chain (none when empty)."""
    return verdict_on(
        lookup, [Presented.of(chain)] if chain else [], host, now, max_reuse_s=max_reuse_s,
        failure_reuse_s=failure_reuse_s, min_reuse_s=min_reuse_s,
    )


def verdict_on(
    lookup: TlsaLookup, presented: Sequence[Presented], host: str, now: datetime, *,
    max_reuse_s: int = 0, failure_reuse_s: int = 0, min_reuse_s: int = 0,
) -> DaneVerdict:
    """The DANE verdict on the certificates a probe saw of ``host``
    (``presented``: each handshake's leaf and chain; a certificate seen
    several times is judged once, through each distinct chain it came with
    until one matches: rule 5) given the TLSA ``lookup``. It may be reused
    for the lookup's TTL, at least ``min_reuse_s`` (a TTL of 0, or a denial
    without an SOA, would have it expire at once) and at most
    ``max_reuse_s``; one on a failed lookup (bogus, resolver failure) for
    ``failure_reuse_s``."""
    status = lookup.status
    judging = status is DnssecStatus.SECURE and any(record.usable for record in lookup.records)
    chains: dict[bytes, tuple[bytes, bytes, list[tuple[bytes, ...]]]] = {}
    for seen in presented:
        _, _, known = chains.setdefault(seen.sha256, (seen.sha256, seen.sha1, []))
        if seen.chain not in known:
            known.append(seen.chain)
    judgements = []
    for sha256, sha1, known in chains.values():
        matched = None
        if judging:
            for chain in known:
                matched = match(lookup.records, chain, host, now)
                if matched is not None:
                    break
        judgements.append(DaneJudgement(sha256, sha1, matched))
    outcome = None
    if not judging:
        outcome = {
            DnssecStatus.SECURE: DaneOutcome.NO_TLSA,  # only unusable records
            DnssecStatus.SECURE_DENIAL: DaneOutcome.NO_TLSA,
            DnssecStatus.INSECURE: DaneOutcome.INSECURE,
            DnssecStatus.BOGUS: DaneOutcome.BOGUS,
            DnssecStatus.RESOLVER_FAILURE: DaneOutcome.RESOLVER_FAILURE,
        }[status]
    failed = status in (DnssecStatus.BOGUS, DnssecStatus.RESOLVER_FAILURE)
    reuse_s = failure_reuse_s if failed else min(max(lookup.ttl, min_reuse_s), max_reuse_s)
    return _assembled(lookup, judgements, lookup.checked_at + max(reuse_s, 0), outcome)
