"""The notary client: ask several notaries which certificate a site serves,
and vote (PROTOCOLS.md 1.7; the voting rules are in
:mod:`notary.protocol.voting`).

An I/O edge (Trio). What it does, and how it differs from the 2011 add-on:

1. The site's certificate is fetched here (SNI for names, TLS 1.2/1.3, under
   the deadline), unless the caller gives a fingerprint; with v2, the
   address that connection reached goes with the question (docs/v2.md, R4:
   the notary may add it to its probe when its own resolution gave it).
2. Up to ``quorum`` notaries with distinct names are asked, concurrently
   (the add-on asked one after another), each under its own deadline. All
   hosts of a notary are dialled in parallel and the first to connect is
   used.
3. A notary is authenticated by the SHA-1 pin of its host's certificate in
   its bundle, and its answer's signature is verified with that
   certificate's key (the add-on never verified it): a bad signature is a
   ``FAILURE`` of that notary.
4. Bouncing: one notary is the relay and is not asked (as the add-on did),
   chosen at random unless named. The asked notary sees the relay's address;
   the relay sees only TLS. If a relay fails (cannot be reached, or refuses),
   the notaries it failed for are asked again through another spare notary;
   when none is left they count as connectivity failures, never as a silent
   direct connection.
5. Whatever one notary (or its relay) sends, and whatever defect its
   bundle has, is that notary's row: a verdict and a one-line ``detail``,
   never an exception that ends the check. Answers are parsed strictly
   (:func:`notary.protocol.convergence.parse_answer`, the v2 parsers), at
   most :data:`MAX_RESPONSE_BYTES` are read, and each notary is asked under
   its own deadline (``timeout_s``), which a notary dripping bytes cannot
   extend. Host names go on the wire as A-labels (IDNA), IPv6 literals in
   brackets.
6. A notary vouches when the certificate is in its *current set* (every
   certificate it saw at any of the site's addresses within its freshness
   window): a site serving several certificates at once is vouched for in
   each of them. A v2 answer's signed ``consistency`` (docs/v2.md, S8) says
   whether the site is split or rotating; the row says so ("split site: 3
   certificates at 4 addresses") and :class:`NotaryAnswer` keeps it, with
   the statement's observations (which addresses served which certificate).

Resource handling: every connection is opened and closed within the call
that needs it; :func:`check` owns a nursery for the concurrent queries.

Error handling: :func:`check` raises ``UsageError`` for bad input (no
notaries, unknown relay) and :class:`SiteUnreachable` when the site's
certificate cannot be fetched; every failure of a notary becomes its
:class:`NotaryAnswer` (never an exception).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import secrets
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio
import trio_websocket
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from notary.client.checkpoints import CheckpointBook
from notary.client.logcheck import LogFailed, check_log
from notary.client.reach import (
    MAX_RESPONSE_BYTES,
    NotaryFailed,
    RelayFailed,
    connect_direct,
    exchange,
    host_authority,
    http_request,
    pinned_tls,
    wire_host,
)
from notary.client.witnesses import WitnessChoice
from notary.errors import NotaryError, PeerError, ProbeError, ProtocolError, UsageError
from notary.model.consistency import Consistency, ConsistencyKind
from notary.model.policy import ANY_ADDRESS
from notary.model.targets import Target, format_convergence_target
from notary.outbound.dialer import Resolver, dial, system_resolver
from notary.protocol import convergence, strictjson, v2
from notary.protocol.bundle import BUNDLE_SUFFIX, Bundle, BundleHost, parse_bundle
from notary.protocol.voting import Tally, Threshold, Verdict, classify, tally
from notary.state import crypto

__all__ = [
    "DEFAULT_QUORUM",
    "MAX_RESPONSE_BYTES",
    "CheckReport",
    "NotaryAnswer",
    "SiteCertificate",
    "SiteUnreachable",
    "backend_text",
    "check",
    "consistency_text",
    "default_notary_dir",
    "fetch_certificate",
    "fetch_site",
    "load_bundles",
    "one_line",
]

DEFAULT_QUORUM = 3
DEFAULT_TIMEOUT_S = 10.0
#: The longest ``detail`` of a notary's row (a reason, on one line).
MAX_DETAIL_CHARS = 160


def one_line(text: str, limit: int | None = MAX_DETAIL_CHARS) -> str:
    """``text`` fit for one line of a terminal: every character that is not
    printable (newlines, escape sequences, ...) shown as ``?``, and at most
    ``limit`` characters (cut with ``...``; None: no limit)."""
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return "".join(c if c.isprintable() else "?" for c in text)


class SiteUnreachable(NotaryError):
    """The site's own certificate could not be fetched."""


@dataclass(frozen=True, slots=True)
class NotaryAnswer:
    """What one notary said. ``host``: the host that answered; ``via``: the
    relay notary's name if bounced; ``newest_seen``: the newest observation
    in its list (Unix seconds); ``seen_since``: since when it has seen the
    fingerprint asked about; ``backend``: which backend vouched, as the
    notary's signed v2 statement says (``"dane"`` or ``"perspective"``;
    None for a legacy answer or a v2 result without a statement). For v2
    answers ``detail`` describes the backend and its DANE evidence
    (:func:`backend_text`) and, for a site serving several certificates at
    once, its consistency (:func:`consistency_text`). ``consistency``: the
    signed summary of the site's current set (docs/v2.md, S8; None for a
    legacy answer, or a notary that sends none); ``observations``: what the
    notary's verified statement says it saw, each certificate with the
    addresses that served it (empty for a legacy answer)."""

    notary: str
    verdict: Verdict
    host: str | None = None
    status: int | None = None
    detail: str = ""
    via: str | None = None
    newest_seen: int | None = None
    seen_since: int | None = None
    backend: str | None = None
    consistency: Consistency | None = None
    observations: tuple[v2.StatementObservation, ...] = ()


@dataclass(frozen=True, slots=True)
class SiteCertificate:
    """The site's leaf certificate as this client fetched it (``der``) and
    the address its connection reached (normalised IP text)."""

    der: bytes
    address: str


@dataclass(frozen=True, slots=True)
class CheckReport:
    target: Target
    fingerprint: bytes
    threshold: Threshold
    strict: bool
    answers: tuple[NotaryAnswer, ...]
    tally: Tally
    #: Relays used, in order (more than one when a relay failed).
    relays: tuple[str, ...] = field(default=())


def default_notary_dir() -> Path:
    """Where ``notary bundle fetch`` keeps bundles and ``notary check`` looks:
    ``$XDG_CONFIG_HOME/notary/notaries`` (``~/.config/notary/notaries``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "notary" / "notaries"


def load_bundles(files: Sequence[Path], directory: Path | None) -> list[Bundle]:
    """The bundles in ``files`` and in ``directory`` (its ``*.notary``
    files), first of each name kept.

    Error handling: ``UsageError`` naming the file for an unreadable or
    invalid bundle, or a missing directory.
    """
    paths = list(files)
    if directory is not None:
        if not directory.is_dir():
            raise UsageError(f"notary directory {directory} does not exist")
        paths += sorted(p for p in directory.iterdir() if p.name.endswith(BUNDLE_SUFFIX))
    bundles: dict[str, Bundle] = {}
    for path in paths:
        try:
            bundle = parse_bundle(path.read_bytes())
        except OSError as exc:
            raise UsageError(f"cannot read bundle {path}: {exc.strerror}") from None
        except NotaryError as exc:
            raise UsageError(f"bundle {path}: {exc}") from None
        bundles.setdefault(bundle.name, bundle)
    return list(bundles.values())


async def fetch_certificate(
    target: Target, *, timeout_s: float, resolver: Resolver = system_resolver
) -> bytes:
    """The DER leaf certificate ``target`` serves to us now.

    Error handling: ``SiteUnreachable`` with a short reason.
    """
    return (await fetch_site(target, timeout_s=timeout_s, resolver=resolver)).der


async def fetch_site(
    target: Target, *, timeout_s: float, resolver: Resolver = system_resolver
) -> SiteCertificate:
    """The DER leaf certificate ``target`` serves to us now, and the address
    our connection reached.

    Error handling: ``SiteUnreachable`` with a short reason.
    """
    try:
        with trio.fail_after(timeout_s):
            tcp, address = await dial(
                target.host, target.port, policy=ANY_ADDRESS, resolver=resolver
            )
            name = None if target.is_ip_literal else target.host
            stream = trio.SSLStream(tcp, crypto.unverified_client_context(), server_hostname=name)
            try:
                await stream.do_handshake()
                der = stream.getpeercert(binary_form=True)
            finally:
                await trio.aclose_forcefully(stream)
    except trio.TooSlowError:
        raise SiteUnreachable(f"{target}: no TLS handshake within {timeout_s:g} s") from None
    except ProbeError as exc:
        raise SiteUnreachable(f"{target}: {exc}") from None
    except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
        raise SiteUnreachable(f"{target}: TLS handshake failed ({exc})") from None
    if not der:
        raise SiteUnreachable(f"{target}: no certificate presented")
    return SiteCertificate(der, address)


def _pick(
    bundles: Sequence[Bundle], quorum: int, relay: Bundle | str | None, rng: random.Random
) -> tuple[list[Bundle], list[Bundle]]:
    """(asked, relays in the order to try). ``relay``: a bundle, ``"auto"``
    (a random spare notary, if there is one) or None (no bouncing)."""
    if quorum < 1:
        raise UsageError("--quorum must be at least 1")
    pool = list(bundles)
    rng.shuffle(pool)
    if isinstance(relay, Bundle):
        pool = [b for b in pool if b.name != relay.name]
        return pool[:quorum], [relay]
    if relay != "auto" or len(pool) < 2:
        return pool[:quorum], []
    first_relay = pool.pop()
    asked = pool[:quorum]
    return asked, [first_relay, *pool[quorum:]]


async def check(
    target: Target,
    bundles: Sequence[Bundle],
    *,
    fingerprint: bytes | None = None,
    quorum: int = DEFAULT_QUORUM,
    threshold: Threshold = Threshold.MAJORITY,
    strict: bool = False,
    relay: Bundle | str | None = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    resolver: Resolver = system_resolver,
    rng: random.Random | None = None,
    use_v2: bool = False,
    checkpoints: CheckpointBook | None = None,
    witnesses: WitnessChoice | None = None,
) -> CheckReport:
    """Ask up to ``quorum`` of ``bundles`` about ``target`` and vote; with
    ``use_v2``, through the signed v2 API (Ed25519, nonce, freshness), the
    statements' log inclusion checked (docs/v2.md, rule S7) and, with
    ``checkpoints``, each notary's log held consistent with the checkpoint
    it showed before (``notary.client.checkpoints``), and each checkpoint
    cosigned as ``witnesses`` (default: each bundle's promise) require
    (``notary.client.witnesses``; the other notaries of ``bundles`` are
    asked what they witnessed when it is not). With ``use_v2`` and
    no ``fingerprint``, each question carries the address the client's own
    connection to the site reached (docs/v2.md, R4)."""
    if not bundles:
        raise UsageError("no notaries: give --notary FILE.notary or fetch bundles first")
    address = None
    if fingerprint is None:
        site = await fetch_site(target, timeout_s=timeout_s, resolver=resolver)
        fingerprint = hashlib.sha1(site.der).digest()
        address = site.address
    asked, relays = _pick(bundles, quorum, relay, rng or random.Random())
    if not asked:
        raise UsageError("the only notary given is the relay: give more notaries or --bounce off")
    answers: dict[str, NotaryAnswer] = {}
    choice = replace(witnesses or WitnessChoice(), peers=tuple(bundles)) if use_v2 else None

    async def ask(bundle: Bundle, through: Bundle | None, relay_failed: list[Bundle]) -> None:
        via = through.name if through else None
        try:
            with trio.fail_after(timeout_s):
                answer = await _ask(
                    bundle, target, fingerprint, through, resolver, use_v2, checkpoints, address,
                    choice,
                )
        except trio.TooSlowError:
            answer = NotaryAnswer(
                bundle.name, Verdict.CONNECTIVITY_FAILURE, detail="timed out", via=via
            )
        except RelayFailed:
            relay_failed.append(bundle)
            return
        except Exception as exc:
            # A defect this module does not foresee, in what one notary sent
            # or in its bundle, is still that notary's row, not the end of
            # the check (the other notaries' votes stand).
            answer = NotaryAnswer(
                bundle.name, Verdict.CONNECTIVITY_FAILURE,
                detail=f"unexpected error ({type(exc).__name__})", via=via,
            )
        answers[bundle.name] = replace(answer, detail=one_line(answer.detail))

    pending = list(asked)
    used: list[str] = []
    through = relays.pop(0) if relays else None
    while pending:
        relay_failed: list[Bundle] = []
        async with trio.open_nursery() as nursery:
            for bundle in pending:
                nursery.start_soon(ask, bundle, through, relay_failed)
        if through is not None:
            used.append(through.name)
        pending = relay_failed
        if pending and not relays:  # every relay failed for these: never go direct
            for bundle in pending:
                answers[bundle.name] = NotaryAnswer(
                    bundle.name, Verdict.CONNECTIVITY_FAILURE, detail="no relay could reach it"
                )
            break
        through = relays.pop(0) if relays else None
    ordered = tuple(answers[b.name] for b in asked)
    return CheckReport(
        target=target,
        fingerprint=fingerprint,
        threshold=threshold,
        strict=strict,
        answers=ordered,
        tally=tally((a.verdict for a in ordered), threshold, strict=strict),
        relays=tuple(used),
    )


async def _ask(
    bundle: Bundle,
    target: Target,
    fingerprint: bytes,
    relay: Bundle | None,
    resolver: Resolver,
    use_v2: bool = False,
    checkpoints: CheckpointBook | None = None,
    address: str | None = None,
    witnesses: WitnessChoice | None = None,
) -> NotaryAnswer:
    via = relay.name if relay is not None else None
    try:
        if use_v2:
            return await _ask_v2(
                bundle, target, fingerprint, relay, resolver, checkpoints, address, witnesses
            )
        form = f"fingerprint={convergence.format_fingerprint(fingerprint)}"
        response, host = await exchange(bundle, relay, resolver, lambda host: http_request(
            "POST", f"/target/{format_convergence_target(target)}", host,
            form.encode("ascii"), b"application/x-www-form-urlencoded",
        ))
    except NotaryFailed as failed:
        return NotaryAnswer(
            bundle.name, Verdict.CONNECTIVITY_FAILURE,
            host=failed.host.host if failed.host else None, detail=failed.detail, via=via,
        )
    return _judge(bundle, host, response.status, response.body, fingerprint, via)


async def _v2_keys(
    bundle: Bundle, relay: Bundle | None, resolver: Resolver
) -> tuple[dict[str, Ed25519PublicKey], BundleHost]:
    """The v2 keys of the host of ``bundle`` that answers, fetched over its
    pinned connection (only the key its bundle pins, if it pins one)."""
    keys_response, host = await exchange(
        bundle, relay, resolver, lambda h: http_request("GET", "/v2/key", h)
    )
    if keys_response.status != 200:
        raise NotaryFailed(f"no v2 API (HTTP {keys_response.status})", host)
    try:
        published = v2.parse_key_document(keys_response.body)
    except PeerError as exc:
        raise NotaryFailed(str(exc), host) from None
    pinned = host.v2_key_raw
    if pinned is not None:  # the bundle pins the v2 key: trust that one only
        published = tuple(k for k in published if k.public_key_raw == pinned)
        if not published:
            raise NotaryFailed("v2 key does not match the bundle's v2_key", host)
    return v2.trusted_keys(published, now=int(time.time())), host


async def _ask_v2(
    bundle: Bundle, target: Target, fingerprint: bytes, relay: Bundle | None, resolver: Resolver,
    checkpoints: CheckpointBook | None = None, address: str | None = None,
    witnesses: WitnessChoice | None = None,
) -> NotaryAnswer:
    """The v2 API: the notary's keys over the pinned connection, then a
    signed, nonce-bound answer, verified (signatures, freshness, nonce, the
    statement's log inclusion and the log's consistency). ``address``: the
    one our connection to the site reached, sent with the question (None:
    not sent, the fingerprint was given)."""
    via = relay.name if relay is not None else None
    keys, host = await _v2_keys(bundle, relay, resolver)
    nonce = secrets.token_hex(16)
    entry: dict[str, object] = {
        "host": target.host, "port": target.port, "sha1": fingerprint.hex()
    }
    if address is not None:
        entry["address"] = address
    document = json.dumps({"targets": [entry], "nonce": nonce}).encode("ascii")
    one_host = replace(bundle, hosts=(host,))  # the host whose keys we hold
    response, host = await exchange(one_host, relay, resolver, lambda h: http_request(
        "POST", "/v2/query", h, document, b"application/json"
    ))
    if response.status != 200:
        return NotaryAnswer(
            bundle.name, Verdict.CONNECTIVITY_FAILURE, host=host.host, status=response.status,
            detail=f"HTTP {response.status}", via=via,
        )
    query = v2.TargetQuery(target, sha1=fingerprint, address=address)
    try:
        parsed = v2.parse_answer_document(response.body)
        (result,) = v2.verify_answer(
            parsed, keys, nonce=nonce, now=int(time.time()), queries=[query],
        )
    except PeerError as exc:
        return NotaryAnswer(
            bundle.name, Verdict.FAILURE, host=host.host, status=200,
            detail=f"bad signed answer: {exc}", via=via,
        )
    try:
        log_words = await check_log(
            one_host, relay, resolver, parsed, keys, checkpoints, witnesses
        )
    except LogFailed as failed:
        return NotaryAnswer(
            bundle.name, failed.verdict, host=host.host, status=200,
            detail=f"log: {failed.detail}", via=via,
        )
    matching = [o for o in result.observations if o.sha1 == fingerprint]
    words = [] if result.verdict == v2.VERDICT_MATCH else [result.verdict]
    backend = None
    if result.valid_until is not None:  # a statement came: it says who vouched
        verification = result.verification
        backend = verification.backend if verification is not None else "perspective"
        words.append(backend_text(
            verification, now=int(time.time()), asked=[o.sha256 for o in matching]
        ))
    served = consistency_text(result.consistency)
    if served:
        words.append(served)
    if log_words:
        words.append(log_words)
    return NotaryAnswer(
        bundle.name, _V2_VERDICTS[result.verdict], host=host.host, status=200,
        detail="; ".join(words), via=via,
        newest_seen=max((o.last_seen for o in result.observations), default=None),
        seen_since=min((o.first_seen for o in matching), default=None),
        backend=backend,
        consistency=result.consistency,
        observations=result.observations,
    )


def consistency_text(consistency: Consistency | None) -> str:
    """A site serving several certificates at once, in a few words for the
    row of a notary (docs/v2.md, S8): ``split site: 3 certificates at 4
    addresses`` (each address serves one of them), ``rotating site: 2
    certificates at 1 address`` (an address serves several, per connection
    or while a new certificate spreads); "" for a stable site or none
    stated. The addresses counted are those the statement lists (at most
    ``v2.MAX_CONSISTENCY_ADDRESSES``)."""
    if consistency is None or consistency.kind is ConsistencyKind.STABLE:
        return ""
    certificates, addresses = consistency.certificates, len(consistency.addresses)
    return (
        f"{consistency.kind.value} site: {certificates} certificate"
        f"{'' if certificates == 1 else 's'} at {addresses} address"
        f"{'' if addresses == 1 else 'es'}"
    )


#: How a DANE outcome reads in a row (the match has its own wording).
_DANE_WORDS = {
    "mismatch": "mismatch",
    "no-tlsa": "no TLSA",
    "insecure": "zone not signed",
    "bogus": "DNSSEC validation failed",
    "resolver-failure": "no answer from the resolver",
}


def backend_text(
    verification: v2.ParsedVerification | None, *, now: int,
    asked: Sequence[bytes] | None = None,
) -> str:
    """One line saying which backend vouched in a verified v2 statement
    (docs/v2.md, rule S6), for the row of a notary:

    - ``network perspective``: the notary sent no ``verification``;
    - ``DANE: match, TLSA 3 1 1 0123456789abcdef..., checked 12 s ago``:
      DANE decided, and the record shown vouched for the certificate asked
      about (``asked``: the SHA-256 of the observations with the
      fingerprint asked about, if given; the main certificate judged, or
      one of the others the evidence judged: rule S6's ``judged``), or
      for the main one ``for another certificate`` when it vouched for
      none of ``asked``;
    - ``DANE: mismatch, 2 TLSA records, checked 12 s ago``, ``DANE: no
      TLSA, ...``, ``DANE: zone not signed, ...``: DANE decided otherwise;
    - ``DANE: no TLSA; network perspective decided`` (or ``zone not
      signed``): the perspective decided because DANE could not.
    """
    if verification is None:
        return "network perspective"
    dane = verification.dane
    if verification.backend != "dane":
        if dane is None:
            return "network perspective (DANE not checked)"
        return f"DANE: {_DANE_WORDS.get(dane.outcome, dane.outcome)}; network perspective decided"
    if dane is None:
        return "DANE: not checked yet"
    checked = f"checked {max(0, now - dane.checked_at)} s ago"
    record = dane.matched_record
    if record is not None:
        other = ""
        if asked is not None:
            vouched = [found for found in map(dane.record_for, asked) if found is not None]
            if vouched:
                record = vouched[0]
            else:
                other = " for another certificate"
        data = record.data.hex()
        shown = f"{record.usage} {record.selector} {record.matching_type} {data[:16]}"
        shown += "..." if len(data) > 16 else ""
        return f"DANE: match{other}, TLSA {shown}, {checked}"
    if dane.outcome == "mismatch":
        count = len(dane.tlsa)
        return f"DANE: mismatch, {count} TLSA record{'' if count == 1 else 's'}, {checked}"
    return f"DANE: {_DANE_WORDS.get(dane.outcome, dane.outcome)}, {checked}"


#: A verified v2 verdict as a vote (PROTOCOLS 1.7 semantics): a notary that
#: answered but cannot vouch either way stands aside like a 303.
_V2_VERDICTS = {
    v2.VERDICT_MATCH: Verdict.SUCCESS,
    v2.VERDICT_MISMATCH: Verdict.FAILURE,
    v2.VERDICT_UNKNOWN: Verdict.INCONCLUSIVE,
    v2.VERDICT_UNREACHABLE: Verdict.INCONCLUSIVE,
    v2.VERDICT_REFUSED: Verdict.INCONCLUSIVE,
}


def _judge(
    bundle: Bundle,
    host: BundleHost,
    status: int,
    body: bytes,
    fingerprint: bytes,
    via: str | None,
) -> NotaryAnswer:
    listed = signature_ok = False
    newest = since = None
    detail = f"HTTP {status}"
    if status in (200, 409):
        try:
            parsed = convergence.parse_answer(body)
        except PeerError as exc:
            detail = str(exc).replace("malformed notary answer", "malformed answer", 1)
        else:
            key = host.certificate.public_key()
            signature_ok = crypto.verify_convergence_signature(
                key, parsed.payload, parsed.signature_b64
            )
            detail = "" if signature_ok else "bad signature"
            matching = [e for e in parsed.entries if e.sha1 == fingerprint]
            listed = bool(matching)
            if parsed.entries:
                newest = max(e.finish for e in parsed.entries)
            if matching:
                since = min(e.start for e in matching)
    verdict = classify(status, listed=listed, signature_ok=signature_ok)
    if verdict is Verdict.FAILURE and not detail:
        detail = "sees another certificate"
    elif verdict is Verdict.INCONCLUSIVE:  # 303: neither vouches nor objects
        reason = _inconclusive_reason(body)
        detail = f"inconclusive (HTTP {status}){': ' + reason if reason else ''}"
    return NotaryAnswer(
        bundle.name, verdict, host=host.host, status=status, detail=detail, via=via,
        newest_seen=newest, seen_since=since,
    )


#: The longest 303 body whose text is shown as the notary's reason.
MAX_REASON_BYTES = 512


def _inconclusive_reason(body: bytes) -> str:
    """The first line of a 303's body, the notary's reason (a DANE notary
    says "inconclusive: the site publishes no TLSA records ..."), on one
    line; "" for an empty, long or non-UTF-8 body."""
    if len(body) > MAX_REASON_BYTES:
        return ""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    first = text.strip().split("\n", 1)[0].strip()
    if first.lower().startswith("inconclusive:"):
        first = first[len("inconclusive:"):].strip()
    return one_line(first, limit=MAX_DETAIL_CHARS // 2) if first else ""


# -- watching (v2 WebSocket) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A notary saw a new certificate for a watched target (verified)."""

    notary: str
    target: Target
    observations: tuple[v2.StatementObservation, ...]
    signed_at: int


async def watch(
    bundle: Bundle,
    targets: Sequence[Target],
    *,
    on_event: Callable[[WatchEvent], None],
    resolver: Resolver = system_resolver,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_watching: Callable[[Target], None] | None = None,
) -> None:
    """Watch ``targets`` on ``bundle``'s notary until cancelled: every
    verified ``observation`` event for a watched target is given to
    ``on_event``. Everything up to the WebSocket handshake's end is under
    ``timeout_s``; then the watch lasts until cancelled, kept alive by pings.

    Error handling: ``WatchFailed`` (one line) when the notary cannot be
    reached, refuses a watch, or closes the connection; an event that is not
    strict JSON of the expected shape (:mod:`notary.protocol.strictjson`,
    at most :data:`WATCH_MAX_MESSAGE_BYTES`) or does not verify ends the
    watch too (the notary or the path to it misbehaves).
    """
    try:
        with trio.fail_after(timeout_s):
            keys, host = await _v2_keys(bundle, None, resolver)
            tcp, host = await connect_direct(replace(bundle, hosts=(host,)), resolver)
            stream = await pinned_tls(bundle, host, tcp)
            authority = host_authority(wire_host(host))
    except trio.TooSlowError:
        raise WatchFailed(f"{bundle.name}: no answer within {timeout_s:g} s") from None
    except (NotaryFailed, PeerError) as exc:
        raise WatchFailed(f"{bundle.name}: {one_line(str(exc))}") from None
    failure: WatchFailed | None = None
    try:
        async with trio.open_nursery() as nursery:
            # Failures are caught in the body: a nursery would wrap them in
            # exception groups.
            try:
                with trio.fail_after(timeout_s):
                    ws = await trio_websocket.wrap_client_stream(
                        nursery, stream, authority, "/v2/ws",
                        max_message_size=WATCH_MAX_MESSAGE_BYTES,
                    )
                lost: list[str] = []
                watching = trio.CancelScope()
                nursery.start_soon(_keep_alive, ws, timeout_s, watching, lost)
                with watching:
                    await _watch_loop(ws, bundle, targets, keys, on_event, on_watching)
                if lost:
                    failure = WatchFailed(f"{bundle.name}: no answer to a ping")
            except WatchFailed as exc:
                failure = exc
            except trio.TooSlowError:
                failure = WatchFailed(
                    f"{bundle.name}: no WebSocket handshake within {timeout_s:g} s"
                )
            except trio_websocket.ConnectionClosed as closed:
                reason = one_line(str(closed.reason))
                failure = WatchFailed(f"{bundle.name}: connection closed ({reason})")
            except (trio_websocket.HandshakeError, trio.BrokenResourceError) as exc:
                reason = one_line(str(exc) or "connection failed")
                failure = WatchFailed(f"{bundle.name}: {reason}")
            except PeerError as exc:
                failure = WatchFailed(f"{bundle.name}: bad event ({one_line(str(exc))})")
            nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
    if failure is not None:
        raise failure


#: A watch pings the notary this often; no pong within the connect timeout
#: ends it (a notary that vanished without closing is noticed).
WATCH_PING_INTERVAL_S = 60.0
#: The largest WebSocket message a watch accepts (larger: the watch ends).
WATCH_MAX_MESSAGE_BYTES = 1024 * 1024


async def _keep_alive(
    ws: trio_websocket.WebSocketConnection,
    timeout_s: float,
    watch_scope: trio.CancelScope,
    lost: list[str],
) -> None:
    """Ping the notary; without a pong in time, end the watch (``lost``)."""
    with contextlib.suppress(trio_websocket.ConnectionClosed):
        while True:
            await trio.sleep(WATCH_PING_INTERVAL_S)
            with trio.move_on_after(timeout_s) as scope:
                await ws.ping()
            if scope.cancelled_caught:
                lost.append("no pong")
                watch_scope.cancel()
                return


async def _watch_loop(
    ws: trio_websocket.WebSocketConnection,
    bundle: Bundle,
    targets: Sequence[Target],
    keys: dict[str, Ed25519PublicKey],
    on_event: Callable[[WatchEvent], None],
    on_watching: Callable[[Target], None] | None,
) -> None:
    pending = {target.key: target for target in targets}
    watched = set(pending)
    for index, target in enumerate(targets):
        await ws.send_message(json.dumps(
            {"type": "watch", "id": index, "host": target.host, "port": target.port}
        ))
    while True:
        event = _parse_event(await ws.get_message())
        kind = event["type"]
        if kind == "watching":
            key = event.get("target")
            if isinstance(key, str) and key in pending and on_watching is not None:
                on_watching(pending.pop(key))
        elif kind == "error":
            reason = event.get("message")
            reason = one_line(reason) if isinstance(reason, str) else "no reason given"
            raise WatchFailed(f"{bundle.name}: the notary refused: {reason}")
        elif kind == "observation":
            parsed = v2.verify_statement(event.get("statement"), keys, now=int(time.time()))
            if parsed.target.key in watched:  # what was not asked for is not shown
                on_event(
                    WatchEvent(bundle.name, parsed.target, parsed.observations, parsed.signed_at)
                )


def _parse_event(message: str | bytes) -> dict[str, object]:
    """A WebSocket message from the notary: a strict JSON object with a
    string ``type``.

    Error handling: ``ProtocolError`` (502) for anything else.
    """
    data = message.encode("utf-8", "surrogatepass") if isinstance(message, str) else message
    try:
        event = strictjson.loads(data)
    except ValueError:
        raise ProtocolError("not strict UTF-8 JSON", status=502) from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ProtocolError("not an object with a type", status=502)
    return event


class WatchFailed(NotaryError):
    """A watch could not be started or ended."""
