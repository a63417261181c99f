"""The servers a benchmark starts for its run: any server, waited for until
it listens (``start_server``: the minimal server, socat...; ``start_nginx``), a
throwaway PostgreSQL, and the notary (``make_notary``/``new_notary``: a
``dev-init`` config on chosen loopback ports, checked; ``start_notary``:
started, listening and primed). Each is a child of the ``Processes`` given,
which stops it; one not ready in time is a ``BenchError`` with its log's tail."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .loopback import LOOPBACK, connect, exchange, free_ports, post_request, status_of
from .machine import listen_queue
from .processes import Processes, tail
from .project import ROOT, BenchError, project_env

MINIMAL_SERVER = ROOT / "bench" / "minimal_server.py"
READY_TIMEOUT_S = 30.0
PRIME_TIMEOUT_S = 30.0


#: cProfile wrapper for the notary process: SIGUSR1 starts profiling, SIGUSR2
#: stops it and writes the stats to argv[1]; the rest of argv is the notary's.
PROFILE_WRAPPER = """\
import cProfile, signal, sys
profile = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, lambda *_: (profile.disable(), profile.dump_stats(sys.argv[1])))
from notary.cli import main
sys.exit(main(sys.argv[2:]))
"""


def start_server(processes: Processes, name: str, argv: Sequence[str], ports: Sequence[int], *,
                 cpu: int | Iterable[int] | None, log: Path, cwd: Path | None = None,
                 env: dict[str, str | None] | None = None,
                 connect: bool = True) -> subprocess.Popen[bytes]:
    """``Processes.start``, then a wait until it listens on every one of ``ports``
    (``connect=False``: seen in /proc/net/tcp, no connection made); raises if it does not."""
    process = processes.start(name, argv, cpu=cpu, log=log, cwd=cwd, env=env)

    def listening(port: int) -> bool:
        with contextlib.suppress(OSError):
            if not connect:
                return listen_queue(port) is not None
            socket.create_connection((LOOPBACK, port), timeout=1.0).close()
            return True
        return False

    deadline = time.monotonic() + READY_TIMEOUT_S
    for port in ports:
        while process.poll() is None and not listening(port):
            if time.monotonic() > deadline:
                raise BenchError(f"{name} not listening on port {port}:\n{tail(log)}")
            time.sleep(0.05)
        if process.returncode is not None:
            raise BenchError(f"{name} exited with {process.returncode}:\n{tail(log)}")
    return process


def nginx_stream_module(nginx: str) -> str:
    """The ``load_module`` line ``nginx`` needs for its ``stream`` module
    ("" when built in); ``BenchError`` when it has none (Debian:
    ``libnginx-mod-stream``, installed by ``.ci/install-tools bench``)."""
    built = subprocess.run([nginx, "-V"], capture_output=True, text=True, check=False).stderr
    if re.search(r"--with-stream(\s|$)", built):
        return ""
    found = re.search(r"--modules-path=(\S+)", built)
    module = Path(found.group(1) if found else "/usr/lib/nginx/modules") / "ngx_stream_module.so"
    if not module.exists():
        raise BenchError(f"nginx has no stream module ({module}): install libnginx-mod-stream")
    return f"load_module {module};"


def nginx_answer_block(port: int, setup: NotarySetup, answer: bytes, work: Path, *,
                       access_log: str = "access_log off;", tls_extra: str = "") -> str:
    """An ``http`` block for ``start_nginx``: TLS on ``port`` with the notary's
    certificate and key, answering ``setup.path`` with ``answer``'s body and
    Content-Type (``return 200``: nginx answers a POST to a static file 405);
    ``access_log``: its logging directives; ``tls_extra``: more ``server``
    directives (session resumption off, say)."""
    text = answer.split(b"\r\n\r\n", 1)[1].decode("utf-8")
    if "$" in text:
        raise BenchError("the answer holds '$': nginx would read it as a variable")
    quoted = text.replace("\\", "\\\\").replace("'", "\\'")
    found = re.search(rb"\r\ncontent-type:\s*([^\r]+)", answer, re.IGNORECASE)
    content_type = found.group(1).decode("latin-1") if found else "application/json"
    temp_paths = "\n    ".join(f"{kind}_temp_path {work}/{kind};"
                               for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""http {{
    {access_log}
    {temp_paths}
    keepalive_requests 1000000;
    server {{
        listen {LOOPBACK}:{port} ssl;
        ssl_certificate {setup.cert};
        ssl_certificate_key {setup.key};
        ssl_protocols TLSv1.2 TLSv1.3;
        {tls_extra}
        location = {setup.path} {{
            default_type {content_type};
            return 200 '{quoted}';
        }}
    }}
}}
"""


def start_nginx(processes: Processes, nginx: str, work: Path, blocks: str, ports: Sequence[int],
                *, cpu: int | None, top: str = "") -> subprocess.Popen[bytes]:
    """One foreground nginx process (``master_process off``: the process
    started serves, so its CPU is the server's) with its files in ``work``,
    serving ``blocks`` (``http``/``stream``), ``top`` before them (``load_module``)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "nginx.conf"
    config.write_text(f"""{top}
daemon off;
master_process off;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 4096; }}
{blocks}""", encoding="utf-8")
    argv = [nginx, "-p", str(work), "-c", str(config), "-e", str(work / "error.log")]
    return start_server(processes, work.name, argv, ports, cpu=cpu, log=work / "nginx.out")


def start_postgres(processes: Processes, directory: Path, *, cpu: int | None,
                   settings: Sequence[str] = ()) -> str:
    """A throwaway PostgreSQL (Debian's ``postgresql``, as the ``postgres``
    user when root) in ``directory``, on a loopback port, with ``settings``
    (``name=value``) on top of its defaults; its DSN. Raises if absent."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        raise BenchError("PostgreSQL is not installed: .ci/install-tools tests")
    binaries, as_postgres = found[-1].parent, []
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(directory, user.pw_uid, user.pw_gid)
        os.chmod(directory.parent, directory.parent.stat().st_mode | 0o711)  # let it reach in
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, port = directory / "data", free_ports(1)[0]
    subprocess.run([*as_postgres, str(binaries / "initdb"), "-D", str(data), "-A", "trust",
                    "-U", "postgres", "-E", "UTF8"], check=True, capture_output=True)
    options = [f"listen_addresses={LOOPBACK}", *settings]
    start_server(processes, "postgresql", [
        *as_postgres, str(found[-1]), "-D", str(data), "-p", str(port), "-k", str(directory),
        *(arg for option in options for arg in ("-c", option)),
    ], [port], cpu=cpu, log=directory / "postgresql.log")
    return f"host={LOOPBACK} port={port} user=postgres dbname=postgres"


@dataclass(frozen=True)
class NotarySetup:
    directory: Path
    config: Path
    api_port: int
    plain_port: int
    admin_port: int | None = None  # [admin] listen (metrics, health), None without one

    @property
    def path(self) -> str:
        """The benchmark's query: the notary asked about its own HTTPS port."""
        return f"/target/{LOOPBACK}+{self.api_port}"

    @property
    def cert(self) -> Path:
        return self.directory / "notary.crt"

    @property
    def key(self) -> Path:
        return self.directory / "notary.key"


def _set_keys(text: str, options: dict[str, dict[str, object]]) -> str:
    """``text`` (TOML) with ``options[section][key]`` set under the section's
    header (added at the end if missing), any other line of that key dropped."""
    def assignments(section: str) -> list[str]:
        return [f"{key} = {json.dumps(value)}" for key, value in options.get(section, {}).items()]

    section, seen, lines = "", set(), []
    for line in text.splitlines():
        header = re.fullmatch(r"\s*\[([\w.-]+)\]\s*(#.*)?", line)
        if header:
            section = header.group(1)
            seen.add(section)
            lines += [line, *assignments(section)]
            continue
        key = line.split("=", 1)[0].strip() if "=" in line else ""
        if line.lstrip().startswith("#") or key not in options.get(section, {}):
            lines.append(line)
    for name in options:
        if name not in seen:
            lines += ["", f"[{name}]", *assignments(name)]
    return "\n".join(lines) + "\n"


def make_notary(directory: Path, api_port: int, relay_api_port: int, plain_port: int,
                spare_ports: Sequence[int] | None = None) -> NotarySetup:
    """A fresh notary by ``notary dev-init`` in ``directory``, its config edited
    and checked: every listener on a loopback port chosen here (bench/README.md)."""
    spare = list(spare_ports) if spare_ports is not None else free_ports(4)
    result = subprocess.run(
        [sys.executable, "-m", "notary", "dev-init", "--dir", str(directory),
         "--api-port", str(api_port), "--relay-api-port", str(relay_api_port)],
        cwd=ROOT, env=project_env(), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BenchError(f"notary dev-init failed ({result.returncode}):\n{result.stderr}")
    config = directory / "notary.toml"
    text = config.read_text()
    # No transparency log unless a bench asks for one (bench_log.py): the
    # other benches keep measuring what they measured before dev-init kept
    # a log (f5408b4).
    options: dict[str, dict[str, object]] = {
        "server": {"plain_api": [f"{LOOPBACK}:{plain_port}"], "log_level": "warning"},
        "relay": {"listen": []}, "log": {"enabled": False}}
    listeners = [name for name, section in tomllib.loads(text).items()
                 if isinstance(section, dict) and "listen" in section and name != "relay"]
    if len(listeners) > len(spare):
        raise BenchError("not enough spare ports for the config's listeners")
    for name, port in zip(listeners, spare, strict=False):  # enough ports: checked above
        options[name] = {"listen": [f"{LOOPBACK}:{port}"]}
    text = _set_keys(text, options)
    config.write_text(text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BenchError(f"config edit broke the TOML ({exc}):\n{text}") from None
    server = raw["server"]
    # Every listening address, by section.key.
    addresses = {f"server.{key}": list(server.get(key, [])) for key in ("api", "plain_api")}
    addresses.update((f"{name}.listen", list(section["listen"])) for name, section in raw.items()
                     if isinstance(section, dict) and "listen" in section)
    chosen = {api_port, relay_api_port, plain_port, *spare}
    strays = [f"{where} {address}" for where, values in addresses.items() for address in values
              if address.rsplit(":", 1)[0] != LOOPBACK
              or int(address.rsplit(":", 1)[1]) not in chosen]
    expected = {
        "plain_api": addresses.get("server.plain_api") == [f"{LOOPBACK}:{plain_port}"],
        "log_level": server.get("log_level") == "warning",
        "relay listen": raw.get("relay", {}).get("listen", []) == [],
        "no log": raw.get("log", {}).get("enabled") is False,
        "every listener on a chosen loopback port": not strays}
    if not all(expected.values()):
        raise BenchError(f"config edit failed ({expected}; strays {strays}):\n{text}")
    admin = addresses.get("admin.listen", [])
    admin_port = int(admin[0].rsplit(":", 1)[1]) if len(admin) == 1 else None
    return NotarySetup(directory, config, api_port, plain_port, admin_port)


def new_notary(directory: Path, options: dict[str, dict[str, object]] | None = None,
               ports: Sequence[int] | None = None) -> NotarySetup:
    """``make_notary`` on free ports (or ``ports``: api, relay api, plain, spare...),
    ``options[section][key]`` set in its TOML and read back by the notary's loader."""
    from notary.config import load_config

    api_port, relay_api_port, plain_port, *spare = ports or free_ports(7)
    setup = make_notary(directory, api_port, relay_api_port, plain_port, spare)
    if options:
        setup.config.write_text(_set_keys(setup.config.read_text(), options))
        loaded = load_config(setup.config)
        for name, values in options.items():
            for key, value in values.items():
                got = getattr(getattr(loaded, name), key)
                if str(got) != str(value) and got != value:
                    raise BenchError(
                        f"config edit: [{name}] {key} reads back {got!r}, not {value!r}")
    return setup


@dataclass
class RunningNotary:
    """A started notary, primed: its query's body and exact answer."""

    setup: NotarySetup
    process: subprocess.Popen[bytes]
    log: Path
    body: str = ""
    answer: bytes = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise BenchError(f"the notary exited ({self.process.returncode}):\n{tail(self.log)}")


def start_notary(processes: Processes, setup: NotarySetup, name: str, *,
                 cpu: int | Iterable[int] | None, log: Path, argv: Sequence[str] | None = None,
                 prime: bool = True, env: dict[str, str | None] | None = None) -> RunningNotary:
    """Start ``notary serve`` (or ``argv``) on ``setup``, with ``env`` added to (None:
    removed from) its environment, and wait for its listeners; ``prime``: ask it about
    itself with its own SHA-1 pin (a cache hit from then on)."""
    process = start_server(processes, name, argv or notary_argv(setup),
                           [setup.plain_port, setup.api_port], cpu=cpu, log=log,
                           cwd=setup.directory, env=env)
    notary = RunningNotary(setup, process, log)
    if prime:
        with connect(setup.api_port, tls=True, timeout_s=10.0) as sock:
            pin = hashlib.sha1(sock.getpeercert(binary_form=True)).digest().hex(":").upper()
        notary.body = f"fingerprint={pin}"
        notary.answer = prime_notary(setup, notary.body)
    return notary


def notary_argv(setup: NotarySetup, extra: Sequence[str] = (), *,
                profile_out: Path | None = None) -> list[str]:
    """``notary serve`` on ``setup``'s config, ``--workers 1`` unless ``extra`` says
    otherwise; with ``profile_out``, under ``PROFILE_WRAPPER``'s cProfile."""
    workers = [] if "--workers" in extra else ["--workers", "1"]
    serve = ["serve", "--config", str(setup.config), *workers, *extra]
    if profile_out is None:
        return [sys.executable, "-m", "notary", *serve]
    return [sys.executable, "-c", PROFILE_WRAPPER, str(profile_out), *serve]


def prime_notary(setup: NotarySetup, body: str) -> bytes:
    """Make the target a cache hit; return the notary's exact answer to the query."""
    request = post_request(setup.plain_port, setup.path, body)
    first = exchange(setup.plain_port, request, tls=False, timeout_s=PRIME_TIMEOUT_S)[0]
    if status_of(first) != 200:
        raise BenchError(f"priming POST {setup.path} answered:\n{first.decode(errors='replace')}")
    hits = exchange(setup.plain_port, request, tls=False, count=3)
    if len({*hits}) != 1 or status_of(hits[0]) != 200:
        raise BenchError(f"cache-hit answers differ or are not 200: {hits!r}")
    over_tls = exchange(setup.api_port, post_request(setup.api_port, setup.path, body), tls=True)
    if over_tls[0] != hits[0]:
        raise BenchError("the HTTPS answer differs from the plain-HTTP answer")
    return hits[0]
