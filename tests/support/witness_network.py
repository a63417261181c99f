"""Notaries that witness each other's logs, for tests (issue 34): each
``Member`` of a network is planned before any starts (its TLS certificate,
its v2 key and its API socket, bound on loopback at once), so every member's
``[log] witnesses`` can name the others' URLs, cosigner keys and pins, and
its ``[witness] logs`` their log keys. ``open_member`` serves one;
``Member.bundle`` is what a client trusts of it.

``Member.impostor`` plans a notary with the same v2 key and log origin but
its own database, certificate and port: the same notary forking its log
for a victim (whose bundle of that notary points at the impostor).
"""

from __future__ import annotations

import base64
import hashlib
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding

from notary.config import Endpoint
from notary.protocol import tlog
from notary.protocol.bundle import Bundle, BundleHost, BundleLog, make_bundle
from notary.server.sockets import bind_endpoint
from notary.state import crypto
from tests.support.notaries import LOCALHOST, NotaryUnderTest, open_notary

#: A member's [log] settings (fast, so tests do not wait).
LOG = {"checkpoint_interval_s": 0.1, "max_merge_delay_s": 30, "witness_timeout_s": 2.0,
       "witness_retry_s": 0.5, "witness_wait_s": 5.0}


@dataclass
class Member:
    """One planned notary of a network (see the module docstring)."""

    name: str
    directory: Path
    v2_key: Path
    tls_key: Path
    tls_cert: Path
    pem: str
    sockets: dict[str, list[socket.socket]] = field(repr=False)
    #: The API's port (its socket bound at plan time).
    port: int = 0

    @property
    def public_raw(self) -> bytes:
        return crypto.ed25519_public_raw(crypto.load_ed25519_private_key(self.v2_key))

    @property
    def origin(self) -> str:
        return f"{self.name}.test/v2/log"

    @property
    def witness_name(self) -> str:
        return f"{self.name}.test/witness"

    @property
    def log_vkey(self) -> str:
        return tlog.verifier_key(self.origin, self.public_raw)

    @property
    def witness_vkey(self) -> str:
        return tlog.cosigner_key(self.witness_name, self.public_raw)

    @property
    def pin(self) -> str:
        der = crypto.load_certificate(self.tls_cert).public_bytes(Encoding.DER)
        return hashlib.sha1(der).hexdigest()

    def witness_entry(self) -> dict[str, str]:
        """This member as a ``[log] witnesses`` entry of another."""
        return {"url": f"https://{LOCALHOST}:{self.port}/v2/witness",
                "key": self.witness_vkey, "pin": self.pin}

    def bundle(self, witnesses: Sequence[Member], min_witnesses: int) -> Bundle:
        """What a client trusts of this member: its host, v2 key and log,
        with ``witnesses`` promised, ``min_witnesses`` of them."""
        return make_bundle(
            name=f"Notary {self.name}", location=f"https://{LOCALHOST}/{self.name}.notary",
            hosts=[replace(BundleHost(LOCALHOST, self.port, 80, self.pem),
                           v2_key=base64.b64encode(self.public_raw).decode())],
            log=BundleLog.of(self.origin, self.public_raw, tuple(w.witness_vkey for w in witnesses),
                             min_witnesses=min_witnesses),
        )

    def impostor(self, directory: Path) -> Member:
        """The same notary (v2 key, so log key and origin) on another
        database, certificate and port."""
        planned = plan_member(self.name, directory)
        planned.v2_key = self.v2_key
        return planned


def plan_member(name: str, directory: Path) -> Member:
    directory.mkdir(parents=True, exist_ok=True)
    v2_key = directory / "v2.key"
    crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
    tls = directory / "tls"
    tls.mkdir()
    key = crypto.generate_rsa_key()
    cert = crypto.make_self_signed_certificate(key, LOCALHOST)
    pem = crypto.certificate_pem(cert)
    crypto.write_new_file(tls / "notary.key", crypto.private_key_pem(key), mode=0o600)
    crypto.write_new_file(tls / "notary.crt", pem, mode=0o644)
    sockets = {role: bind_endpoint(Endpoint(LOCALHOST, 0)) for role in ("api", "relay", "admin")}
    sockets.update(plain_api=[], perspectives=[])
    return Member(name, directory, v2_key, tls / "notary.key", tls / "notary.crt",
                  pem.decode("ascii"), sockets, sockets["api"][0].getsockname()[1])


def plan_network(directory: Path, names: Sequence[str]) -> dict[str, Member]:
    return {name: plan_member(name, directory / name) for name in names}


@asynccontextmanager
async def open_member(
    member: Member, *, witnesses: Sequence[Member], witnessed: Sequence[Member],
    sites: Mapping[str, Sequence[str]], min_cosignatures: int = 0,
    log: Mapping[str, Any] | None = None, store: Mapping[str, Any] | None = None,
    db_file: Path | None = None, shared_store: bool = False, run_dir: Path | None = None,
) -> AsyncIterator[NotaryUnderTest]:
    """Serve ``member``, its log cosigned by ``witnesses`` (``min_cosignatures``
    promised) and witnessing the logs of ``witnessed``. ``store``,
    ``db_file``, ``shared_store``: for workers sharing a store (``run_dir``
    then keeps each worker's own files apart)."""
    sections: dict[str, Any] = {
        "log": {**LOG, "enabled": True, "origin": member.origin,
                "witnesses": tuple(w.witness_entry() for w in witnesses),
                "min_cosignatures": min_cosignatures, **(log or {})},
        "v2": {"key_file": member.v2_key},
        "answers": {"failures_at_deadline": False},
    }
    if witnessed:
        sections["witness"] = {"enabled": True, "name": member.witness_name,
                               "logs": tuple(w.log_vkey for w in witnessed)}
    if store is not None:
        sections["store"] = dict(store)
    server: dict[str, Any] = {"key_file": member.tls_key, "cert_file": member.tls_cert}
    if db_file is not None:
        server["db_file"] = db_file
    async with open_notary(
        run_dir or member.directory / "run", names=sites, server=server,
        sockets=member.sockets, shared_store=shared_store, **sections,
    ) as notary:
        yield notary
