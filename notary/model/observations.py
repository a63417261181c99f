"""What a notary saw: certificates, probe results and per-target timelines.

Pure values and pure functions (no I/O, no clock): the store persists them, the
cache holds them, the protocol modules serialise them.

One probe of a target handshakes with each of its addresses, some several
times (docs/sites.md, "Sites that serve several certificates"): each handshake is
a :class:`ProbeResult`, the probe a :class:`ProbeReport` of them all. A
target's *current set* (:meth:`Timeline.current`) is every certificate seen
at any of its addresses within ``fresh_for_s``, and the newest whatever its
age: what answers vouch for, what a probe's news is judged against
(:func:`is_change`) and what decides how often a probe samples each address
(:func:`samples_per_address`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from cryptography import x509

from notary.model.targets import Target

#: How many distinct addresses are remembered per observation (newest first).
MAX_ADDRESSES_PER_OBSERVATION = 8
#: Two sightings of a certificate closer than this belong to one run (the
#: original Perspectives notary's 48 h); a longer gap starts a new run.
DEFAULT_MERGE_WINDOW_S = 48 * 3600

#: ``(start, end)`` Unix seconds: a run of sightings, never longer than what
#: was observed (start = first sighting, end = last sighting).
Run = tuple[int, int]


def add_sighting(
    runs: Iterable[Run], observed_at: int, merge_window_s: int
) -> tuple[Run, ...]:
    """The runs after one more sighting at ``observed_at``.

    A sighting within ``merge_window_s`` of a run (at most that many seconds
    after its end or before its start) joins it; one inside a run changes
    nothing; otherwise it starts a run of its own. Runs that the new sighting
    brings within the window of each other merge. The order of calls does
    not matter: the result is the same as splitting all sighting times,
    sorted, where consecutive ones are more than ``merge_window_s`` apart.
    Input runs need not be sorted or disjoint; the result is sorted by start.

    Raises ``ValueError`` for a negative window or a run that ends before it
    starts.
    """
    if merge_window_s < 0:
        raise ValueError("merge_window_s must not be negative")
    ordered = sorted([*((int(s), int(e)) for s, e in runs), (observed_at, observed_at)])
    merged: list[Run] = []
    for start, end in ordered:
        if start > end:
            raise ValueError("a timespan must not end before it starts")
        if merged and start - merged[-1][1] <= merge_window_s:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


@dataclass(frozen=True, slots=True)
class Certificate:
    """A leaf certificate as DER plus the hashes every protocol needs.

    ``spki_sha256`` hashes the SubjectPublicKeyInfo as it stands in the DER
    (an SPKI pin, RFC 7469), whatever its key algorithm: a key
    ``cryptography`` cannot load (SM2, GOST, an unknown OID) is recorded
    like any other, and shown with the key type "unknown"."""

    der: bytes
    sha1: bytes
    sha256: bytes
    md5: bytes
    spki_sha256: bytes

    @classmethod
    def from_der(cls, der: bytes) -> Certificate:
        """Hash ``der``. Raises ``ValueError`` if it is not a certificate;
        never parses the public key."""
        x509.load_der_x509_certificate(der)
        return cls(
            der=der,
            sha1=hashlib.sha1(der).digest(),
            sha256=hashlib.sha256(der).digest(),
            md5=hashlib.md5(der).digest(),
            spki_sha256=hashlib.sha256(subject_public_key_info(der)).digest(),
        )


_DER_SEQUENCE = 0x30
_DER_VERSION = 0xA0  # TBSCertificate's [0] EXPLICIT version
#: TBSCertificate fields between the version and subjectPublicKeyInfo:
#: serialNumber, signature, issuer, validity, subject.
_FIELDS_BEFORE_SPKI = 5
#: Longest DER length field read, in bytes (4: up to 4 GiB).
_MAX_DER_LENGTH_BYTES = 4


def subject_public_key_info(der: bytes) -> bytes:
    """The SubjectPublicKeyInfo element of the DER certificate ``der``,
    tag and length included, as the bytes it holds (no key is parsed).

    A fixed walk, no recursion: into Certificate and TBSCertificate, past
    the optional version and five fields, every element checked to lie
    within its parent. Raises ``ValueError`` if ``der`` is not shaped so.
    """
    tag, start, end = _der_element(der, 0, len(der))
    if tag != _DER_SEQUENCE:
        raise ValueError("not a certificate: no outer SEQUENCE")
    tag, offset, tbs_end = _der_element(der, start, end)
    if tag != _DER_SEQUENCE:
        raise ValueError("not a certificate: no TBSCertificate")
    tag, _, after = _der_element(der, offset, tbs_end)
    if tag == _DER_VERSION:
        offset = after
    for _ in range(_FIELDS_BEFORE_SPKI):
        _, _, offset = _der_element(der, offset, tbs_end)
    tag, _, spki_end = _der_element(der, offset, tbs_end)
    if tag != _DER_SEQUENCE:
        raise ValueError("not a certificate: no SubjectPublicKeyInfo")
    return der[offset:spki_end]


def _der_element(der: bytes, offset: int, limit: int) -> tuple[int, int, int]:
    """``(tag, content start, end)`` of the DER element at ``offset``, which
    must end by ``limit``. Raises ``ValueError`` otherwise, and for what DER
    certificates never hold here (multi-byte tags, indefinite lengths)."""
    if limit - offset < 2:
        raise ValueError("truncated DER element")
    tag, first = der[offset], der[offset + 1]
    if tag & 0x1F == 0x1F:
        raise ValueError("unexpected multi-byte DER tag")
    start = offset + 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if not 1 <= count <= _MAX_DER_LENGTH_BYTES or limit - start < count:
            raise ValueError("bad DER length")
        length = int.from_bytes(der[start : start + count], "big")
        start += count
    if length > limit - start:
        raise ValueError("truncated DER element")
    return tag, start, start + length


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One successful probe: ``target`` served ``leaf`` (and ``chain``, the
    DER of every certificate it sent, leaf first) from ``address`` at
    ``observed_at`` (Unix seconds), over ``tls_version`` as OpenSSL names it
    (``"TLSv1"``, ``"TLSv1.1"``, ``"TLSv1.2"``, ``"TLSv1.3"``; None when not
    recorded)."""

    target: Target
    leaf: Certificate
    chain: tuple[bytes, ...]
    address: str
    observed_at: int
    tls_version: str | None = None


@dataclass(frozen=True, slots=True)
class ProbeReport:
    """One probe of ``target``: every handshake that showed a certificate
    (``results``, at least one; in the order of ``addresses``, then of the
    handshakes at each), every address probed (``addresses``, in the order
    probed: the resolver's, then an address hint), the ``failures`` as
    ``(address, reason)`` (:attr:`ProbeError.reason
    <notary.errors.ProbeError.reason>`) for the addresses where no handshake
    showed a certificate, and ``observed_at`` (Unix seconds), the time of
    the probe, which the prober stamps on each of its results too (one
    probe is one sighting of each certificate it saw).

    Raises ``ValueError`` without a result, or for a result of another
    target."""

    target: Target
    results: tuple[ProbeResult, ...]
    addresses: tuple[str, ...]
    failures: tuple[tuple[str, str], ...] = ()
    observed_at: int = 0

    def __post_init__(self) -> None:
        if not self.results:
            raise ValueError("a probe report needs at least one result")
        if any(result.target != self.target for result in self.results):
            raise ValueError("a probe report's results are of its target")

    @classmethod
    def of(cls, result: ProbeResult) -> ProbeReport:
        """The report of a probe that made the one handshake ``result``."""
        return cls(result.target, (result,), (result.address,), (), result.observed_at)

    @property
    def primary(self) -> ProbeResult:
        """The result that stands for the probe where one is needed (the
        scheduler's address prefix, DANE's chain): the first handshake at
        the first address, in the order probed, that showed a certificate."""
        return self.results[0]

    @property
    def leaves(self) -> tuple[Certificate, ...]:
        """The distinct leaf certificates seen, in the order of ``results``."""
        seen: dict[bytes, Certificate] = {}
        for result in self.results:
            seen.setdefault(result.leaf.sha256, result.leaf)
        return tuple(seen.values())

    @property
    def served(self) -> Mapping[str, tuple[Certificate, ...]]:
        """What each address that answered served: its distinct leaves, in
        the order of its handshakes; the addresses in the order probed."""
        served: dict[str, dict[bytes, Certificate]] = {}
        for result in self.results:
            served.setdefault(result.address, {}).setdefault(result.leaf.sha256, result.leaf)
        return {address: tuple(leaves.values()) for address, leaves in served.items()}

    @property
    def sightings(self) -> tuple[ProbeResult, ...]:
        """The results with one per (address, certificate): what a timeline
        and the store take in (another handshake showing the same
        certificate at the same address, at the same time, adds nothing)."""
        kept: dict[tuple[str, bytes], ProbeResult] = {}
        for result in self.results:
            kept.setdefault((result.address, result.leaf.sha256), result)
        return tuple(kept.values())

    @property
    def handshakes(self) -> int:
        """Handshakes that showed a certificate."""
        return len(self.results)


@dataclass(frozen=True, slots=True)
class Observation:
    """A certificate seen for a target from ``first_seen`` to ``last_seen``,
    in ``runs`` of sightings (Perspectives timespans; empty means one run
    from ``first_seen`` to ``last_seen``, for history recorded before runs
    were kept)."""

    certificate: Certificate
    first_seen: int
    last_seen: int
    addresses: tuple[str, ...] = ()
    runs: tuple[Run, ...] = ()

    @property
    def timespans(self) -> tuple[Run, ...]:
        """The runs, or the one span ``first_seen``-``last_seen``."""
        return self.runs or ((self.first_seen, self.last_seen),)

    def is_fresh(self, now: int, fresh_for_s: int) -> bool:
        return self.last_seen >= now - fresh_for_s


@dataclass(frozen=True, slots=True)
class TimelineLimits:
    """What one target's timeline keeps (docs/storage.md "What the notary keeps").

    - A certificate's DER only up to ``max_certificate_bytes``: a larger one
      is kept by its hashes, with ``der`` empty (no protocol answer needs the
      DER: Convergence answers with SHA-1, Perspectives with MD5, v2 with
      SHA-256, SPKI SHA-256 and SHA-1; the web page then shows the hashes).
    - The ``max_certificates_per_target`` newest observations, in the
      timeline's order (newest ``last_seen`` first): the oldest go first.
    - The ``max_runs_per_certificate`` newest runs of each observation: the
      oldest go first, and the observation's ``first_seen`` moves to the
      start of its oldest kept run.

    The cache (``Timeline.merged``) and the store (``notary.state.store``) apply
    the same limits, so a timeline read back from the store equals the one
    built in memory. Raises ``ValueError`` for a limit out of range."""

    max_certificate_bytes: int = 8192
    max_certificates_per_target: int = 64
    max_runs_per_certificate: int = 32

    def __post_init__(self) -> None:
        if self.max_certificate_bytes < 0:
            raise ValueError("max_certificate_bytes must be 0 or more")
        if self.max_certificates_per_target < 1:
            raise ValueError("max_certificates_per_target must be at least 1")
        if self.max_runs_per_certificate < 1:
            raise ValueError("max_runs_per_certificate must be at least 1")


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

    def current(self, now: int, fresh_for_s: int) -> tuple[Observation, ...]:
        """The target's current set at ``now``: every observation seen
        (at any address) within ``fresh_for_s``, and the newest one whatever
        its age (the last thing the notary saw is current until it sees
        something else); newest first."""
        return tuple(
            o for i, o in enumerate(self.observations) if i == 0 or o.is_fresh(now, fresh_for_s)
        )

    def bounded(self, limits: TimelineLimits) -> Timeline:
        """This timeline within ``limits`` (see :class:`TimelineLimits`):
        DER larger than the limit dropped (hashes kept), then each
        observation's oldest runs beyond the limit, then the oldest
        observations beyond the limit. ``self`` when it is within them."""
        max_der = limits.max_certificate_bytes
        max_runs = limits.max_runs_per_certificate
        kept = []
        changed = False
        for observation in self.observations:
            certificate = observation.certificate
            if len(certificate.der) > max_der:
                observation = replace(observation, certificate=replace(certificate, der=b""))
                changed = True
            if len(observation.runs) > max_runs:
                runs = tuple(sorted(observation.runs))[-max_runs:]
                observation = replace(observation, runs=runs, first_seen=runs[0][0])
                changed = True
            kept.append(observation)
        # Dropping runs may move a first_seen, hence the order: sort again.
        timeline = Timeline(self.target, tuple(kept)) if changed else self
        if len(timeline.observations) > limits.max_certificates_per_target:
            timeline = Timeline(
                self.target, timeline.observations[: limits.max_certificates_per_target]
            )
        return timeline

    def merged(
        self,
        seen: ProbeResult | ProbeReport,
        merge_window_s: int = DEFAULT_MERGE_WINDOW_S,
        limits: TimelineLimits | None = None,
    ) -> Timeline:
        """The timeline after ``seen``.

        A result: the seen certificate's ``last_seen`` moves forward (never
        back), its address is remembered and its runs take the sighting
        (see :func:`add_sighting`), or a new observation starts; then, with
        ``limits``, :meth:`bounded` by them (what the store keeps of the
        same sightings). A report: the fold of its
        :attr:`~ProbeReport.sightings`, in order, each merged so (the store
        writes them in that order, one at a time where a limit may bite, so
        both keep the same)."""
        if isinstance(seen, ProbeReport):
            timeline = self
            for result in seen.sightings:
                timeline = timeline.merged(result, merge_window_s, limits)
            return timeline
        result = seen
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
                runs=((result.observed_at, result.observed_at),),
            )
        else:
            addresses = (result.address, *tuple(a for a in found.addresses if a != result.address))
            updated = replace(
                found,
                first_seen=min(found.first_seen, result.observed_at),
                last_seen=max(found.last_seen, result.observed_at),
                addresses=addresses[:MAX_ADDRESSES_PER_OBSERVATION],
                runs=add_sighting(found.timespans, result.observed_at, merge_window_s),
            )
        timeline = Timeline(self.target, (updated, *kept))
        return timeline if limits is None else timeline.bounded(limits)


def samples_per_address(
    timeline: Timeline | None, now: int, fresh_for_s: int, samples: int
) -> int:
    """How many handshakes a probe of the target of ``timeline`` may make
    with each address at ``now``: ``samples`` (``[probe]
    samples_per_address``) when more than one certificate was seen within
    ``fresh_for_s`` (at one address or across addresses), else 1 (a
    stable target, or one never observed)."""
    if timeline is None:
        return 1
    fresh = 0
    for observation in timeline.observations:
        if observation.is_fresh(now, fresh_for_s):
            fresh += 1
            if fresh > 1:
                return max(1, samples)
    return 1


def is_change(before: Timeline, report: ProbeReport, fresh_for_s: int) -> bool:
    """Whether ``report`` shows something new for a target whose timeline
    was ``before``: a certificate outside its current set at the probe's
    time (:meth:`Timeline.current`). A target's first probe is no change;
    nor is a split site showing the certificates it has been serving, at
    whichever addresses, nor a probe that saw only some of them."""
    if not before.observations:
        return False
    current = {o.certificate.sha256 for o in before.current(report.observed_at, fresh_for_s)}
    return any(leaf.sha256 not in current for leaf in report.leaves)
