"""The ``notary`` command line.

Exit status: 0 success, 1 runtime failure (store, network), 2 usage error;
`notary check`: 0 verified, 1 rejected by the vote (and nothing else),
2 usage error, 3 inconclusive, 4 site unreachable, 5 the check itself failed;
`notary log`: 0 consistent, 1 the log is inconsistent, 2 usage error,
3 equivocation, 4 the log could not be read, 5 the command itself failed,
6 a faulty consistency proof (watch: the entries show the checkpoints
consistent), 7 verify checked only the first --max-entries entries (no
problem in them).
Every error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import logging
import math
import os
import re
import signal
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import trio

from notary import __version__
from notary.config import Config, StoreConfig, load_config, parse_endpoint
from notary.errors import BadTarget, ConfigError, NotaryError, ProtocolError, StoreError, UsageError
from notary.model.targets import Target, make_target
from notary.protocol.bundle import BundleLog, make_bundle, parse_bundle, parse_host_spec
from notary.protocol.convergence import format_fingerprint, parse_fingerprint
from notary.protocol.voting import Outcome, Threshold
from notary.state import crypto
from notary.state.store import database_file_mode

if TYPE_CHECKING:
    from notary.client.check import CheckReport, NotaryAnswer

log = logging.getLogger("notary")


_NOTARIES_HELP = "the client's bundle directory (default: ~/.config/notary/notaries)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="notary", description="A certificate notary (Convergence protocol).")
    parser.add_argument("--version", action="version", version=f"notary {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_keygen(commands)
    _add_bundle(commands)
    _add_check(commands)
    _add_db(commands)
    _add_serve(commands)
    _add_watch(commands)
    _add_log(commands)
    _add_perspectives_entry(commands)
    _add_keys(commands)
    _add_dev_init(commands)
    return parser


def _add_keygen(commands: argparse._SubParsersAction) -> None:
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


def _add_bundle(commands: argparse._SubParsersAction) -> None:
    bundle = commands.add_parser("bundle", help="write a .notary bundle, or `bundle show FILE`")
    bundle.add_argument("--name", help="the notary's name (clients' identity key)")
    bundle.add_argument("--location", help="https URL of the bundle, ending .notary")
    bundle.add_argument("--region", help="ISO country code")
    bundle.add_argument(
        "--host", action="append", default=[], metavar="HOST:SSL_PORT:HTTP_PORT:CERT_PEM"
    )
    bundle.add_argument("--v2-key", type=Path, metavar="KEY",
                        help="the hosts' v2 Ed25519 key file: its public key goes in the bundle")
    bundle.add_argument("--config", type=Path, metavar="FILE",
                        help="the notary's configuration: its [v2] key (unless --v2-key) and "
                             "its [log] (origin, witnesses) go in the bundle")
    bundle.add_argument("--log-origin", metavar="ORIGIN",
                        help="pin the notary's log ([log] origin) in the bundle (needs the v2 key)")
    bundle.add_argument("--log-witness", action="append", default=[], metavar="VKEY",
                        help="a witness the log asks to cosign (its cosigner vkey; repeatable)")
    bundle.add_argument("--out", type=Path)
    bundle.add_argument("--force", action="store_true")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", parser_class=_Parser)
    show = bundle_commands.add_parser("show", help="print a bundle with each host's SHA-1 pin")
    show.add_argument("file", type=Path)
    fetch = bundle_commands.add_parser(
        "fetch", help="validate a bundle (https URL or file) and keep it for `notary check`"
    )
    fetch.add_argument("source", metavar="URL|FILE")
    fetch.add_argument("--notaries", type=Path, metavar="DIR", help=_NOTARIES_HELP)
    fetch.add_argument("--timeout", type=float, default=10.0, metavar="S")
    fetch.add_argument(
        "--pin", metavar="SHA1",
        help="the SHA-1 of the certificate the https server must present (a notary serving "
             "its bundle from its own self-signed host); without it, a CA must vouch for it",
    )
    fetch.add_argument(
        "--replace", action="store_true",
        help="trust the fetched pins even when a stored notary of the same name has others",
    )
    listing = bundle_commands.add_parser("list", help="the notaries `notary check` asks")
    listing.add_argument("--notaries", type=Path, metavar="DIR", help=_NOTARIES_HELP)
    remove = bundle_commands.add_parser("remove", help="forget a notary")
    remove.add_argument("name")
    remove.add_argument("--notaries", type=Path, metavar="DIR", help=_NOTARIES_HELP)


def _add_check(commands: argparse._SubParsersAction) -> None:
    check = commands.add_parser(
        "check", help="ask several notaries which certificate a site serves, and vote"
    )
    check.add_argument("site", metavar="HOST[:PORT]")
    check.add_argument("--fingerprint", metavar="SHA1", help="check this one, not the site's")
    check.add_argument("--notary", action="append", type=Path, default=[], metavar="FILE.notary")
    check.add_argument("--notaries", type=Path, metavar="DIR", help=_NOTARIES_HELP)
    check.add_argument("--quorum", type=int, default=3, metavar="N", help="notaries to ask")
    check.add_argument("--threshold", choices=[t.value for t in Threshold], default="majority")
    check.add_argument("--strict", action="store_true",
                       help="notaries that do not answer count against")
    check.add_argument("--bounce", default="auto", metavar="auto|off|FILE.notary")
    check.add_argument("--timeout", type=float, default=10.0, metavar="S")
    check.add_argument("--json", action="store_true")
    check.add_argument("--v2", action="store_true",
                       help="ask through the signed v2 API (Ed25519, nonce, freshness)")


def _add_db(commands: argparse._SubParsersAction) -> None:
    db = commands.add_parser(
        "db", help="create/migrate the database, print statistics, or compact it"
    )
    db.add_argument("action", choices=["init", "stats", "compact"])
    db.add_argument("--db", type=Path, help="database file (default: from --config)")
    db.add_argument("--config", type=Path)


def _add_serve(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve the notary")
    serve.add_argument("--config", type=Path, help="TOML configuration file")
    serve.add_argument("--check-config", action="store_true", help="validate and exit")
    serve.add_argument("--key", type=Path)
    serve.add_argument("--cert", type=Path)
    serve.add_argument("--db", type=Path)
    serve.add_argument("--bundle", type=Path, help="bundle served at /<file name>")
    serve.add_argument("--api", action="append", metavar="HOST:PORT", help="repeatable")
    serve.add_argument("--allow-target", action="append", metavar="CIDR", help="repeatable")
    serve.add_argument(
        "--plain-api", action="append", metavar="HOST:PORT",
        help="plain-HTTP API listener, behind a TLS terminator (repeatable)",
    )
    serve.add_argument(
        "--relay", action="append", metavar="HOST:PORT",
        help="relay listener (repeatable; replaces [relay] listen)",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["text", "json", "logfmt"])
    serve.add_argument(
        "--workers", type=int, metavar="N",
        help="worker processes (default: [node] workers, 0 = one per CPU)",
    )
    serve.add_argument("--user", help="started as root: serve as this user ([node] user)")
    serve.add_argument("--group", help="and this group ([node] group)")


def _add_watch(commands: argparse._SubParsersAction) -> None:
    watch = commands.add_parser(
        "watch", help="print certificate changes of sites as a notary sees them (v2 WebSocket)"
    )
    watch.add_argument("sites", nargs="+", metavar="HOST[:PORT]")
    watch.add_argument("--notary", type=Path, required=True, metavar="FILE.notary")
    watch.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="deadline to connect (the watch itself runs until interrupted)")


def _add_log(commands: argparse._SubParsersAction) -> None:
    log_parser = commands.add_parser(
        "log", help="verify or watch a notary's transparency log (`log verify|watch BUNDLE`)"
    )
    log_commands = log_parser.add_subparsers(
        dest="log_command", required=True, parser_class=_Parser
    )
    verify = log_commands.add_parser(
        "verify", help="download a notary's whole log and check every entry, tile and the root"
    )
    verify.add_argument("bundle", type=Path, metavar="FILE.notary")
    verify.add_argument("--timeout", type=float, default=10.0, metavar="S",
                        help="deadline of each request to the notary (default 10)")
    verify.add_argument("--max-problems", type=int, default=100, metavar="N",
                        help="stop reading after N problems (default 100)")
    verify.add_argument("--max-entries", type=int, default=100_000_000, metavar="N",
                        help="read at most the first N entries (default 100000000; 0: all)")
    watch = log_commands.add_parser(
        "watch", help="monitor a notary's log for a domain's entries and for equivocation"
    )
    watch.add_argument("bundle", type=Path, metavar="FILE.notary")
    watch.add_argument("--domain", required=True, help="print entries for it and its subdomains")
    watch.add_argument("--interval", type=float, default=60.0, metavar="S",
                       help="seconds between polls (default 60)")
    watch.add_argument("--state", type=Path, metavar="FILE",
                       help="the last verified checkpoint (default: one file per notary in "
                            "~/.config/notary/logs)")
    watch.add_argument("--once", action="store_true", help="poll once, then exit")
    watch.add_argument("--timeout", type=float, default=10.0, metavar="S",
                       help="deadline of each request to the notary (default 10)")
    watch.add_argument("--max-problems", type=int, default=100, metavar="N",
                       help="stop reading after N problems (default 100)")


def _add_perspectives_entry(commands: argparse._SubParsersAction) -> None:
    entry = commands.add_parser(
        "perspectives-entry", help="this notary's entry for a Perspectives client's notary list"
    )
    entry.add_argument("--config", type=Path, required=True)
    entry.add_argument("--host-port", required=True, metavar="HOST:PORT",
                       help="where clients reach the Perspectives port")


def _add_keys(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser(
        "keys", help="the notary's public keys: v2, its log's verifier key, its witness key"
    )
    keys.add_argument("--config", type=Path, required=True)


def _add_dev_init(commands: argparse._SubParsersAction) -> None:
    dev = commands.add_parser("dev-init", help="make a local key, certificate, db, bundle, config")
    dev.add_argument("--dir", type=Path, default=Path("var"))
    dev.add_argument("--api-port", type=int, default=8443)
    dev.add_argument("--relay-api-port", type=int, default=4242)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        #: The command line, for the supervisor to start its workers with.
        args.argv = list(argv) if argv is not None else sys.argv[1:]
        return _COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"notary: error: {exc}", file=sys.stderr)
        return 2
    except NotaryError as exc:
        print(f"notary: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output left (``notary log watch | head``): stop
        # as a shell's SIGPIPE would, without a traceback.
        _stop_printing()
        return 128 + signal.SIGPIPE


def _stop_printing() -> None:
    """Send the rest of stdout nowhere: its reader closed the pipe (the
    interpreter's last flush would raise again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _print_while_read(text: str) -> None:
    """``print`` for a report whose reader may leave early (``notary dev-init
    | head``): once the pipe is closed, the rest goes nowhere and the
    command's work goes on."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _stop_printing()


# -- keygen ---------------------------------------------------------------------


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


# -- bundle ---------------------------------------------------------------------

_HOST_SPEC = re.compile(r"(\[[^\]]+\]:\d{1,5}:\d{1,5}|[^:\[\]]+:\d{1,5}:\d{1,5}):(.+)")


def cmd_bundle(args: argparse.Namespace) -> int:
    if args.bundle_command == "show":
        return _bundle_show(args.file)
    if args.bundle_command in ("fetch", "list", "remove"):
        return _BUNDLE_STORE_COMMANDS[args.bundle_command](args)
    missing = [flag for flag, value in (("--name", args.name), ("--location", args.location),
                                        ("--out", args.out)) if not value]
    if missing:
        raise UsageError(f"bundle needs {', '.join(missing)}")
    if not args.host:
        raise UsageError("bundle needs at least one --host HOST:SSL_PORT:HTTP_PORT:CERT_PEM")
    hosts = []
    for spec in args.host:
        match = _HOST_SPEC.fullmatch(spec)
        if not match:
            raise UsageError(f"--host {spec!r} must be HOST:SSL_PORT:HTTP_PORT:CERT_PEM")
        pem_path = Path(match.group(2))
        try:
            pem = pem_path.read_text("ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read certificate {pem_path}: {exc}") from None
        hosts.append(parse_host_spec(match.group(1), pem))
    config = load_config(args.config) if args.config is not None else None
    v2_key_file = args.v2_key if args.v2_key is not None else (
        config.v2.key_file if config is not None else None
    )
    public = None
    if v2_key_file is not None:
        public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(v2_key_file))
        v2_key = base64.b64encode(public).decode("ascii")
        hosts = [dataclasses.replace(host, v2_key=v2_key) for host in hosts]
    bundle = make_bundle(
        name=args.name, location=args.location, hosts=hosts, region=args.region,
        log=_bundle_log(args, config, public),
    )
    crypto.write_new_file(args.out, bundle.to_json(), mode=0o644, force=args.force)
    print(f"wrote {args.out}")
    return 0


def _bundle_log(
    args: argparse.Namespace, config: Config | None, public: bytes | None
) -> BundleLog | None:
    """The bundle's ``log`` member: the config's ``[log]`` (when enabled),
    ``--log-origin`` and ``--log-witness`` overriding it; None without
    either."""
    log = config.log if config is not None else None
    origin = args.log_origin or (log.origin if log is not None and log.enabled else None)
    if origin is None:
        if args.log_witness:
            raise UsageError("--log-witness needs --log-origin (or --config with [log] enabled)")
        return None
    if public is None:
        raise UsageError(
            "a bundle that pins the log needs the v2 key that signs it "
            "(--v2-key, or --config with [v2] key_file)"
        )
    witnesses = args.log_witness or (
        [w.key for w in log.witnesses] if log is not None and log.enabled else []
    )
    return BundleLog.of(origin, public, tuple(witnesses))


def _bundle_show(path: Path) -> int:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    bundle = parse_bundle(data)
    print(f"name:     {bundle.name}")
    print(f"location: {bundle.bundle_location}")
    if bundle.region:
        print(f"region:   {bundle.region}")
    for host in bundle.hosts:
        print(f"host:     {host.host} ssl_port={host.ssl_port} http_port={host.http_port}")
        print(f"  sha1:   {host.sha1_pin}")
        if host.v2_key is not None:
            print(f"  v2 key: {host.v2_key}")
    if bundle.log is None:
        print("log:      not pinned (no log member)")
    else:
        print(_cell(f"log:      {bundle.log.origin}"))
        print(_cell(f"  key:    {bundle.log.key}"))
        for witness in bundle.log.witnesses:
            print(_cell(f"  witness: {witness}"))
    return 0


def _notary_dir(args: argparse.Namespace) -> Path:
    from notary.client.check import default_notary_dir

    return args.notaries if args.notaries is not None else default_notary_dir()


def _bundle_fetch(args: argparse.Namespace) -> int:
    from notary.client.trusted import bundle_pins, fetch_bundle, format_pins, store_bundle

    _check_timeout(args.timeout)
    pin = None
    if args.pin is not None:
        try:
            pin = parse_fingerprint(args.pin)
        except ProtocolError as exc:
            raise UsageError(f"--pin: {exc.message}") from None
    data = trio.run(lambda: fetch_bundle(args.source, timeout_s=args.timeout, pin=pin))
    result = store_bundle(_notary_dir(args), data, replace=args.replace)
    stored = result.stored
    hosts = f"{len(stored.bundle.hosts)} hosts"
    if result.previous is None:
        taken = result.name_taken_by
        note = (f" ({taken.path.name} holds {taken.bundle.name!r}: this one gets its own file)"
                if taken is not None else "")
        print(f"added {stored.bundle.name!r} ({hosts}): {stored.path}{note}")
    elif result.pins_changed:
        print(f"replaced {stored.bundle.name!r} ({hosts}): {stored.path}")
        print(f"  old pins: {format_pins(bundle_pins(result.previous.bundle))}")
        print(f"  new pins: {format_pins(bundle_pins(stored.bundle))}")
    else:
        print(f"updated {stored.bundle.name!r} ({hosts}, same pins): {stored.path}")
    return 0


def _bundle_list(args: argparse.Namespace) -> int:
    from notary.client.trusted import list_bundles

    directory = _notary_dir(args)
    stored = list_bundles(directory)
    if not stored:
        print(f"no notaries in {directory} (add some with `notary bundle fetch URL`)")
    for item in stored:
        hosts = ", ".join(f"{h.host}:{h.ssl_port}" for h in item.bundle.hosts)
        print(_cell(f"{item.bundle.name}  [{hosts}]  {item.path.name}"))
    return 0


def _bundle_remove(args: argparse.Namespace) -> int:
    from notary.client.trusted import remove_bundle

    removed = remove_bundle(_notary_dir(args), args.name)
    print(f"removed {removed.bundle.name!r} ({removed.path})")
    return 0


_BUNDLE_STORE_COMMANDS = {"fetch": _bundle_fetch, "list": _bundle_list, "remove": _bundle_remove}


def _check_timeout(timeout: float) -> None:
    if not 0 < timeout <= 3600:
        raise UsageError("--timeout must be between 0 and 3600 seconds")


# -- check ------------------------------------------------------------------------

#: Exit status of `notary check`: 1 means "rejected by the vote" and
#: nothing else (a notary's failure is its row, never the exit status).
EXIT_VERIFIED, EXIT_REJECTED, EXIT_INCONCLUSIVE, EXIT_SITE_UNREACHABLE = 0, 1, 3, 4
EXIT_CHECK_FAILED = 5


def parse_site(text: str) -> Target:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 literal; port 443
    by default."""
    if text.startswith("["):
        host, bracket, port = text.rpartition("]:")
        host, port = (host + "]", port) if bracket else (text, "443")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, "443"
    try:
        return make_target(host, port)
    except BadTarget as exc:
        raise UsageError(f"site {text!r}: {exc}") from None


def cmd_check(args: argparse.Namespace) -> int:
    """`notary check`; any failure but a usage error and an unreachable site
    exits 5 on one line, never 1 (which means "rejected by the vote")."""
    from notary.client import check as client

    try:
        return _check(args)
    except UsageError:
        raise
    except client.SiteUnreachable as exc:
        print(f"notary: cannot fetch the site's certificate: {exc}", file=sys.stderr)
        return EXIT_SITE_UNREACHABLE
    except Exception as exc:
        reason = client.one_line(str(exc) or type(exc).__name__)
        print(f"notary: the check failed: {reason}", file=sys.stderr)
        return EXIT_CHECK_FAILED


def _check(args: argparse.Namespace) -> int:
    from notary.client import check as client
    from notary.client.checkpoints import CheckpointBook, default_checkpoint_dir

    _check_timeout(args.timeout)
    target = parse_site(args.site)
    fingerprint = None
    if args.fingerprint is not None:
        try:
            fingerprint = parse_fingerprint(args.fingerprint)
        except ProtocolError as exc:
            raise UsageError(f"--fingerprint: {exc.message}") from None
    directory = args.notaries
    if directory is None and not args.notary:
        directory = client.default_notary_dir()
    bundles = client.load_bundles(args.notary, directory)
    relay: object
    if args.bounce in ("auto", "off"):
        relay = None if args.bounce == "off" else "auto"
    else:  # a local file, as a stored bundle is: a relay is trusted too
        (relay,) = client.load_bundles([Path(args.bounce)], None)
    report = trio.run(lambda: client.check(
        target, bundles, fingerprint=fingerprint, quorum=args.quorum,
        threshold=Threshold(args.threshold), strict=args.strict, relay=relay,
        timeout_s=args.timeout, use_v2=args.v2,
        checkpoints=CheckpointBook(default_checkpoint_dir()) if args.v2 else None,
    ))
    now = time.time()
    print(report_json(report) if args.json else report_table(report, now))
    return {
        Outcome.VERIFIED: EXIT_VERIFIED,
        Outcome.REJECTED: EXIT_REJECTED,
        Outcome.INCONCLUSIVE: EXIT_INCONCLUSIVE,
    }[report.tally.outcome]


def cmd_watch(args: argparse.Namespace) -> int:
    from notary.client import check as client

    _check_timeout(args.timeout)
    targets = [parse_site(site) for site in args.sites]
    (bundle,) = client.load_bundles([args.notary], None)

    def show_watching(target: Target) -> None:
        print(_cell(f"watching {target} on {bundle.name}"), flush=True)

    def show(event: client.WatchEvent) -> None:
        newest = event.observations[0] if event.observations else None
        if newest is None:
            return
        print(
            f"{_when(event.signed_at)} {event.target}: certificate sha256={newest.sha256.hex()} "
            f"(seen {_when(newest.first_seen)} to {_when(newest.last_seen)}, "
            f"{len(event.observations)} known)",
            flush=True,
        )

    trio.run(lambda: client.watch(
        bundle, targets, on_event=show, on_watching=show_watching, timeout_s=args.timeout
    ))
    return 0


# -- log ------------------------------------------------------------------------------

#: Exit status of `notary log`: 0 consistent, 1 the log is inconsistent,
#: 2 usage error, 3 equivocation (watch), 4 the log could not be read,
#: 5 the command itself failed, 6 a faulty consistency proof (watch: the
#: proof fails but the entries show the checkpoints consistent), 7
#: incomplete (verify read only the first --max-entries entries and found
#: no problem in them).
EXIT_LOG_OK, EXIT_LOG_INCONSISTENT, EXIT_LOG_EQUIVOCATION = 0, 1, 3
EXIT_LOG_UNREACHABLE, EXIT_LOG_FAILED, EXIT_LOG_FAULTY_PROOF, EXIT_LOG_INCOMPLETE = 4, 5, 6, 7
#: Most problems --max-problems may ask for (each is kept and printed).
MAX_LOG_PROBLEMS = 100_000
#: ``notary log verify`` says how far it got this often (stderr).
LOG_PROGRESS_INTERVAL_S = 10.0


def cmd_log(args: argparse.Namespace) -> int:
    """`notary log verify|watch`; whatever fails is one line on stderr and
    its own exit status (above), never a traceback."""
    from notary.client import check as client
    from notary.client import logmonitor

    try:
        _check_timeout(args.timeout)
        if not 1 <= args.max_problems <= MAX_LOG_PROBLEMS:
            raise UsageError(f"--max-problems must be between 1 and {MAX_LOG_PROBLEMS}")
        (bundle,) = client.load_bundles([args.bundle], None)
        if args.log_command == "verify":
            return _log_verify(bundle, args)
        return _log_watch(bundle, args)
    except UsageError:
        raise
    except logmonitor.LogUnreachable as exc:
        print(f"notary: cannot read the log: {client.one_line(str(exc), None)}", file=sys.stderr)
        return EXIT_LOG_UNREACHABLE
    except logmonitor.LogInconsistent as exc:
        print(f"INCONSISTENT: {client.one_line(str(exc), None)}", flush=True)
        for problem in exc.problems:
            print(f"problem: {problem.line()}")
        if exc.count > len(exc.problems):
            print(f"... and {exc.count - len(exc.problems)} more problems")
        if exc.stopped:
            print(f"stopped after {exc.count} problems (--max-problems): the rest was not read")
        return EXIT_LOG_INCONSISTENT
    except logmonitor.FaultyProof as exc:
        print(f"FAULTY PROOF: {client.one_line(str(exc), None)}", flush=True)
        print("no equivocation: nothing saved as evidence; the state keeps the old checkpoint")
        return EXIT_LOG_FAULTY_PROOF
    except logmonitor.Equivocation as exc:
        print(f"EQUIVOCATION: {client.one_line(exc.reason, None)}")
        print("checkpoint kept before:")
        print(exc.old_note, end="" if exc.old_note.endswith("\n") else "\n")
        print("checkpoint served now:")
        print(exc.new_note, end="" if exc.new_note.endswith("\n") else "\n")
        for path in exc.evidence:
            print(f"evidence: {path}")
        return EXIT_LOG_EQUIVOCATION
    except NotaryError as exc:
        print(f"notary: {client.one_line(str(exc), None)}", file=sys.stderr)
        return EXIT_LOG_FAILED
    except Exception as exc:
        reason = client.one_line(str(exc) or type(exc).__name__)
        print(f"notary: the log command failed: {reason}", file=sys.stderr)
        return EXIT_LOG_FAILED


def _log_verify(bundle: Any, args: argparse.Namespace) -> int:
    from notary.client import logmonitor

    if args.max_entries < 0:
        raise UsageError("--max-entries must be 0 (all) or more")
    last_said = [0.0]

    def progress(checked: int, size: int, limit: int) -> None:
        now = time.monotonic()
        if checked == 0:
            last_said[0] = now
            if limit < size:
                print(f"notary: its checkpoint claims {size} entries, more than --max-entries: "
                      f"only the first {limit} are read", file=sys.stderr, flush=True)
        elif now - last_said[0] >= LOG_PROGRESS_INTERVAL_S and checked < limit:
            last_said[0] = now
            print(f"notary: {checked} of {limit} entries checked", file=sys.stderr, flush=True)

    report = trio.run(lambda: logmonitor.verify_log(
        bundle, timeout_s=args.timeout, max_problems=args.max_problems,
        max_entries=args.max_entries, on_progress=progress,
    ))
    print(_cell(f"notary:  {report.notary} ({report.host})"))
    pinned = ("pinned by the bundle" if report.pinned
              else "not pinned: the bundle has no log member; the checkpoint's own origin")
    print(_cell(f"log:     {report.origin} ({pinned})"))
    if report.size is not None and report.root is not None:
        print(f"size:    {report.size}")
        print(f"root:    {base64.b64encode(report.root).decode('ascii')}")
        print(f"checked: {report.entries_checked} entries, {report.tiles_checked} hash tiles")
    for problem in report.problems:
        print(f"problem: {problem.line()}")
    if report.problem_count > len(report.problems):
        print(f"... and {report.problem_count - len(report.problems)} more problems")
    if report.stopped:
        print(f"stopped after {report.problem_count} problems (--max-problems): "
              "the rest of the log was not read")
    if not report.consistent:
        print(f"INCONSISTENT: {report.problem_count} problems")
        return EXIT_LOG_INCONSISTENT
    if report.entries_limit is not None:
        print(f"INCOMPLETE: the first {report.entries_limit} of {report.size} entries are "
              "consistent and proven the start of the signed tree; the rest was not read "
              "(--max-entries)")
        return EXIT_LOG_INCOMPLETE
    print("consistent: every entry is signed, the tiles and the root match the checkpoint")
    return EXIT_LOG_OK


def _log_watch(bundle: Any, args: argparse.Namespace) -> int:
    from notary.client import logmonitor

    if not 0 < args.interval <= 86400:
        raise UsageError("--interval must be between 0 and 86400 seconds")
    domain = logmonitor.normalise_domain(args.domain)
    state_path = args.state if args.state is not None else logmonitor.default_state_path(bundle)
    logmonitor.bundle_v2_key(bundle)

    def show_entry(entry: logmonitor.LoggedEntry) -> None:
        sha256 = entry.sha256.hex() if entry.sha256 is not None else "-"
        print(f"{entry.index} {entry.target} sha256={sha256} "
              f"signed_at={_when(entry.signed_at)}", flush=True)

    def show_poll(result: logmonitor.PollResult) -> None:
        if result.empty:
            print(_cell(f"# {bundle.name}: no log yet (no checkpoint served)"), flush=True)
            return
        grown = (f"{result.old_size} -> {result.new_size} entries"
                 if result.new_size != result.old_size else f"{result.new_size} entries")
        print(_cell(f"# {result.origin}: {grown}, {result.entries_checked} new entries "
                    f"verified, {result.matched} for {domain}"), flush=True)

    if bundle.log is None:
        print(_cell(f"# {bundle.name}: its bundle pins no log (no log member): the origin is "
                    "the one this watch saw first"), flush=True)

    def show_unreachable(exc: logmonitor.LogUnreachable) -> None:
        print(f"notary: cannot read the log (trying again in {args.interval:g} s): "
              f"{exc}", file=sys.stderr, flush=True)

    if args.once:
        show_poll(trio.run(lambda: logmonitor.poll_log(
            bundle, domain=domain, state_path=state_path, on_entry=show_entry,
            timeout_s=args.timeout, max_problems=args.max_problems,
        )))
        return EXIT_LOG_OK
    trio.run(lambda: logmonitor.watch_log(
        bundle, domain=domain, state_path=state_path, on_entry=show_entry,
        on_poll=show_poll, on_unreachable=show_unreachable, interval_s=args.interval,
        timeout_s=args.timeout, max_problems=args.max_problems,
    ))
    return EXIT_LOG_OK


def _when(timestamp: int | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _cell(text: str) -> str:
    """``text`` (a notary's name or detail, from a bundle or a notary) with
    no character that could break a line or drive the terminal."""
    from notary.client.check import one_line

    return one_line(text, limit=None)


def report_table(report: CheckReport, now: float) -> str:
    """The human output of `notary check`: one row (one line) per notary
    asked, then the verdict line."""
    rows = [("NOTARY", "ANSWERED BY", "VERDICT", "NEWEST OBSERVATION", "SEEN FOR", "DETAIL")]
    for answer in report.answers:
        seen_for = now - answer.seen_since if answer.seen_since is not None else None
        rows.append((
            _cell(answer.notary), answer.host or "-", answer.verdict.value,
            _when(answer.newest_seen), _duration(seen_for), _cell(answer.detail) or "-",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    tally = report.tally
    via = f", bounced via {_cell(' then '.join(report.relays))}" if report.relays else ""
    lines.insert(0, (
        f"{report.target} {format_fingerprint(report.fingerprint)} "
        f"({report.threshold.value}{', strict' if report.strict else ''}{via})"
    ))
    lines.append(
        f"{tally.outcome.value}: {tally.successes} of {tally.counted} counted notaries vouch "
        f"for this certificate ({report.threshold.value}); {tally.stood_aside} stood aside"
    )
    return "\n".join(lines)


def report_json(report: CheckReport) -> str:
    """The ``--json`` output of `notary check`: the vote, and per notary its
    row's fields; for a v2 answer also the signed ``consistency`` of the
    site's current set (docs/v2.md, S8; null when the notary sent none)
    and the per-address detail of its statement: ``certificates`` (each
    certificate it stated, with the addresses that served it and whether
    it is current) and ``addresses`` (each address with the certificates it
    served); both empty for a Convergence answer."""
    tally = report.tally
    return json.dumps({
        "target": report.target.key,
        "fingerprint": format_fingerprint(report.fingerprint),
        "threshold": report.threshold.value,
        "strict": report.strict,
        "relays": list(report.relays),
        "outcome": tally.outcome.value,
        "successes": tally.successes,
        "counted": tally.counted,
        "stood_aside": tally.stood_aside,
        "notaries": [
            {
                "name": a.notary, "host": a.host, "verdict": a.verdict.value,
                "status": a.status, "detail": a.detail, "via": a.via,
                "backend": a.backend, "newest_seen": a.newest_seen, "seen_since": a.seen_since,
                **_served_json(a),
            }
            for a in report.answers
        ],
    }, indent=2)


def _served_json(answer: NotaryAnswer) -> dict[str, Any]:
    """``consistency``, ``certificates`` and ``addresses`` of one notary's
    answer in ``report_json``."""
    consistency = answer.consistency
    current = set(consistency.current) if consistency is not None else set()
    served_by: dict[str, list[str]] = {}
    for observation in answer.observations:
        for address in observation.addresses:
            served_by.setdefault(address, []).append(observation.sha256.hex())
    return {
        "consistency": None if consistency is None else {
            "kind": consistency.kind.value,
            "certificates": consistency.certificates,
            "addresses": list(consistency.addresses),
            "current": [sha256.hex() for sha256 in consistency.current],
        },
        "certificates": [
            {
                "sha256": o.sha256.hex(), "sha1": format_fingerprint(o.sha1),
                "spki_sha256": o.spki_sha256.hex(), "first_seen": o.first_seen,
                "last_seen": o.last_seen, "addresses": list(o.addresses),
                "current": o.sha256 in current if consistency is not None else None,
            }
            for o in answer.observations
        ],
        "addresses": [
            {"address": address, "sha256": served_by[address]} for address in sorted(served_by)
        ],
    }


# -- db -------------------------------------------------------------------------


def _db_settings(args: argparse.Namespace) -> tuple[Path, StoreConfig, int]:
    """The database file, its ``[store]`` settings and its files' mode:
    from ``--config`` (``--db`` overriding its file and its backend), else
    the defaults."""
    if args.db is None and args.config is None:
        raise UsageError("db needs --db FILE or --config FILE")
    if args.config is None:
        return args.db, StoreConfig(), database_file_mode("")
    config = load_config(args.config)
    if args.db is not None:
        return args.db, replace(config.store, backend="sqlite"), database_file_mode(
            config.node.group
        )
    return config.server.db_file, config.store, database_file_mode(config.node.group)


def _open_db(path: Path, settings: StoreConfig, mode: int, *, create: bool) -> tuple[Any, str]:
    """The store ``cmd_db`` works on (its engine by ``[store] backend``) and
    the name it is shown by (never a password)."""
    from notary.outbound.writer import store_openers

    make_schema, existing = store_openers(path, settings, mode)
    store = make_schema() if create else existing()
    return store, str(store.path)


def cmd_db(args: argparse.Namespace) -> int:
    path, settings, mode = _db_settings(args)
    sqlite = settings.backend == "sqlite"
    if args.action == "init":
        # Creates or migrates, sets the files' mode, and brings rows kept
        # under looser limits within these (what ``serve`` does at start).
        store, name = _open_db(path, settings, mode, create=True)
        with store:
            report = store.enforce_limits()
            print(f"{name}: schema version {store.schema_version()}"
                  + (f", mode {mode:04o}" if sqlite else ""))
        if report:
            print(f"brought within the [store] limits: {report}")
        return 0
    store, name = _open_db(path, settings, mode, create=False)
    size = "file bytes" if sqlite else "database bytes"
    if args.action == "compact":
        with store:
            before = store.statistics().file_bytes
            report = store.compact(int(time.time()), settings.forget_unasked_after_s)
            after = store.statistics().file_bytes
        print(f"{name}: {report}")
        print(f"{size}: {before} -> {after}")
        return 0
    with store:
        stats = store.statistics()
    print(f"schema version: {stats.schema_version}")
    print(f"targets:        {stats.targets}")
    print(f"certificates:   {stats.certificates}")
    print(f"observations:   {stats.observations}")
    print(f"{size + ':':<16}{stats.file_bytes}")
    return 0


# -- serve ----------------------------------------------------------------------


def config_from_args(args: argparse.Namespace) -> Config:
    server: dict[str, Any] = {}
    for flag, key in (("key", "key_file"), ("cert", "cert_file"), ("db", "db_file"),
                      ("bundle", "bundle_file"), ("log_level", "log_level"),
                      ("log_format", "log_format")):
        value = getattr(args, flag)
        if value is not None:
            server[key] = value
    if args.api:
        server["api"] = tuple(parse_endpoint(text, what="--api") for text in args.api)
    if args.plain_api:
        server["plain_api"] = tuple(
            parse_endpoint(text, what="--plain-api") for text in args.plain_api
        )
    if args.allow_target:
        server["allow_targets"] = tuple(args.allow_target)
    relay: dict[str, Any] = {}
    if args.relay:
        relay["listen"] = tuple(parse_endpoint(text, what="--relay") for text in args.relay)
    if args.config is None and not {"key_file", "cert_file", "db_file"} <= server.keys():
        raise ConfigError("serve needs --config FILE, or --key, --cert and --db")
    return load_config(args.config, {"server": server, "relay": relay})


def cmd_serve(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    node = {key: value for key in ("workers", "user", "group")
            if (value := getattr(args, key)) is not None}
    if node:
        config = replace(config, node=replace(config.node, **node))
    from notary.server.app import check_config

    if args.check_config:
        check_config(config)
        print("configuration OK")
        return 0
    from notary.logs import configure_logging, set_worker
    from notary.node.privileges import drop_privileges
    from notary.node.supervisor import default_workers, supervise, worker_index
    from notary.node.systemd import listen_fds
    from notary.server.sockets import bind_sockets, check_roles, inherited_sockets

    index = worker_index()
    set_worker(index)
    configure_logging(config.server.log_level, config.server.log_format)
    sockets = inherited_sockets()
    if sockets is None:  # the node's first process: open the sockets, then drop root
        taken = listen_fds()
        check_roles(taken)
        sockets = bind_sockets(config, taken=taken)
        drop_privileges(config.node.user, config.node.group)
    workers = config.node.workers or default_workers()
    if index is not None:
        # Each worker rescans the targets asked of it, with its share of the
        # node's budgets; skipping what another worker observed meanwhile
        # (the scheduler's rule 11) keeps a target from being probed once
        # per worker.
        # Likewise each enforces its share of the per-client rates.
        rescan = config.rescan
        config = replace(
            config, limits=config.limits.shared_by(workers), log=config.log.shared_by(workers),
            rescan=replace(
                rescan,
                probes_per_s=rescan.probes_per_s / workers,
                per_prefix_per_s=rescan.per_prefix_per_s / workers,
                max_in_flight=math.ceil(rescan.max_in_flight / workers),
            ),
        )
    if index is None and workers > 1:
        check_config(config)  # once here, rather than a failed start per worker
        from notary.server.app import check_resolvers_at_start

        trio.run(check_resolvers_at_start, config)  # likewise (each worker checks again)
        log.info("notary %s: starting %d workers", __version__, workers)
        return trio.run(supervise, config, sockets, workers, args.argv)
    from notary.node.lifecycle import run_serving_process

    try:
        # A worker shares the database with the node's other workers.
        trio.run(partial(run_serving_process, shared_store=index is not None),
                 config, sockets, partial(config_from_args, args))
    except BaseExceptionGroup as group:
        # Nurseries wrap a start-up error (unreadable bundle, ...) in
        # exception groups: report it on one line like any other.
        errors, others = group.split(NotaryError)
        if errors is None or others is not None:
            raise
        error: BaseException = errors
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        raise error from None
    return 0


# -- perspectives-entry ---------------------------------------------------------


def cmd_perspectives_entry(args: argparse.Namespace) -> int:
    from notary.protocol.perspectives import format_notary_list_entry

    config = load_config(args.config)
    if config.perspectives.key_file is None:
        raise UsageError("the config has no [perspectives] key_file: Perspectives is not served")
    key = crypto.load_private_key(config.perspectives.key_file)
    print(format_notary_list_entry(args.host_port, crypto.public_key_pem(key), None), end="")
    return 0


# -- keys -----------------------------------------------------------------------


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
    if config.witness.enabled:
        print(f"witness key: {tlog.cosigner_key(config.witness.name, public)}")
    else:
        print("witness:     off")
    return 0


# -- dev-init -------------------------------------------------------------------


def cmd_dev_init(args: argparse.Namespace) -> int:
    """Everything ``make run`` needs under ``args.dir``, made once."""
    from notary.node.devsetup import ensure_dev_notary

    try:
        ensure_dev_notary(
            args.dir, api_port=args.api_port, relay_api_port=args.relay_api_port,
            say=_print_while_read,
        )
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise UsageError(f"dev-init:{where}: {exc.strerror or exc}") from None
    return 0


_COMMANDS = {
    "keygen": cmd_keygen,
    "bundle": cmd_bundle,
    "db": cmd_db,
    "serve": cmd_serve,
    "dev-init": cmd_dev_init,
    "check": cmd_check,
    "perspectives-entry": cmd_perspectives_entry,
    "keys": cmd_keys,
    "watch": cmd_watch,
    "log": cmd_log,
}

__all__ = ["StoreError", "main"]
