"""The systemd protocol (notary.node.systemd) and the units in systemd/.

Notifications go to real AF_UNIX datagram sockets (a path in a tmp dir, and
the abstract namespace). Socket activation runs a child process that gets
real listening sockets at fds 3, 4, ... and ``LISTEN_PID`` set to its own
pid, as systemd does. The units are checked with ``systemd-analyze``
(verify, and the offline security score); those tests skip without it.
"""

from __future__ import annotations

import configparser
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from notary.config import load_config
from notary.errors import UsageError
from notary.node import systemd
from notary.node.supervisor import KILL_MARGIN_S
from notary.node.systemd import Notifier, listen_fds, notify, watchdog_interval_s
from notary.server.sockets import ROLES

REPO = Path(__file__).resolve().parents[1]
UNITS = REPO / "systemd"
SERVICE = UNITS / "notary.service"
SOCKET_UNITS = sorted(UNITS.glob("*.socket"))
#: The exposure ``systemd-analyze security`` may give notary.service at most.
MAX_EXPOSURE = 2.5


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
                 "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(systemd, "_warned_addresses", set())


def receiver(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


# -- notify ---------------------------------------------------------------------


def test_notify_sends_the_states_as_one_datagram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "notify")
    with receiver(path) as manager:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert notify("READY=1", "STATUS=8 workers serving", f"MAINPID={os.getpid()}")
        assert manager.recv(4096) == f"READY=1\nSTATUS=8 workers serving\nMAINPID={os.getpid()}".encode()


def test_notify_reaches_the_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"notary-test-{uuid.uuid4().hex}"
    with receiver(b"\0" + name.encode()) as manager:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("WATCHDOG=1")
        assert manager.recv(4096) == b"WATCHDOG=1"


def test_a_newline_in_a_value_cannot_start_another_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "notify")
    with receiver(path) as manager:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert notify("STATUS=disk full\nREADY=1")
        assert manager.recv(4096) == b"STATUS=disk full READY=1"


def test_notify_without_notify_socket_is_a_no_op() -> None:
    assert notify("READY=1") is False
    with Notifier() as notifier:
        assert not notifier.enabled
        assert notifier.notify("READY=1") is False


def test_a_state_that_is_not_key_value_is_a_bug() -> None:
    with pytest.raises(ValueError, match="KEY=VALUE"):
        notify("READY")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        notify("=1")


def test_a_missing_socket_returns_false_and_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-here"))
    with caplog.at_level(logging.DEBUG, logger="notary.node.systemd"):
        assert notify("READY=1") is False
        assert notify("WATCHDOG=1") is False
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.WARNING, logging.DEBUG]
    assert "nobody-here" in caplog.records[0].getMessage()


def test_a_socket_nobody_reads_returns_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "notify")
    receiver(path).close()  # the path stays, bound to nothing: ECONNREFUSED
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert notify("READY=1") is False


def test_a_full_socket_never_blocks_the_sender(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with receiver(path), Notifier(path) as notifier:  # a manager that never reads
        results = [notifier.notify("WATCHDOG=1") for _ in range(10_000)]
    assert results[0] is True
    assert results[-1] is False  # EAGAIN once the queue is full, not a hang


def test_a_notifier_keeps_its_socket_and_reopens_after_a_failure(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with Notifier(path) as notifier:
        manager = receiver(path)
        assert notifier.notify("READY=1")
        first = notifier._socket
        assert notifier.notify("WATCHDOG=1")
        assert notifier._socket is first
        assert [manager.recv(4096), manager.recv(4096)] == [b"READY=1", b"WATCHDOG=1"]
        manager.close()
        os.unlink(path)
        assert notifier.notify("WATCHDOG=1") is False  # systemd restarting
        with receiver(path) as manager:  # ...and back, at the same path
            assert notifier.notify("WATCHDOG=1")
            assert manager.recv(4096) == b"WATCHDOG=1"
    assert notifier._socket is None


# -- watchdog -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        (None, None, None),
        ("", None, None),
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("1000", "self", 0.0005),
        ("30000000", "other", None),
    ],
)
def test_watchdog_interval_is_half_the_period_for_this_process(
    usec: str | None, pid: str | None, expected: float | None
) -> None:
    environ = {}
    if usec is not None:
        environ["WATCHDOG_USEC"] = usec
    if pid is not None:
        environ["WATCHDOG_PID"] = str(os.getpid() if pid == "self" else os.getpid() + 1)
    assert watchdog_interval_s(environ) == expected


def test_watchdog_interval_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval_s() == 10.0


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"WATCHDOG_USEC": "30s"}, "WATCHDOG_USEC"),
        ({"WATCHDOG_USEC": "0"}, "WATCHDOG_USEC"),
        ({"WATCHDOG_USEC": "-5"}, "WATCHDOG_USEC"),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"}, "WATCHDOG_PID"),
    ],
)
def test_a_malformed_watchdog_variable_is_a_usage_error(
    environ: dict[str, str], variable: str
) -> None:
    with pytest.raises(UsageError, match=rf"\${variable}"):
        watchdog_interval_s(environ)


# -- socket activation ----------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, os, socket, sys
    from notary.errors import UsageError
    from notary.node.systemd import listen_fds

    unset = sys.argv[1] == "unset"
    try:
        sockets = listen_fds(unset_environment=unset)
    except UsageError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(0)
    described = {}
    for name, socks in sockets.items():
        described[name] = []
        for sock in socks:
            address = sock.getsockname()
            described[name].append({
                "fd": sock.fileno(),
                "family": sock.family.name,
                "type": sock.type.name,
                "address": address[1] if isinstance(address, tuple) else address,
                "inheritable": os.get_inheritable(sock.fileno()),
            })
    left = {k: v for k, v in os.environ.items() if k.startswith("LISTEN_")}
    print(json.dumps({"sockets": described, "environment": left}))
""")


def activate(
    sockets: list[socket.socket | int],
    env: dict[str, str],
    *,
    listen_pid: str = "$$",
    unset: bool = True,
) -> dict:
    """Start the child as systemd would: ``sockets`` dup'ed to fds 3, 4, ...
    and ``LISTEN_PID`` the child's own pid (``$$`` of the shell that execs
    it), then return what ``listen_fds`` gave it."""
    # Copies above any target number first, so no dup2 clobbers a source.
    sources = [
        fcntl.fcntl(s if isinstance(s, int) else s.fileno(), fcntl.F_DUPFD_CLOEXEC, 100)
        for s in sockets
    ]
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, out_write, 1), (os.POSIX_SPAWN_DUP2, err_write, 2)]
    actions += [
        (os.POSIX_SPAWN_DUP2, source, systemd.LISTEN_FDS_START + i)
        for i, source in enumerate(sources)
    ]
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("LISTEN_", "NOTIFY_"))
    }
    environment.update(env)
    environment["PYTHONPATH"] = str(REPO)
    script = f'LISTEN_PID={listen_pid}; export LISTEN_PID; exec "$0" "$@"'
    try:
        pid = os.posix_spawn(
            "/bin/sh",
            ["/bin/sh", "-c", script, sys.executable, "-c", CHILD,
             "unset" if unset else "keep"],
            environment,
            file_actions=actions,
        )
    finally:
        for fd in (out_write, err_write, *sources):
            os.close(fd)
    with os.fdopen(out_read, "rb") as out, os.fdopen(err_read, "rb") as err:
        stdout, stderr = out.read(), err.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, stderr.decode()
    return json.loads(stdout)


@pytest.fixture
def listeners(tmp_path: Path):
    tcp = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "relay.sock"))
    unix.listen()
    yield [*tcp, unix]
    for sock in [*tcp, unix]:
        sock.close()


def test_listen_fds_groups_the_passed_sockets_by_name(listeners: list[socket.socket]) -> None:
    result = activate(listeners, {"LISTEN_FDS": "3", "LISTEN_FDNAMES": "api:api:relay"})
    sockets = result["sockets"]
    assert sorted(sockets) == ["api", "relay"]
    assert [(s["fd"], s["family"], s["type"], s["address"]) for s in sockets["api"]] == [
        (3, "AF_INET", "SOCK_STREAM", listeners[0].getsockname()[1]),
        (4, "AF_INET", "SOCK_STREAM", listeners[1].getsockname()[1]),
    ]
    assert [(s["fd"], s["family"], s["address"]) for s in sockets["relay"]] == [
        (5, "AF_UNIX", listeners[2].getsockname()),
    ]
    # close-on-exec, as sd_listen_fds leaves them; the variables are gone
    assert not any(s["inheritable"] for socks in sockets.values() for s in socks)
    assert result["environment"] == {}


def test_listen_fds_without_names_calls_them_unknown(listeners: list[socket.socket]) -> None:
    result = activate(listeners[:2], {"LISTEN_FDS": "2"})
    assert [s["fd"] for s in result["sockets"][systemd.UNNAMED]] == [3, 4]
    assert list(result["sockets"]) == ["unknown"]


def test_an_empty_name_is_unknown(listeners: list[socket.socket]) -> None:
    result = activate(listeners[:2], {"LISTEN_FDS": "2", "LISTEN_FDNAMES": "api:"})
    assert {name: [s["fd"] for s in socks] for name, socks in result["sockets"].items()} == {
        "api": [3], "unknown": [4],
    }


def test_listen_fds_can_leave_the_environment(listeners: list[socket.socket]) -> None:
    result = activate(listeners[:1], {"LISTEN_FDS": "1", "LISTEN_FDNAMES": "api"}, unset=False)
    assert list(result["sockets"]) == ["api"]
    assert result["environment"]["LISTEN_FDS"] == "1"
    assert result["environment"]["LISTEN_FDNAMES"] == "api"


def test_sockets_for_another_process_are_not_taken(listeners: list[socket.socket]) -> None:
    result = activate(listeners[:1], {"LISTEN_FDS": "1"}, listen_pid="1")
    assert result == {"sockets": {}, "environment": {}}


def test_an_fd_that_is_not_a_socket_is_a_usage_error(
    listeners: list[socket.socket], tmp_path: Path
) -> None:
    path = tmp_path / "file"
    path.write_text("not a socket")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        result = activate([listeners[0], fd], {"LISTEN_FDS": "2", "LISTEN_FDNAMES": "api:api"})
    finally:
        os.close(fd)
    assert result["error"] == "$LISTEN_FDS: fd 4 is not a socket"
    result = activate(listeners[:1], {"LISTEN_FDS": "3"})  # fds 4 and 5 not open
    assert result["error"].startswith("$LISTEN_FDS: fd 4: ")


def test_without_activation_there_are_no_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    assert listen_fds() == {}
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    assert listen_fds() == {}  # no LISTEN_FDS: nothing passed
    assert "LISTEN_PID" not in os.environ
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    monkeypatch.setenv("LISTEN_FDS", "0")
    monkeypatch.setenv("LISTEN_FDNAMES", "")
    assert listen_fds() == {}


def test_a_wrong_listen_pid_leaves_the_fds_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    monkeypatch.setenv("LISTEN_FDS", "2")
    assert listen_fds(unset_environment=False) == {}
    assert os.environ["LISTEN_FDS"] == "2"
    assert listen_fds() == {}
    assert "LISTEN_FDS" not in os.environ


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"LISTEN_PID": "self", "LISTEN_FDS": "two"}, r"\$LISTEN_FDS must be a count"),
        ({"LISTEN_PID": "self", "LISTEN_FDS": "-1"}, r"\$LISTEN_FDS must be a count"),
        ({"LISTEN_PID": "pid1", "LISTEN_FDS": "1"}, r"\$LISTEN_PID must be a positive integer"),
        ({"LISTEN_PID": "self", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "api:relay:perspectives"},
         r"\$LISTEN_FDNAMES has 3 names for 2 file descriptors"),
    ],
)
def test_malformed_variables_are_usage_errors_naming_them(
    environ: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each fails before any fd is looked at, so this process's fds 3... are safe.
    for name, value in environ.items():
        monkeypatch.setenv(name, str(os.getpid()) if value == "self" else value)
    with pytest.raises(UsageError, match=message):
        listen_fds()
    assert not any(name.startswith("LISTEN_") for name in os.environ)


# -- the units ------------------------------------------------------------------


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    return parser


def unit_values(path: Path, section: str, key: str) -> list[str]:
    """Every value of a key repeated in a unit (configparser keeps the last)."""
    values, current = [], None
    for line in path.read_text().splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line.startswith(f"{key}="):
            values.append(line.partition("=")[2])
    return values


def test_the_sockets_are_one_unit_per_role_wired_to_the_service() -> None:
    service = read_unit(SERVICE)
    assert sorted(service["Service"]["Sockets"].split()) == [p.name for p in SOCKET_UNITS]
    ports = {}
    for path in SOCKET_UNITS:
        unit = read_unit(path)
        name = unit["Socket"]["FileDescriptorName"]
        assert name in ROLES
        assert unit["Socket"]["Service"] == "notary.service"
        ports[name] = {int(port) for port in unit_values(path, "Socket", "ListenStream")}
    assert ports == {"api": {443, 4242}, "relay": {80}, "perspectives": {8080}}
    # The sample config names the same ports, for a start without activation.
    config = load_config(UNITS / "notary.toml")
    assert {e.port for e in config.server.api} == ports["api"]
    assert {e.port for e in config.relay.listen} == ports["relay"]
    assert {e.port for e in config.perspectives.listen} == ports["perspectives"]


def test_the_service_waits_longer_than_a_graceful_stop() -> None:
    service = read_unit(SERVICE)["Service"]
    config = load_config(UNITS / "notary.toml")
    timeout_s = int(service["TimeoutStopSec"].removesuffix("s"))
    assert timeout_s > config.node.graceful_timeout_s + KILL_MARGIN_S
    assert (service["Type"], service["NotifyAccess"], service["KillMode"]) == (
        "notify", "main", "mixed"
    )
    assert config.admin.listen[0].host == "127.0.0.1"
    assert config.server.db_file.parent == Path("/var/lib/notary")
    for command in [*unit_values(SERVICE, "Service", "ExecStartPre"), service["ExecStart"]]:
        assert command.startswith("/opt/notary/bin/notary ")
        assert "--config /etc/notary/notary.toml" in command


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed (.ci/install-tools installs systemd)")
    return path


@pytest.fixture
def installed_units(tmp_path: Path) -> Path:
    """The units in a tmp dir, their program replaced by a stub that exists:
    verify requires every Exec*= command to be executable."""
    stub = tmp_path / "bin" / "notary"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for path in [SERVICE, *SOCKET_UNITS]:
        text = path.read_text().replace("/opt/notary/bin/notary", str(stub))
        (units / path.name).write_text(text)
    return units


def test_systemd_analyze_verify_passes(installed_units: Path) -> None:
    analyze = systemd_analyze()
    names = [SERVICE.name, *(p.name for p in SOCKET_UNITS)]
    result = subprocess.run(
        [analyze, "verify", "--man=no", *names],
        cwd=installed_units, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "notary" not in result.stderr, result.stderr  # no warning about our units


def test_the_service_sandbox_scores_at_most_2_5(installed_units: Path) -> None:
    analyze = systemd_analyze()
    result = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", SERVICE.name],
        cwd=installed_units, capture_output=True, text=True, timeout=60,
    )
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("systemd-analyze security --offline needs systemd 250 or later")
    assert result.returncode == 0, result.stderr
    match = re.search(r"Overall exposure level for notary\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout
