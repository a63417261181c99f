"""The node supervisor: ``notary serve`` with more than one worker.

One Trio loop per core: the supervisor starts ``workers`` processes, each
``python -m notary <the same serve arguments>`` running its own loop, cache
and writer on the listening sockets the supervisor opened (or took from
systemd) and passed down (``notary.server.sockets``). The kernel spreads the
connections among the workers accepting on a shared socket. All workers
write to the one SQLite database (WAL, busy timeout); each worker rescans
the targets asked of it with its share of the budgets, and skips a target
another worker observed meanwhile (the scheduler's rule 11), so targets are
not rescanned once per worker.

What the supervisor does
    * draws the node's TLS session-ticket keys and hands them to every
      worker it starts (``notary.server.tickets``), so that a client resumes
      its TLS session with whichever worker its reconnection reaches;
    * tells each worker its index (``$NOTARY_WORKER_INDEX``), its sockets,
      and a ``$NOTIFY_SOCKET`` of its own (a datagram socket in a private
      directory, with ``SO_PASSCRED`` so a message names its sender's pid)
      and ``$WATCHDOG_USEC`` = ``[node] worker_timeout_s``: a worker reports
      exactly as it would to systemd (``notary.node.lifecycle``);
    * sends systemd ``READY=1`` once every worker has said ``READY=1``,
      ``STATUS=`` as workers come and go, ``WATCHDOG=1`` every half period
      while no worker is overdue, and ``STOPPING=1``;
    * kills a worker whose last ``WATCHDOG=1`` (or start) is older than
      ``worker_timeout_s`` (a stuck loop or writer), and restarts a worker
      that exits: after ``restart_delay_s``, doubled for each death less
      than a minute after the worker's start, up to ``restart_max_delay_s``;
    * on SIGTERM or SIGINT: SIGTERM to every worker (each stops gracefully,
      see ``lifecycle``), SIGKILL to those still running
      ``graceful_timeout_s`` + ``KILL_MARGIN_S`` later; then exits 0;
    * forwards SIGHUP to every worker.

A worker that exits with status 2 (a usage error: unreadable key, bad
config) is not restarted: the node stops with status 2, since a restart
cannot fix it.

Resource handling: ``supervise`` owns the worker processes (none outlives
it), its private directory (removed at exit), the memory file of the ticket
keys (closed at exit) and the listening sockets it is given (closed at exit;
the workers hold their own copies).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from notary.config import Config
from notary.node.systemd import Notifier, watchdog_interval_s
from notary.server.metrics import worker_exited
from notary.server.sockets import Sockets, close_all, worker_environment
from notary.server.tickets import TICKET_KEYS_ENV, new_ticket_keys, ticket_keys_file

log = logging.getLogger(__name__)

WORKER_INDEX_ENV = "NOTARY_WORKER_INDEX"
#: Past the graceful timeout, how long a stopping worker gets to exit.
KILL_MARGIN_S = 5.0
#: A worker that dies sooner than this after its start backs off longer.
QUICK_DEATH_S = 60.0
#: Exit status of a usage error (``notary.cli``): not worth a restart.
USAGE_ERROR_STATUS = 2
_UCRED = struct.Struct("iII")  # pid, uid, gid


@dataclass
class Worker:
    index: int
    process: trio.Process | None = None
    started_at: float = 0.0
    last_beat: float = 0.0
    ready: bool = False
    restarts: int = 0
    pids: list[int] = field(default_factory=list)


async def supervise(config: Config, sockets: Sockets, workers: int, argv: Sequence[str]) -> int:
    """Run ``workers`` workers of ``notary <argv>`` until SIGTERM/SIGINT;
    return the node's exit status."""
    private = tempfile.mkdtemp(prefix="notary-node-")
    ticket_keys = ticket_keys_file(new_ticket_keys())
    try:
        with Notifier() as systemd:
            node = _Node(config, sockets, workers, argv, private, systemd, ticket_keys)
            return await node.run()
    finally:
        close_all(sockets)
        os.close(ticket_keys)
        shutil.rmtree(private, ignore_errors=True)


class _Node:
    def __init__(self, config: Config, sockets: Sockets, workers: int, argv: Sequence[str],
                 private: str, systemd: Notifier, ticket_keys: int) -> None:
        self._config = config
        self._node = config.node
        self._sockets = sockets
        self._argv = list(argv)
        self._private = private
        self._systemd = systemd
        self._ticket_keys = ticket_keys  # the memory file's fd, passed to every worker
        self._workers = [Worker(index) for index in range(workers)]
        self._stopping = False
        self._status = 0
        self._announced_ready = False
        self._notify_path = os.path.join(private, "notify")
        self._metrics_dir = os.path.join(private, "metrics")
        os.mkdir(self._metrics_dir, 0o700)

    async def run(self) -> int:
        receiver = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with receiver:
            receiver.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            await receiver.bind(self._notify_path)
            # Signals are caught before the first worker starts: none can
            # arrive unhandled and leave workers behind.
            with trio.open_signal_receiver(
                signal.SIGTERM, signal.SIGINT, signal.SIGHUP
            ) as signals:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._receive_notifications, receiver)
                    nursery.start_soon(self._watch_workers)
                    for worker in self._workers:
                        nursery.start_soon(self._keep_running, worker)
                    async for signum in signals:
                        if signum == signal.SIGHUP:
                            log.info("SIGHUP: reloading every worker")
                            self._signal_all(signal.SIGHUP)
                            continue
                        log.info("received %s, stopping %d workers",
                                 signal.Signals(signum).name, len(self._workers))
                        break
                    await self.stop()
                    nursery.cancel_scope.cancel()
        return self._status

    # -- stopping ----------------------------------------------------------------

    async def stop(self) -> None:
        self._stopping = True
        self._systemd.notify("STOPPING=1")
        self._signal_all(signal.SIGTERM)
        with trio.move_on_after(self._node.graceful_timeout_s + KILL_MARGIN_S):
            for _, process in self._running():
                await process.wait()
        for worker, process in self._running():
            log.error("worker %d (pid %d) did not stop in time: killed",
                      worker.index, process.pid)
            process.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(KILL_MARGIN_S):
            for worker in self._workers:
                if worker.process is not None:
                    await worker.process.wait()

    def _running(self) -> list[tuple[Worker, trio.Process]]:
        """The workers whose process runs, each with its process."""
        return [
            (w, w.process) for w in self._workers
            if w.process is not None and w.process.returncode is None
        ]

    def _signal_all(self, signum: int) -> None:
        for _, process in self._running():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    # -- workers -----------------------------------------------------------------

    def _environment(self, worker: Worker) -> dict[str, str]:
        env = {
            key: value for key, value in os.environ.items()
            if key not in ("WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
        }
        env.update(worker_environment(self._sockets))
        env[WORKER_INDEX_ENV] = str(worker.index)
        env["NOTIFY_SOCKET"] = self._notify_path
        env["WATCHDOG_USEC"] = str(int(self._node.worker_timeout_s * 1_000_000))
        env["PROMETHEUS_MULTIPROC_DIR"] = self._metrics_dir
        env[TICKET_KEYS_ENV] = str(self._ticket_keys)
        return env

    async def _keep_running(self, worker: Worker) -> None:
        delay = self._node.restart_delay_s
        fds = [s.fileno() for socks in self._sockets.values() for s in socks]
        fds.append(self._ticket_keys)
        while not self._stopping:
            worker.ready = False
            worker.process = process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "notary", *self._argv],
                env=self._environment(worker), pass_fds=fds,
            )
            worker.started_at = worker.last_beat = trio.current_time()
            worker.pids.append(process.pid)
            log.info("worker %d started (pid %d)", worker.index, process.pid)
            status = await process.wait()
            lived_s = trio.current_time() - worker.started_at
            self._worker_exited(worker, process.pid)
            if self._stopping:
                return
            if status == USAGE_ERROR_STATUS:
                log.error("worker %d exited with a usage error: stopping the node",
                          worker.index)
                self._status = USAGE_ERROR_STATUS
                await self._stop_from_inside()
                return
            delay = min(delay * 2, self._node.restart_max_delay_s) if (
                lived_s < QUICK_DEATH_S and worker.restarts
            ) else self._node.restart_delay_s
            worker.restarts += 1
            log.error("worker %d (pid %d) exited with %s after %.1fs: restarting in %gs",
                      worker.index, process.pid, _describe(status), lived_s, delay)
            self._update_status()
            await trio.sleep(delay)

    async def _stop_from_inside(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # _handle_signals then stops the node
        await trio.sleep_forever()

    def _worker_exited(self, worker: Worker, pid: int) -> None:
        worker.ready = False
        worker_exited(pid, Path(self._metrics_dir))

    async def _watch_workers(self) -> None:
        """Kill workers that stopped beating; beat systemd's watchdog."""
        timeout_s = self._node.worker_timeout_s
        systemd_every_s = watchdog_interval_s()
        check_every_s = min(timeout_s / 4, systemd_every_s or timeout_s)
        while True:
            await trio.sleep(check_every_s)
            now = trio.current_time()
            overdue = [(w, p) for w, p in self._running() if now - w.last_beat > timeout_s]
            for worker, process in overdue:
                log.error("worker %d (pid %d) sent no heartbeat for %gs: killed",
                          worker.index, process.pid, timeout_s)
                process.kill()
            # Beats from READY on (systemd's start timeout covers the start).
            healthy = not overdue and not self._stopping and self._announced_ready
            if systemd_every_s is not None and healthy:
                self._systemd.notify("WATCHDOG=1")

    async def _receive_notifications(self, receiver: trio.socket.SocketType) -> None:
        by_pid: dict[int, Worker] = {}
        while True:
            data, ancillary, _, _ = await receiver.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            pid = _sender_pid(ancillary)
            if pid is None:
                continue  # no credentials: not a worker's message
            worker = by_pid.get(pid)
            if worker is None:
                by_pid = {w.process.pid: w for w in self._workers if w.process is not None}
                worker = by_pid.get(pid)
                if worker is None:
                    continue
            states = dict(
                line.partition("=")[::2] for line in data.decode("utf-8", "replace").splitlines()
            )
            if "WATCHDOG" in states or "READY" in states:
                worker.last_beat = trio.current_time()
            if states.get("READY") == "1" and not worker.ready:
                worker.ready = True
                log.info("worker %d (pid %d) ready", worker.index, pid)
                self._update_status()

    def _update_status(self) -> None:
        ready = sum(w.ready for w in self._workers)
        if ready == len(self._workers) and not self._announced_ready:
            self._announced_ready = True
            self._systemd.notify("READY=1", f"MAINPID={os.getpid()}",
                                 f"STATUS={ready} workers serving")
            log.info("node ready: %d workers serving", ready)
            return
        restarts = sum(w.restarts for w in self._workers)
        self._systemd.notify(
            f"STATUS={ready} of {len(self._workers)} workers serving, {restarts} restarts"
        )


def _sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return _UCRED.unpack(data[:_UCRED.size])[0]
    return None


def _describe(status: int) -> str:
    if status < 0:
        try:
            return signal.Signals(-status).name
        except ValueError:
            return f"signal {-status}"
    return f"status {status}"


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_index() -> int | None:
    """This process's worker index, when the supervisor started it."""
    text = os.environ.pop(WORKER_INDEX_ENV, None)
    return int(text) if text is not None and text.isdigit() else None
