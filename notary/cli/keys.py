"""The notary's keys: ``keygen`` (its TLS key and certificate, its
Perspectives key, its v2 key), ``keys`` (the public keys its clients and
peers check it with) and ``perspectives-entry`` (its line in a Perspectives
client's notary list)."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

from notary.config import load_config
from notary.errors import UsageError
from notary.state import crypto


def add_keygen(commands: argparse._SubParsersAction) -> None:
    keygen = commands.add_parser("keygen", help="make an RSA-2048 key and self-signed certificate")
    keygen.add_argument("--out-key", type=Path, required=True)
    keygen.add_argument("--out-cert", type=Path)
    keygen.add_argument("--name", help="host name or IP the certificate names")
    keygen.add_argument(
        "--perspectives", action="store_true",
        help="make the Perspectives signing key instead (RSA, no certificate)",
    )
    keygen.add_argument(
        "--v2", action="store_true", help="make the v2 API signing key instead (Ed25519)"
    )
    keygen.add_argument("--days", type=int, default=crypto.DEFAULT_CERTIFICATE_DAYS)
    keygen.add_argument("--force", action="store_true", help="overwrite existing files")


def add_perspectives_entry(commands: argparse._SubParsersAction) -> None:
    entry = commands.add_parser(
        "perspectives-entry", help="this notary's entry for a Perspectives client's notary list"
    )
    entry.add_argument("--config", type=Path, required=True)
    entry.add_argument("--host-port", required=True, metavar="HOST:PORT",
                       help="where clients reach the Perspectives port")


def add_keys(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser(
        "keys", help="the notary's public keys: v2, its log's verifier key, its witness key"
    )
    keys.add_argument("--config", type=Path, required=True)


def cmd_keygen(args: argparse.Namespace) -> int:
    if args.perspectives and args.v2:
        raise UsageError("keygen: --perspectives or --v2, not both")
    if (args.perspectives or args.v2) and (args.out_cert is not None or args.name is not None):
        flag = "--perspectives" if args.perspectives else "--v2"
        raise UsageError(f"keygen {flag} makes a key only: drop --out-cert and --name")
    if args.v2:
        if args.out_key.exists() and not args.force:
            raise UsageError(f"{args.out_key} exists; pass --force to overwrite it")
        signing_key = crypto.generate_ed25519_key()
        crypto.write_ed25519_private_key(args.out_key, signing_key, force=args.force)
        key_id = crypto.ed25519_key_id(crypto.ed25519_public_raw(signing_key))
        print(f"wrote {args.out_key} (mode 0600): Ed25519, key id {key_id}")
        return 0
    if args.perspectives:
        if args.out_key.exists() and not args.force:
            raise UsageError(f"{args.out_key} exists; pass --force to overwrite it")
        key = crypto.generate_perspectives_key()
        crypto.write_new_file(
            args.out_key, crypto.private_key_pem(key), mode=0o600, force=args.force
        )
        print(f"wrote {args.out_key} (mode 0600); its public key, for clients' notary lists:")
        print(crypto.public_key_pem(key), end="")
        return 0
    missing = [f for f, v in (("--out-cert", args.out_cert), ("--name", args.name)) if v is None]
    if missing:
        raise UsageError(f"keygen needs {' and '.join(missing)} (or --perspectives)")
    for path in (args.out_key, args.out_cert):
        if path.exists() and not args.force:
            raise UsageError(f"{path} exists; pass --force to overwrite it")
    key = crypto.generate_rsa_key()
    cert = crypto.make_self_signed_certificate(key, args.name, days=args.days)
    crypto.write_new_file(args.out_key, crypto.private_key_pem(key), mode=0o600, force=args.force)
    try:
        crypto.write_new_file(
            args.out_cert, crypto.certificate_pem(cert), mode=0o644, force=args.force
        )
    except UsageError:
        if not args.force:
            args.out_key.unlink(missing_ok=True)  # no key without its certificate
        raise
    print(f"wrote {args.out_key} (mode 0600) and {args.out_cert}")
    return 0


def cmd_perspectives_entry(args: argparse.Namespace) -> int:
    from notary.protocol.perspectives import format_notary_list_entry

    config = load_config(args.config)
    if config.perspectives.key_file is None:
        raise UsageError("the config has no [perspectives] key_file: Perspectives is not served")
    key = crypto.load_private_key(config.perspectives.key_file)
    print(format_notary_list_entry(args.host_port, crypto.public_key_pem(key), None), end="")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """The public keys a notary's clients and peers check it with: its v2
    key, its log's origin and verifier key (what its bundle pins) with the
    witnesses it asks, and its witness cosigner key. One ``name: value``
    line each."""
    from notary.protocol import tlog

    config = load_config(args.config)
    if config.v2.key_file is None:
        raise UsageError("the config has no [v2] key_file: no v2 key, log or witness key")
    public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(config.v2.key_file))
    print(f"v2 key:      {crypto.ed25519_key_id(public)} {base64.b64encode(public).decode()}")
    log = config.log.bundle_log(public)
    if log is None:
        print("log:         off")
    else:
        print(f"log:         {log.origin}")
        print(f"log key:     {log.key}")
        for witness in log.witnesses:
            print(f"log witness: {witness}")
        if log.witnesses:
            print(f"cosignatures promised: {log.min_witnesses} of {len(log.witnesses)}")
    if config.witness.enabled:
        print(f"witness key: {tlog.cosigner_key(config.witness.name, public)}")
    else:
        print("witness:     off")
    return 0
