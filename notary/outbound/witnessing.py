"""Witness cosignatures for the notary's log (C2SP tlog-witness, the
log's side; docs/log.md "Witnesses"): a Trio task beside the log's appender
that submits the log's checkpoints to the witnesses of ``[log] witnesses``
and keeps the cosignatures they return in the store
(``notary.state.logcosignatures``), from where every worker serves them
(``notary.outbound.cosigned``).

Each witness has a task of its own in every worker, but only the worker
holding that witness's turn in the store submits (the turn is renewed at
each round and lapses a little after its holder stops: another takes it),
so each checkpoint goes to each witness once per notary, however many
workers and nodes share the log. The holder reads the log's newest
checkpoint every ``interval_s`` (and as soon as its own appender sequenced
a batch) and, when it is not the one the witness last cosigned, posts
``add-checkpoint`` with a consistency proof from the size the witness
holds. That size is kept with the turn; a 409 answers with the size the
witness really holds, and the request is made again once from there (the
spec's way of learning it). A cosignature is kept only if it verifies with
the witness's configured key over this checkpoint.

Bounds and failures: each exchange (connect, TLS, request, answer) runs
under ``witness_timeout_s``; an answer is read up to
``MAX_RESPONSE_BYTES``. A witness that fails (unreachable, its pin does
not match, a malformed answer or an unexpected status, 1xx included, an
invalid cosignature or one dated more than ``MAX_COSIGNATURE_AHEAD_S``
ahead of this notary's clock, a 409 with a size this log cannot prove
from) is logged and asked again after a delay doubling up to
``witness_retry_s`` (the holder keeps its turn meanwhile). Whatever else
goes wrong in one witness's exchange (a bug) is logged with its traceback
and handled the same way: nothing a witness answers ends the notary.
Nothing here waits on the appender's path: appends never wait for
witnesses.

TLS: a witness is a notary; its certificate is pinned by SHA-1 (``pin``),
as bundles pin notaries, and nothing else about it is verified.

Resource handling: ``run`` owns the per-witness tasks; each exchange opens
and closes its own connection (``Connection: close``). Whoever starts
``run`` (``app.serve``) owns it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import secrets
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from notary.config import LogWitness
from notary.errors import ProtocolError, StoreError
from notary.outbound.logappender import LogAppender
from notary.protocol import tlog
from notary.protocol.http import parse_response
from notary.state import crypto
from notary.state.logcosignatures import StoredCosignature

__all__ = ["MAX_RESPONSE_BYTES", "LogWitnesses"]

log = logging.getLogger(__name__)

#: The largest answer read from a witness.
MAX_RESPONSE_BYTES = 64 * 1024
#: How far ahead of this notary's clock a cosignature may be dated (clock
#: skew): a later date would make the checkpoint look freshly witnessed to
#: clients long after the witness last saw it.
MAX_COSIGNATURE_AHEAD_S = 600


class _WitnessFailed(Exception):
    """One exchange with a witness failed; the message says how."""


@dataclass(slots=True)
class _Witness:
    """One configured witness, and what this task knows of it."""

    name: str
    key_id: bytes
    #: Its cosigner vkey, as configured: what the store keys it by.
    vkey: str
    verifiers: dict[tuple[str, bytes], tlog.Verify]
    host: str
    port: int
    path: str
    pin: bytes
    #: The size the witness is believed to hold for this log.
    size: int = 0
    #: Whether this process holds the witness's turn (as of the last round).
    has_turn: bool = False


def _witness(entry: LogWitness) -> _Witness:
    name, key_id, _ = tlog.parse_cosigner_key(entry.key)
    url = urlsplit(entry.url)
    assert url.hostname is not None  # checked with the config
    return _Witness(
        name=name, key_id=key_id, vkey=entry.key, verifiers=tlog.cosignature_verifiers([entry.key]),
        host=url.hostname, port=url.port or 443,
        path=url.path.rstrip("/") + "/add-checkpoint",
        pin=bytes.fromhex(entry.pin.replace(":", "")),
    )


class LogWitnesses:
    """See the module docstring. ``appender``: the log's (its reader gives
    the newest checkpoint and the proofs, and keeps the turns and the
    cosignatures); ``witnesses``: ``[log] witnesses``; ``on_cosigned``:
    told after each cosignature is stored (``CosignedCheckpoints.poke``)."""

    def __init__(
        self, appender: LogAppender, witnesses: Sequence[LogWitness], *, interval_s: float,
        timeout_s: float, retry_s: float, clock: Callable[[], float] = time.time,
        on_cosigned: Callable[[], None] | None = None,
    ) -> None:
        self._log = appender
        self._clock = clock
        self._witnesses = [_witness(entry) for entry in witnesses]
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._on_cosigned = on_cosigned
        #: This process's name in the witnesses' turns.
        self.holder = f"{os.getpid()}-{secrets.token_hex(6)}"
        #: Cosignatures received, failed exchanges, and submissions made
        #: (one per checkpoint and witness, retries included), by this worker.
        self.cosignatures = 0
        self.failures = 0
        self.submissions = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve every witness, each in its own task, until cancelled."""
        async with trio.open_nursery() as nursery:
            for witness in self._witnesses:
                nursery.start_soon(self._serve_witness, witness)
            task_status.started()

    def _lease_ms(self, delay: float) -> int:
        """How long a turn is taken for: past the next round, and past an
        exchange that takes all its time."""
        return int(1000 * (max(delay, self._interval_s) + self._timeout_s + self._interval_s))

    async def _serve_witness(self, witness: _Witness) -> None:
        delay = 0.0
        while True:
            with trio.move_on_after(delay or self._interval_s):
                if not delay:
                    await self._log.wait_appended()  # at once after a batch of ours
                else:
                    await trio.sleep_forever()
            now_ms = int(self._clock() * 1000)
            try:
                turn = await self._log.take_witness_turn(
                    witness.vkey, self.holder, now_ms, now_ms + self._lease_ms(delay)
                )
                if turn is None:
                    witness.has_turn = False
                    delay = 0.0
                    continue
                if not witness.has_turn:
                    witness.has_turn, witness.size = True, turn.held_size
                head = await self._log.read_head()
            except StoreError as exc:
                log.warning("log: witness %s: %s", witness.name, exc)
                continue
            if head is None or head.size == witness.size:
                # Cosigned already (or nothing to cosign): a log's checkpoint
                # of a size is the same note whoever signed it.
                delay = 0.0
                continue
            try:
                with trio.fail_after(self._timeout_s):
                    line = await self._submit(witness, head.size, head.checkpoint)
                await self._log.add_cosignature(
                    StoredCosignature(head.size, witness.vkey, head.checkpoint, line)
                )
                await self._log.record_witness_size(witness.vkey, self.holder, head.size)
            except Exception as exc:
                self.failures += 1
                delay = min(max(2 * delay, self._interval_s), self._retry_s)
                if isinstance(exc, _WitnessFailed | trio.TooSlowError | StoreError):
                    reason = str(exc) or "timed out"
                    log.warning("log: witness %s: %s; asking again in %gs", witness.name, reason, delay)
                else:
                    log.exception("log: witness %s: unexpected error; asking again in %gs",
                                  witness.name, delay)
                continue
            delay = 0.0
            witness.size = head.size
            self.cosignatures += 1
            if self._on_cosigned is not None:
                self._on_cosigned()

    async def _submit(self, witness: _Witness, size: int, note: str) -> str:
        """The witness's verified cosignature line of ``note`` (the tree of
        ``size`` leaves); ``_WitnessFailed`` otherwise."""
        for _ in range(2):  # once more after a 409 told the size held
            if witness.size > size:
                raise _WitnessFailed(
                    f"it holds {witness.size} leaves, more than this checkpoint's {size}"
                )
            proof = []
            if 0 < witness.size < size:
                proof = await self._log.read_consistency_proof(witness.size, size)
            body = tlog.format_add_checkpoint(witness.size, proof, note)
            self.submissions += 1
            status, content_type, answer = await self._post(witness, body)
            if status == 409 and content_type == tlog.SIZE_CONTENT_TYPE.encode("ascii"):
                witness.size = _held_size(answer)
                continue
            if status != 200:
                raise _WitnessFailed(f"answered {status}")
            return _cosignature(witness, note, answer, not_after=self._clock() + MAX_COSIGNATURE_AHEAD_S)
        raise _WitnessFailed("answered 409 twice")

    async def _post(self, witness: _Witness, body: bytes) -> tuple[int, bytes, bytes]:
        """POST ``body`` to the witness over TLS pinned to its certificate;
        (status, content type, body). ``_WitnessFailed`` otherwise."""
        authority = f"[{witness.host}]" if ":" in witness.host else witness.host
        request = (
            f"POST {witness.path} HTTP/1.1\r\nHost: {authority}:{witness.port}\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("ascii") + body
        try:
            tcp = await trio.open_tcp_stream(witness.host, witness.port)
        except OSError as exc:
            raise _WitnessFailed(f"cannot connect ({exc.strerror or exc})") from None
        stream = trio.SSLStream(
            tcp, crypto.unverified_client_context(), https_compatible=True,
            server_hostname=None if _is_address(witness.host) else witness.host,
        )
        try:
            await stream.do_handshake()
            der = stream.getpeercert(binary_form=True) or b""
            if hashlib.sha1(der).digest() != witness.pin:
                raise _WitnessFailed("its certificate does not match the pin")
            await stream.send_all(request)
            data = bytearray()
            while chunk := await stream.receive_some(16 * 1024):
                data += chunk
                if len(data) > MAX_RESPONSE_BYTES:
                    raise _WitnessFailed("answer too large")
        except (trio.BrokenResourceError, ssl.SSLError, OSError):
            raise _WitnessFailed("connection failed") from None
        finally:
            await trio.aclose_forcefully(stream)
        try:
            response = parse_response(bytes(data))
        except ProtocolError as exc:
            raise _WitnessFailed(exc.message) from None
        content_type = (response.header(b"content-type") or b"").split(b";")[0].strip()
        return response.status, content_type, response.body


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _held_size(body: bytes) -> int:
    """The size in a 409's ``text/x.tlog.size`` body; ``_WitnessFailed``."""
    text = body.decode("ascii", "replace")
    if not text.endswith("\n") or not text[:-1].isdigit() or len(text) > 20:
        raise _WitnessFailed("answered 409 without a size")
    if text != "0\n" and text.startswith("0"):
        raise _WitnessFailed("answered 409 without a size")
    return int(text[:-1])


def _cosignature(witness: _Witness, note: str, answer: bytes, *, not_after: float) -> str:
    """The witness's line among the signature lines of ``answer``, verified
    over ``note``'s checkpoint and dated at most ``not_after``;
    ``_WitnessFailed`` when none is."""
    text = note[: note.rfind("\n\n") + 1]
    try:
        lines = answer.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        raise _WitnessFailed("its answer is not UTF-8") from None
    for line in lines[: tlog.MAX_NOTE_SIGNATURES]:
        try:
            cosignature = tlog.parse_cosignature_line(line)
        except tlog.NoteError:
            continue  # another type of signature (or key) than configured
        if (cosignature.name, cosignature.key_id) != (witness.name, witness.key_id):
            continue
        try:
            tlog.open_note(text + "\n" + cosignature.line(), witness.verifiers)
        except tlog.NoteError as exc:
            raise _WitnessFailed(f"its cosignature is invalid ({exc})") from None
        if cosignature.timestamp > not_after:
            raise _WitnessFailed(
                f"its cosignature is dated {cosignature.timestamp}, ahead of this "
                f"notary's clock by more than {MAX_COSIGNATURE_AHEAD_S} s"
            )
        return cosignature.line()
    raise _WitnessFailed("its answer holds no cosignature by its key")
