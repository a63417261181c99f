"""wrk, the HTTP load generator: its Lua scripts (the query, or raw bytes,
plus a hook reporting latency percentiles) and one measured run of it
(``run_wrk``: a ``Run``; wrk stopped on every path; errors fatal unless
allowed)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from .loopback import CONTENT_TYPE
from .processes import Processes
from .project import BenchError
from .runs import Meter, Run

#: Appended to every wrk script: p50, p99, p99.9 and max in us (wrk's table stops at p99).
LATENCY_LUA = """
done = function(summary, latency, requests)
  io.write(string.format("latency-us p50 %d p99 %d p999 %d max %d\\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


def wrk_script(directory: Path, body: str, *, name: str = "post",
               content_type: str = CONTENT_TYPE) -> Path:
    """The cache-hit query for wrk: ``POST`` ``body``, keep-alive, plus ``LATENCY_LUA``."""
    path = directory / f"{name}.lua"
    if "]]" in body:
        raise BenchError("body cannot be a Lua long string")
    path.write_text(f'-- cache-hit query, keep-alive\nwrk.method = "POST"\nwrk.body = [[{body}]]\n'
                    f'wrk.headers["Content-Type"] = "{content_type}"\n' + LATENCY_LUA)
    return path


def wrk_raw_script(directory: Path, request: bytes, *, name: str) -> Path:
    """A wrk script sending exactly ``request`` (e.g. an HTTP/1.0 request:
    wrk's own requests are always HTTP/1.1), plus ``LATENCY_LUA``."""
    path = directory / f"{name}.lua"
    # A quoted Lua string with escapes (a long string would turn \r\n into \n).
    quoted = "".join(chr(byte) if 32 <= byte < 127 and byte not in b'"\\' else f"\\{byte:03d}"
                     for byte in request)
    path.write_text(f'local raw = "{quoted}"\nrequest = function() return raw end\n'
                    + LATENCY_LUA)
    return path


def run_wrk(wrk: str, processes: Processes, url: str, script: Path, *, threads: int,
            connections: int, seconds: int, cpu: int | None,
            server_cpu_seconds: Callable[[], float] | None = None, allow_errors: bool = False,
            extra: Sequence[str] = (), cpus: Sequence[int] = ()) -> Run:
    """One run of ``wrk --latency`` pinned to ``cpu``, measured by a ``Meter``
    (``server_cpu_seconds``, ``cpus``). Socket errors or non-2xx answers
    raise, unless ``allow_errors`` (then they are counted)."""
    argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", *extra,
            "-s", str(script), url]
    meter = Meter(server_cpu_seconds, cpus)
    process = processes.start("wrk", argv, cpu=cpu)
    try:
        out, err = process.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        raise BenchError(f"wrk did not finish within {seconds + 30} s ({url})") from None
    finally:
        processes.stop(process)
    output = out.decode(errors="replace") + err.decode(errors="replace")
    if process.returncode != 0:
        raise BenchError(f"wrk exited with {process.returncode}:\n{output}")

    def found(pattern: str) -> str | None:
        match = re.search(pattern, output, re.MULTILINE)
        return match.group(1) if match else None

    counts = re.findall(r"(connect|read|write|timeout) (\d+)", found(r"Socket errors: (.*)") or "")
    counts.append(("non-2xx", found(r"Non-2xx or 3xx responses: (\d+)") or "0"))
    errors = {name: int(value) for name, value in counts if int(value)}
    rate, total = found(r"Requests/sec:\s+([\d.]+)"), found(r"(\d+) requests in")
    if rate is None or total is None or not int(total):
        raise BenchError(f"wrk against {url}: no requests counted\n{output}")
    if errors and not allow_errors:
        raise BenchError(f"wrk against {url}: errors {errors}\n{output}")
    percentiles = re.search(r"latency-us p50 (\d+) p99 (\d+) p999 (\d+) max (\d+)", output)
    latency_us = dict(zip(("p50", "p99", "p99.9", "max"), map(int, percentiles.groups()),
                          strict=True)) if percentiles else {}
    return meter.run(float(rate), int(total), latency_avg=found(r"Latency\s+(\S+)") or "?",
                     latency_p99=found(r"^\s+99%\s+(\S+)") or "?", latency_us=latency_us,
                     errors=errors, output=output)
