"""The v2 API from a benchmark: a notary with more HTTPS API listeners (its own
ports are the targets it is asked about), one request over HTTPS, a
``/v2/query`` body."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from .loopback import LOOPBACK, body_of, exchange, status_of
from .project import BenchError

JSON_TYPE = "application/json"


def add_api_ports(config: Path, extra: Sequence[int]) -> None:
    """Append ``extra`` HTTPS API listeners to ``[server] api``."""
    more = "".join(f', "{LOOPBACK}:{port}"' for port in extra)
    text, found = re.subn(r"(?m)^(\s*api = \[.*?)\]\s*$", lambda line: line[1] + more + "]",
                          config.read_text(), count=1)
    if not found:
        raise BenchError("no [server] api line in the dev-init config")
    config.write_text(text)


def https(port: int, method: str, path: str, body: str = "") -> bytes:
    """The body of the answer to one request over HTTPS; not 200 raises."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n"
    if method == "POST":
        head += f"Content-Type: {JSON_TYPE}\r\nContent-Length: {len(body)}\r\n"
    response = exchange(port, (head + "\r\n" + body).encode("ascii"), tls=True,
                        timeout_s=30.0)[0]
    if status_of(response) != 200:
        raise BenchError(f"{method} {path} answered {response[:300]!r}")
    return body_of(response)


def query_body(ports: Sequence[int], sha256: str, size: int, *, nonce: str) -> str:
    """A /v2/query body naming ``size`` targets: ``ports`` in turn, each with ``sha256``."""
    targets = [{"host": LOOPBACK, "port": ports[i % len(ports)], "sha256": sha256}
               for i in range(size)]
    return json.dumps({"targets": targets, "nonce": nonce}, separators=(",", ":"))
