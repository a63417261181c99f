"""``notary bundle``: write a notary's ``.notary`` bundle, show one, and
keep the client's own (``fetch``, ``list``, ``remove``: the notaries
``notary check`` asks)."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import re
from pathlib import Path

import trio

from notary.cli.args import NOTARIES_HELP, UsageParser, check_timeout, fingerprint_option
from notary.cli.output import cell
from notary.config import Config, load_config
from notary.errors import UsageError
from notary.protocol.bundle import BundleLog, make_bundle, parse_bundle, parse_host_spec
from notary.state import crypto


def add_bundle(commands: argparse._SubParsersAction) -> None:
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
    bundle.add_argument("--log-min-witnesses", type=int, metavar="N",
                        help="how many of them cosign the checkpoint of every answer (default: "
                             "[log] min_cosignatures of --config, else 0)")
    bundle.add_argument("--out", type=Path)
    bundle.add_argument("--force", action="store_true")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", parser_class=UsageParser)
    show = bundle_commands.add_parser("show", help="print a bundle with each host's SHA-1 pin")
    show.add_argument("file", type=Path)
    fetch = bundle_commands.add_parser(
        "fetch", help="validate a bundle (https URL or file) and keep it for `notary check`"
    )
    fetch.add_argument("source", metavar="URL|FILE")
    fetch.add_argument("--notaries", type=Path, metavar="DIR", help=NOTARIES_HELP)
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
    listing.add_argument("--notaries", type=Path, metavar="DIR", help=NOTARIES_HELP)
    remove = bundle_commands.add_parser("remove", help="forget a notary")
    remove.add_argument("name")
    remove.add_argument("--notaries", type=Path, metavar="DIR", help=NOTARIES_HELP)


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
    configured = log if log is not None and log.enabled else None
    witnesses = args.log_witness or (
        [w.key for w in configured.witnesses] if configured is not None else []
    )
    minimum = args.log_min_witnesses
    if minimum is None:
        minimum = configured.min_cosignatures if configured and not args.log_witness else 0
    if not 0 <= minimum <= len(witnesses):
        raise UsageError(
            f"--log-min-witnesses must be 0 to the {len(witnesses)} witnesses the log asks"
        )
    return BundleLog.of(origin, public, tuple(witnesses), min_witnesses=minimum)


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
        print(cell(f"log:      {bundle.log.origin}"))
        print(cell(f"  key:    {bundle.log.key}"))
        for witness in bundle.log.witnesses:
            print(cell(f"  witness: {witness}"))
        if bundle.log.witnesses:
            print(f"  cosignatures promised: {bundle.log.min_witnesses} of "
                  f"{len(bundle.log.witnesses)}")
    return 0


def _notary_dir(args: argparse.Namespace) -> Path:
    from notary.client.check import default_notary_dir

    return args.notaries if args.notaries is not None else default_notary_dir()


def _bundle_fetch(args: argparse.Namespace) -> int:
    from notary.client.trusted import bundle_pins, fetch_bundle, format_pins, store_bundle

    check_timeout(args.timeout)
    pin = fingerprint_option(args.pin, "--pin")
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
        print(cell(f"{item.bundle.name}  [{hosts}]  {item.path.name}"))
    return 0


def _bundle_remove(args: argparse.Namespace) -> int:
    from notary.client.trusted import remove_bundle

    removed = remove_bundle(_notary_dir(args), args.name)
    print(f"removed {removed.bundle.name!r} ({removed.path})")
    return 0


_BUNDLE_STORE_COMMANDS = {"fetch": _bundle_fetch, "list": _bundle_list, "remove": _bundle_remove}
