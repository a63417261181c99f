"""A multi-worker node as an operator runs it: ``notary serve --workers 2``
in a subprocess (loopback only). A worker killed with SIGKILL under load is
restarted while the other keeps answering; SIGTERM under load answers or
cleanly refuses every request and loses no observation."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from notary.config import Endpoint
from notary.model.targets import Target
from notary.server.sockets import bind_endpoint
from notary.state.store import Store
from tests.support.nodes import ROOT, get, plain_port, run_node, tls_targets
from tests.support.notaries import LOCALHOST, make_notary_files


async def test_a_killed_worker_is_restarted_and_the_other_keeps_answering(
    tmp_path: Path,
) -> None:
    async with tls_targets(1) as ports, run_node(tmp_path) as node:
        port = await plain_port(node)
        path = f"/target/127.0.0.1+{ports[0]}"
        assert await get(port, path) == ("answered", 200)  # probed once, cached
        pids = {
            int(m.group(1)): int(m.group(2))
            for line in node.log if (m := re.search(r"worker (\d) started \(pid (\d+)\)", line))
        }
        mark = len(node.log)
        os.kill(pids[0], signal.SIGKILL)
        outcomes = []
        with trio.move_on_after(1.0):  # the other worker answers meanwhile
            while True:
                outcomes.append(await get(port, path))
        restarted = await node.wait_for(r"worker 0 started \(pid (\d+)\)", after=mark)
        await node.wait_for(r"worker 0 \(pid \d+\) ready", after=mark)
        for _ in range(20):
            outcomes.append(await get(port, path))
    assert int(restarted.group(1)) != pids[0]
    assert any("worker 0" in line and "SIGKILL" in line for line in node.log[mark:])
    answered = [o for o in outcomes if o[0] == "answered"]
    # Only requests caught on the killed worker's connections may fail.
    assert len(answered) >= len(outcomes) - 2 and len(answered) > 20
    assert all(status in (200, 409) for _, status in answered)


async def test_sigterm_under_load_answers_or_refuses_and_loses_no_observation(
    tmp_path: Path,
) -> None:
    async with tls_targets(60) as ports, run_node(tmp_path) as node:
        port = await plain_port(node)
        outcomes: dict[int, tuple[str, int]] = {}
        first_answers = trio.Event()

        async def client(targets: list[int]) -> None:
            for target_port in targets:
                outcomes[target_port] = await get(port, f"/target/127.0.0.1+{target_port}")
                if sum(o == ("answered", 200) for o in outcomes.values()) >= 10:
                    first_answers.set()

        async with trio.open_nursery() as nursery:
            for start in range(4):  # four clients, each over its own targets
                nursery.start_soon(client, ports[start::4])
            await first_answers.wait()
            node.process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            status = await node.process.wait()
    assert status == 0
    assert "broken" not in {kind for kind, _ in outcomes.values()}, outcomes
    answered = [p for p, outcome in outcomes.items() if outcome == ("answered", 200)]
    assert len(answered) >= 10
    with Store(tmp_path / "notary.db", create=False) as store:
        for target_port in answered:  # every answer's observation was committed
            timeline = store.load_timeline(Target(LOCALHOST, target_port))
            assert timeline.observations, target_port


async def test_sighup_reloads_the_target_policy_in_every_worker(tmp_path: Path) -> None:
    async with tls_targets(2) as ports, run_node(tmp_path) as node:
        port = await plain_port(node)
        assert await get(port, f"/target/127.0.0.1+{ports[0]}") == ("answered", 200)
        config = tmp_path / "notary.toml"
        config.write_text(config.read_text().replace(
            'allow_targets = ["127.0.0.0/8"]', "allow_targets = []"
        ))
        mark = len(node.log)
        node.process.send_signal(signal.SIGHUP)
        for _ in range(2):  # both workers
            await node.wait_for(r"reloaded: target policy", after=mark)
            mark = next(i for i in range(mark, len(node.log)) if "reloaded" in node.log[i]) + 1
        # Loopback is now refused for new probes, whichever worker answers.
        for _ in range(6):
            assert await get(port, f"/target/127.0.0.1+{ports[1]}") == ("answered", 403)
        # A config that does not validate is not applied.
        config.write_text(config.read_text().replace("allow_targets = []", "allow_targets = 7"))
        mark = len(node.log)
        node.process.send_signal(signal.SIGHUP)
        await node.wait_for(r"reload: kept the previous settings: .*allow_targets", after=mark)
        assert await get(port, f"/target/127.0.0.1+{ports[1]}") == ("answered", 403)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
async def test_started_as_root_it_serves_as_the_configured_user() -> None:
    nobody = pwd.getpwnam("nobody")
    # Not under pytest's tmp_path: its parents are private to root.
    directory = Path(tempfile.mkdtemp(prefix="notary-drop-"))
    try:
        os.chmod(directory, 0o777)  # the database is created there as nobody
        async with run_node(directory, workers=1, extra=["--user", "nobody"]) as node:
            await node.wait_for(r"dropped privileges to nobody")
            match = await node.wait_for(r"plain-HTTP API .* on 127\.0\.0\.1:(\d+)")
            assert await get(int(match.group(1)), "/") == ("answered", 200)
            status = await trio.Path(f"/proc/{node.process.pid}/status").read_text()
            uids = re.search(r"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)", status, re.M)
            assert uids is not None
            assert {int(uid) for uid in uids.groups()} == {nobody.pw_uid}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


ACTIVATED = """
import os, sys
# What systemd does between fork and exec: the passed sockets at fds 3, 4, ...
# and LISTEN_PID naming this very process.
for number, fd in enumerate(int(fd) for fd in sys.argv[1].split(",")):
    os.dup2(fd, 3 + number)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
from notary.cli import main
raise SystemExit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("workers", [1, 2])
async def test_under_a_service_manager_it_serves_the_passed_sockets_and_reports(
    tmp_path: Path, workers: int
) -> None:
    """A fake systemd: a notification socket, socket activation (the
    config's own addresses are never bound), a watchdog period; the node
    reports READY=1, then WATCHDOG=1 beats, then STOPPING=1 on SIGTERM."""
    key, cert, _ = make_notary_files(tmp_path)
    config = tmp_path / "notary.toml"
    config.write_text(
        f'[server]\nkey_file = "{key}"\ncert_file = "{cert}"\ndb_file = "notary.db"\n'
        f'api = ["{LOCALHOST}:0"]\nplain_api = ["{LOCALHOST}:0"]\n'
        f'[relay]\nlisten = []\n[admin]\nlisten = []\n[node]\nworkers = {workers}\n'
    )
    manager = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await manager.bind(str(tmp_path / "notify"))
    passed = [bind_endpoint(Endpoint(LOCALHOST, 0))[0] for _ in range(2)]
    plain = passed[1].getsockname()[1]
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), NOTIFY_SOCKET=str(tmp_path / "notify"),
        WATCHDOG_USEC="600000", LISTEN_FDS="2", LISTEN_FDNAMES="api:plain_api",
    )
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", ACTIVATED, ",".join(str(s.fileno()) for s in passed),
         "serve", "--config", str(config)],
        env=env, cwd=tmp_path, pass_fds=[s.fileno() for s in passed],
        stderr=subprocess.DEVNULL,
    )
    for sock in passed:
        sock.close()  # the node holds them now
    messages: list[str] = []
    try:
        with trio.fail_after(30):
            while not any("READY=1" in m for m in messages):
                messages.append((await manager.recv(4096)).decode())
            assert await get(plain, "/") == ("answered", 200)
            while sum("WATCHDOG=1" in m for m in messages) < 2:
                messages.append((await manager.recv(4096)).decode())
            process.send_signal(signal.SIGTERM)
            while not any("STOPPING=1" in m for m in messages):
                messages.append((await manager.recv(4096)).decode())
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
        manager.close()
    kinds = [next(s for s in ("READY", "WATCHDOG", "STOPPING", "STATUS") if s in m)
             for m in messages]
    assert kinds.index("READY") < kinds.index("WATCHDOG") < kinds.index("STOPPING")
    assert all(m.startswith(("READY=1", "WATCHDOG=1", "STOPPING=1", "STATUS=")) for m in messages)
