"""First-use set-up for ``make run``: a local notary under one directory.

Idempotent: files that exist are kept, so a second run serves the same
notary (same key, same pins, same history).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

from notary.config import load_config
from notary.errors import UsageError
from notary.protocol.bundle import BundleHost, make_bundle
from notary.state import crypto
from notary.state.store import Store

DEV_HOST = "127.0.0.1"
#: The dev relay's port (the bundle's ``http_port``; Convergence uses 80).
DEV_RELAY_PORT = 8280

#: The dev Perspectives port (the protocol's historic 8080).
DEV_PERSPECTIVES_PORT = 8080
#: The admin listener's port (the ``[admin] listen`` default).
DEV_ADMIN_PORT = 9142

#: First line of a config file this module wrote; a file that starts with it
#: but lacks one of the current template's sections was written by an older
#: version and is rewritten.
CONFIG_HEADER = "# Made by `notary dev-init` for `make run`: a notary on loopback only."

CONFIG_TEMPLATE = CONFIG_HEADER + """
# Every key is documented in docs/configuration.md ("Configuration").

[server]
key_file = "notary.key"
cert_file = "notary.crt"
db_file = "notary.db"
bundle_file = "local.notary"
api = ["{host}:{api_port}", "{host}:{relay_api_port}"]
# Loopback targets are refused by default; this local notary may probe them.
allow_targets = ["127.0.0.0/8", "::1/128"]
log_level = "info"

[probe]
timeout_s = 5.0

[answers]
fresh_for_s = 86400

[relay]
# The bounce relay: CONNECT to port 4242 of a host of a trusted bundle. The
# local bundle is trusted, so clients can bounce through this notary to itself.
listen = ["{host}:{relay_port}"]
destinations = "bundles"
bundles = ["local.notary"]
allow_addresses = ["127.0.0.0/8", "::1/128"]
# Clients always CONNECT to port 4242; this notary's relay API port is:
dial_port = {relay_api_port}

[perspectives]
# Perspectives clients: GET http://{host}:{perspectives_port}/?host=...&port=...
key_file = "perspectives.key"
listen = ["{host}:{perspectives_port}"]

[v2]
# POST https://{host}:{api_port}/v2/query, GET /v2/key
key_file = "v2.key"

[log]
# Every v2 statement goes to a transparency log (docs/log.md):
# GET https://{host}:{api_port}/v2/log/checkpoint, /v2/log/tile/...
enabled = true
origin = "{host}:{api_port}/v2/log"

[admin]
# GET http://{host}:{admin_port}/metrics, /healthz, /readyz
listen = ["{host}:{admin_port}"]

[node]
# One process for `make run`; production: 0 = one worker per CPU.
workers = 1
"""


def ensure_dev_notary(
    directory: Path, *, api_port: int = 8443, relay_api_port: int = 4242,
    say: Callable[[str], None] = print,
) -> None:
    """Make under ``directory`` whatever of the key, certificate, database,
    bundle and config is missing, telling ``say`` what it made and how to
    ask the notary. ``say`` only reports: whatever becomes of the report
    (a reader that closed the pipe), the files are made.

    Error handling: ``UsageError`` for bad ports; ``OSError`` of the files."""
    for flag, port in (("--api-port", api_port), ("--relay-api-port", relay_api_port)):
        if not 1 <= port <= 65535:
            raise UsageError(f"{flag} must be a port number 1-65535, not {port}")
    if api_port == relay_api_port:
        raise UsageError("--api-port and --relay-api-port must differ")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key_path, cert_path = directory / "notary.key", directory / "notary.crt"
    if not key_path.exists() or not cert_path.exists():
        key = crypto.generate_rsa_key()
        cert = crypto.make_self_signed_certificate(key, DEV_HOST)
        crypto.write_new_file(key_path, crypto.private_key_pem(key), mode=0o600, force=True)
        crypto.write_new_file(cert_path, crypto.certificate_pem(cert), mode=0o644, force=True)
        say(f"made {key_path} and {cert_path}")
    perspectives_key = directory / "perspectives.key"
    if not perspectives_key.exists():
        crypto.write_new_file(
            perspectives_key,
            crypto.private_key_pem(crypto.generate_perspectives_key()),
            mode=0o600,
        )
        say(f"made {perspectives_key}")
    v2_key = directory / "v2.key"
    if not v2_key.exists():
        crypto.write_ed25519_private_key(v2_key, crypto.generate_ed25519_key())
        say(f"made {v2_key}")
    with Store(directory / "notary.db"):
        pass
    config_path = directory / "notary.toml"
    if _config_is_missing_or_outdated(config_path):
        config_path.write_text(
            CONFIG_TEMPLATE.format(
                host=DEV_HOST,
                api_port=api_port,
                relay_api_port=relay_api_port,
                relay_port=DEV_RELAY_PORT,
                perspectives_port=DEV_PERSPECTIVES_PORT,
                admin_port=DEV_ADMIN_PORT,
            )
        )
        say(f"made {config_path}")
    bundle_path = directory / "local.notary"
    cert_pem = cert_path.read_text("ascii")
    v2_public = crypto.ed25519_public_raw(crypto.load_ed25519_private_key(v2_key))
    bundle = make_bundle(
        name="Local notary (make run)",
        location=f"https://{DEV_HOST}:{api_port}/local.notary",
        hosts=[BundleHost(
            DEV_HOST, api_port, DEV_RELAY_PORT, cert_pem,
            v2_key=base64.b64encode(v2_public).decode("ascii"),
        )],
        # The log the config keeps (its origin, the v2 key, its witnesses),
        # pinned for clients.
        log=load_config(config_path).log.bundle_log(v2_public),
    )
    if not bundle_path.exists() or bundle_path.read_bytes() != bundle.to_json():
        crypto.write_new_file(bundle_path, bundle.to_json(), mode=0o644, force=True)
        say(f"made {bundle_path}")
    pin = bundle.hosts[0].sha1_pin
    base = f"https://{DEV_HOST}:{api_port}"
    say(
        f"\nThe notary's certificate pin (SHA-1): {pin}\n"
        "Once it is serving, ask it which certificate a target serves. The notary\n"
        "itself is a TLS target on loopback, so ask it about itself:\n"
        f"  curl -sk {base}/target/{DEV_HOST}+{api_port}\n"
        f"  curl -sk --data 'fingerprint={pin}' {base}/target/{DEV_HOST}+{api_port}\n"
        f"The bundle for clients: {base}/local.notary\n"
        "Bounce through the relay (the answer comes from port 4242 via the relay):\n"
        f"  curl -sk --proxytunnel -x http://{DEV_HOST}:{DEV_RELAY_PORT} "
        f"https://{DEV_HOST}:4242/target/{DEV_HOST}+{api_port}\n"
        "Ask as a Perspectives client (404 the first time: it probes, ask again):\n"
        f"  curl -s 'http://{DEV_HOST}:{DEV_PERSPECTIVES_PORT}/?host={DEV_HOST}&port={api_port}"
        "&service_type=2'\n"
        "Its transparency log (v2 statements; `notary log verify` checks it all):\n"
        f"  curl -sk {base}/v2/log/checkpoint\n"
        "The notary's own figures (Prometheus), liveness and readiness:\n"
        f"  curl -s http://{DEV_HOST}:{DEV_ADMIN_PORT}/metrics\n"
        f"  curl -s http://{DEV_HOST}:{DEV_ADMIN_PORT}/readyz\n"
    )


def _config_is_missing_or_outdated(path: Path) -> bool:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return True
    sections = (
        "\n[relay]\n", "\n[perspectives]\n", "\n[v2]\n", "\n[log]\n", "\n[admin]\n",
        "\n[node]\n",
    )
    return text.startswith(CONFIG_HEADER) and not all(s in text for s in sections)


