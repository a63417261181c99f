"""The children of a benchmark and the run that owns them: ``Processes``
(each child the leader of its own process group, pinned to cores, killed with
its group on every exit path, even if the benchmark dies) and
``run_benchmark`` (one benchmark at a time on the machine, by a lock; the
temporary directory; ``BenchError`` as one line and exit 1)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .project import BenchError, project_env

LOCK_PATH = Path("/tmp/notary-bench.lock")
STOP_TIMEOUT_S = 10.0
PR_SET_PDEATHSIG = 1


class Processes:
    """Every subprocess started here, each the leader of its own process
    group; ``stop`` and ``stop_all`` end the whole group."""

    def __init__(self) -> None:
        self._running: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: Sequence[str], *, cpu: int | Iterable[int] | None,
              log: Path | None = None, cwd: Path | None = None,
              env: dict[str, str | None] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` pinned to ``cpu`` (a core, a set of cores, None: any),
        output to ``log`` (stdout and stderr) or to pipes, with ``env``'s
        variables set (None: removed); SIGKILLed if this process dies."""
        cpus = {cpu} if isinstance(cpu, int) else set(cpu) if cpu is not None else None

        def prepare() -> None:  # in the child, between fork and exec
            if cpus:
                os.sched_setaffinity(0, cpus)
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

        environment = {k: v for k, v in {**project_env(), **(env or {})}.items() if v is not None}
        with log.open("wb") if log else contextlib.nullcontext(subprocess.PIPE) as out:
            process = subprocess.Popen(
                argv, cwd=cwd, env=environment, stdout=out,
                stderr=subprocess.STDOUT if log else subprocess.PIPE,
                stdin=subprocess.DEVNULL, preexec_fn=prepare, start_new_session=True)
        self._running.append(process)
        return process

    def stop(self, process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to ``process``, SIGKILL to its group after ``timeout_s``,
        then a SIGKILL sweep of whatever the group still holds."""
        _terminate(process)
        _end_group(process, time.monotonic() + timeout_s)
        self._running = [p for p in self._running if p is not process]

    def stop_all(self) -> None:
        for process in reversed(self._running):
            _terminate(process)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in reversed(self._running):
            with contextlib.suppress(Exception):
                _end_group(process, deadline)
        self._running.clear()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group's leader only (a supervisor then stops its own
    workers). ``os.kill``, not ``Popen.terminate``, which would reap an exited
    leader and so free its pid before ``_end_group`` kills the group."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)


def _end_group(process: subprocess.Popen[bytes], deadline: float) -> None:
    """Wait (until ``deadline``) for ``process`` to exit without reaping it,
    SIGKILL its group while the zombie leader holds the group id (no other
    process can have it; a leader reaped elsewhere gets the SIGKILL too: the
    id is not handed out while a member lives), then reap it."""
    if process.returncode is None:
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, process.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    break
            except ChildProcessError:
                break  # reaped elsewhere
            time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # own session: pgid == pid
    with contextlib.suppress(ChildProcessError):
        process.wait()


def run_benchmark(name: str, args: argparse.Namespace,
                  run: Callable[[argparse.Namespace, Processes, Path], int]) -> int:
    """Run ``run`` under the machine lock (waiting while another benchmark
    holds it), with a temporary directory and a ``Processes``, all cleaned up
    on every exit path; a ``BenchError`` is one message and exit 1."""
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    try:
        with open(os.open(LOCK_PATH, os.O_RDONLY | os.O_CREAT, 0o666)) as lock:  # close: unlock
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"waiting for another benchmark to finish (lock {LOCK_PATH})",
                      file=sys.stderr, flush=True)
                started = time.monotonic()
                fcntl.flock(lock, fcntl.LOCK_EX)
                print(f"lock taken after {time.monotonic() - started:.0f} s", file=sys.stderr,
                      flush=True)
            processes = Processes()
            directory = Path(tempfile.mkdtemp(prefix=f"notary-{name.replace('_', '-')}-"))
            try:
                return run(args, processes, directory)
            except BenchError as exc:
                print(f"{name}: FAILED: {exc}", file=sys.stderr)
                return 1
            finally:
                processes.stop_all()
                if getattr(args, "keep", False):
                    print(f"kept {directory}", file=sys.stderr)
                else:
                    shutil.rmtree(directory, ignore_errors=True)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"
