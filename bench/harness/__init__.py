"""The harness of every benchmark in ``bench/``, one module per concern (what
each piece does and why: ``bench/README.md``):

- ``project``: the checkout measured (``ROOT``, put on ``sys.path`` on
  import), the environment of children, ``BenchError``;
- ``processes``: the children of a run (``Processes``) and the run itself
  (``run_benchmark``: one at a time on the machine, cleaned up on every path);
- ``tools``: wrk, nginx, openssl, socat found or installed;
- ``machine``: what ``/proc`` says (cores, other load, a process's CPU and memory);
- ``loopback``: the set-up checks' own client (loopback only);
- ``servers``: servers started for a run (any, nginx, PostgreSQL, the notary);
- ``runs``: a measured run (``Run``, ``Meter``, ``best``), a load
  benchmark's start and rounds, two rows compared round by round
  (``paired``), a micro-benchmark's best of N;
- ``wrk``: wrk's scripts and one measured wrk run;
- ``report``: the head of a report, its tables and figures;
- ``options``: the command-line options the benchmarks share.

The scripts import from those modules. Importing the package (as any of
them does) puts the project root on ``sys.path``; every name the harness
offered as one module before is importable from the package too.
"""

from __future__ import annotations

from .loopback import (
    CONTENT_TYPE,
    LOOPBACK,
    body_of,
    client_tls_context,
    connect,
    exchange,
    free_ports,
    get_metrics,
    header_of,
    post_request,
    read_response,
    status_of,
)
from .machine import (
    CLOCK_TICK,
    all_proc_stats,
    busy_cpus,
    choose_cpus,
    cores_and_load,
    cpu_seconds,
    cpu_times,
    describe_busy,
    listen_queue,
    machine_busy_seconds,
    proc_stat,
    proc_status,
    wait_quiet,
)
from .options import argument_parser, finish_load_args, load_parser, repetitions
from .processes import LOCK_PATH, PR_SET_PDEATHSIG, STOP_TIMEOUT_S, Processes, run_benchmark, tail
from .project import ROOT, BenchError, project_env
from .report import (
    format_rate,
    format_ratio,
    format_us,
    header,
    notary_version,
    print_preamble,
    print_table,
    short_path,
)
from .runs import (
    MAX_WRK_CORE,
    MIN_SERVER_CORE,
    Meter,
    Run,
    best,
    best_seconds,
    rate,
    run_rounds,
    start_load,
)
from .servers import (
    MINIMAL_SERVER,
    PRIME_TIMEOUT_S,
    PROFILE_WRAPPER,
    READY_TIMEOUT_S,
    NotarySetup,
    RunningNotary,
    make_notary,
    new_notary,
    nginx_answer_block,
    nginx_stream_module,
    notary_argv,
    prime_notary,
    start_nginx,
    start_notary,
    start_postgres,
    start_server,
)
from .tools import INSTALL_TOOLS, ensure_tool, ensure_wrk, wrk_version
from .wrk import LATENCY_LUA, run_wrk, wrk_raw_script, wrk_script

__all__ = [
    "CLOCK_TICK",
    "CONTENT_TYPE",
    "INSTALL_TOOLS",
    "LATENCY_LUA",
    "LOCK_PATH",
    "LOOPBACK",
    "MAX_WRK_CORE",
    "MINIMAL_SERVER",
    "MIN_SERVER_CORE",
    "PRIME_TIMEOUT_S",
    "PROFILE_WRAPPER",
    "PR_SET_PDEATHSIG",
    "READY_TIMEOUT_S",
    "ROOT",
    "STOP_TIMEOUT_S",
    "BenchError",
    "Meter",
    "NotarySetup",
    "Processes",
    "Run",
    "RunningNotary",
    "all_proc_stats",
    "argument_parser",
    "best",
    "best_seconds",
    "body_of",
    "busy_cpus",
    "choose_cpus",
    "client_tls_context",
    "connect",
    "cores_and_load",
    "cpu_seconds",
    "cpu_times",
    "describe_busy",
    "ensure_tool",
    "ensure_wrk",
    "exchange",
    "finish_load_args",
    "format_rate",
    "format_ratio",
    "format_us",
    "free_ports",
    "get_metrics",
    "header",
    "header_of",
    "listen_queue",
    "load_parser",
    "machine_busy_seconds",
    "make_notary",
    "new_notary",
    "nginx_answer_block",
    "nginx_stream_module",
    "notary_argv",
    "notary_version",
    "post_request",
    "prime_notary",
    "print_preamble",
    "print_table",
    "proc_stat",
    "proc_status",
    "project_env",
    "rate",
    "read_response",
    "repetitions",
    "run_benchmark",
    "run_rounds",
    "run_wrk",
    "short_path",
    "start_load",
    "start_nginx",
    "start_notary",
    "start_postgres",
    "start_server",
    "status_of",
    "tail",
    "wait_quiet",
    "wrk_raw_script",
    "wrk_script",
    "wrk_version",
]
