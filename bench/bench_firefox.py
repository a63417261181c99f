"""Page-load time a person feels with the Firefox add-on (issue 33): a page
of 30 resources from 5 hosts on loopback, in headless Firefox ESR, without
the add-on, and with it cold (no cached verdict: every certificate asked
about) and warm (every verdict cached).

    .venv/bin/python bench/bench_firefox.py [--loads N] [--notaries K]
        [--batch-window-ms MS] [--wait-quiet S]

Baseline in the same run: the same page in a second Firefox without the
add-on (same profile settings, same lab CA). The loads of the three figures
are interleaved (without, cold, warm, without, ...) so that the machine's
noise falls on all three alike; each starts from about:blank with Firefox's
HTTP cache off (every resource fetched) and its connections kept alive
between loads; the time is the page's Navigation Timing loadEventEnd. Before
each cold load the add-on's settings are imported again (which empties its
verdict cache), then the background page is given 0.5 s to settle, untimed.
Beside the time, each load's CPU time of that Firefox's whole process tree.

The notaries (v2, K of them, majority) have observed the five sites before
the runs, as notaries that keep popular sites fresh would have: a cold
check costs their cache-hit answer, not a probe. One notary round trip (a v2
query of one target on a kept-alive connection) is measured as the add-on
makes it (a fetch from its options page) and from Python, to read the cold
figures against. Loopback only (tests/support/firefox.py's lab).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio
import trustme

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.machine import CLOCK_TICK, all_proc_stats, wait_quiet  # noqa: E402
from harness.report import header  # noqa: E402

from notary.model.targets import Target  # noqa: E402
from tests.support.firefox import (  # noqa: E402
    PIXEL,
    Lab,
    LabNotary,
    Site,
    html_page,
    missing,
    open_lab,
    open_lab_notary,
)

HOSTS = [f"127.0.0.{n}" for n in range(31, 36)]
PER_HOST = 6


def build_sites(lab: Lab) -> list[Site]:
    sites = [Site(address, lab.leaf(address), pages={f"/r{i}.png": PIXEL for i in range(PER_HOST)})
             for address in HOSTS]
    images = "".join(f'<img src="{site.url(f"/r{i}.png")}" width="8" height="8">'
                     for site in sites for i in range(PER_HOST))
    sites[0].pages["/"] = html_page("30 resources from 5 hosts", images)
    return sites


def load_ms(lab: Lab, url: str) -> float:
    """One page load from about:blank: Navigation Timing's loadEventEnd."""
    m = lab.browser.m
    m.navigate("about:blank")
    m.navigate(url)
    lab.browser.wait_for("return performance.getEntriesByType('navigation')[0].loadEventEnd > 0")
    count = m.execute_script("return [...document.images].filter((i) => i.naturalWidth === 1).length")
    assert count == len(HOSTS) * PER_HOST, f"{count} images loaded"
    return float(m.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd"))


def reconfigure(lab: Lab, settings: dict[str, object], bundles: list[str]) -> None:
    """The add-on's settings and notaries imported again, which empties its
    verdict cache; then a pause for the background page to finish
    reloading (its storage listener loads the settings once more)."""
    lab.browser.configure(settings, bundles)
    lab.browser.m.navigate("about:blank")
    time.sleep(0.5)


def firefox_cpu_s(lab: Lab) -> float:
    """CPU seconds (user and system) of this lab's Firefox and every process
    it started (content, extension, socket, GPU...) so far."""
    root = int(lab.browser.m.session_capabilities["moz:processID"])
    stats = all_proc_stats()
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += sum(int(x) for x in stats[pid][11:15])
            todo += children.get(pid, [])
    return total / CLOCK_TICK


def runs(lab: Lab, url: str, loads: int, before: Callable[[], object] | None = None,
         cpu: list[float] | None = None) -> list[float]:
    """``loads`` page loads of ``url``; ``before`` runs before each, untimed;
    each load's Firefox CPU milliseconds are appended to ``cpu``."""
    times = []
    for _ in range(loads):
        if before is not None:
            before()
        started = firefox_cpu_s(lab)
        times.append(load_ms(lab, url))
        if cpu is not None:
            cpu.append((firefox_cpu_s(lab) - started) * 1000)
    return times


def one_round_trip_ms(host: str, port: int, target: Target, repeats: int = 20) -> float:
    """Median time of one v2 query (one target) on a kept-alive connection."""
    connection = http.client.HTTPSConnection(host, port, timeout=10,
                                             context=ssl._create_unverified_context())
    body = json.dumps({"targets": [{"host": target.host, "port": target.port}], "nonce": "bench"})
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        connection.request("POST", "/v2/query", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200
        times.append((time.perf_counter() - start) * 1000)
    connection.close()
    return statistics.median(times[1:])


def firefox_round_trip_ms(lab: Lab, host: str, port: int, target: Target, repeats: int = 20) -> float:
    """Median time of one v2 query (one target) as the add-on makes it: a
    fetch from one of its pages through Firefox's network stack (and the
    add-on's own pin check of the answer), the connection kept alive."""
    lab.browser.m.navigate(f"{lab.browser.addon}/src/pages/options.html")
    body = json.dumps({"targets": [{"host": target.host, "port": target.port}], "nonce": "bench"})
    times = lab.browser.m.execute_async_script("""
        const [url, body, repeats, resolve] = arguments;
        (async () => {
          const times = [];
          for (let i = 0; i <= repeats; i += 1) {
            const start = performance.now();
            const response = await fetch(url, { method: "POST", body, cache: "no-store",
              headers: { "Content-Type": "application/json" } });
            await response.text();
            if (response.status !== 200) throw new Error(`HTTP ${response.status}`);
            times.push(performance.now() - start);
          }
          return times.slice(1);
        })().then(resolve, (error) => resolve(String(error)));""",
        [f"https://{host}:{port}/v2/query", body, repeats])
    assert isinstance(times, list), times
    return statistics.median(float(t) for t in times)


def row(name: str, times: list[float], base: float, cpu: list[float], cpu_base: float) -> str:
    median = statistics.median(times)
    return (f"| {name} | {median:.1f} | {min(times):.1f} | {max(times):.1f} "
            f"| {median - base:+.1f} | {median / base:.3f} "
            f"| {statistics.mean(cpu):.0f} | {statistics.mean(cpu) / cpu_base:.2f} |")


@dataclass
class Result:
    """The figures of one run (milliseconds)."""

    loads: dict[str, list[float]]
    cpu: dict[str, list[float]]  # Firefox CPU milliseconds per load
    round_trip_ms: float  # from Python
    firefox_round_trip_ms: float  # as the add-on makes it
    questions: int  # v2 queries the notaries answered during the cold loads
    version: str


def measure(args: argparse.Namespace, work: Path) -> Result:
    """Two Firefoxes (without and with the add-on) trusting one lab CA,
    five sites, ``args.notaries`` notaries; the loads interleaved so that
    the machine's noise falls on the three figures alike."""
    ca = trustme.CA(key_type=trustme.KeyType.RSA)
    with ExitStack() as stack:
        plain = stack.enter_context(contextmanager(open_lab)(work / "plain", with_addon=False, ca=ca))
        addon = stack.enter_context(contextmanager(open_lab)(work / "addon", ca=ca))
        sites = build_sites(addon)
        for site in sites:
            stack.callback(site.close)
        url = sites[0].url("/")
        notaries = stack.enter_context(NotariesInTrio(addon, work, args.notaries, sites))
        bundles = [n.bundle for n in notaries.labs]
        settings = {"checkInternalAddresses": True, "threshold": "majority", "quorum": args.notaries}
        if args.batch_window_ms is not None:
            settings["batchWindowMs"] = args.batch_window_ms
        addon.browser.configure(settings, bundles)
        first = notaries.labs[0]
        in_firefox = firefox_round_trip_ms(addon, first.host, first.notary.port,
                                           Target(sites[1].address, sites[1].port))
        runs(plain, url, 2)  # Firefox's own first-load costs, in both
        runs(addon, url, 2)
        loads: dict[str, list[float]] = {"without": [], "cold": [], "warm": []}
        cpu: dict[str, list[float]] = {"without": [], "cold": [], "warm": []}
        questions = 0
        for _ in range(args.loads):
            loads["without"] += runs(plain, url, 1, cpu=cpu["without"])
            before = notaries.questions()
            loads["cold"] += runs(addon, url, 1, lambda: reconfigure(addon, settings, bundles),
                                  cpu=cpu["cold"])
            questions += notaries.questions() - before
            loads["warm"] += runs(addon, url, 1, cpu=cpu["warm"])
        version = str(addon.browser.m.session_capabilities.get("browserVersion", "?"))
        return Result(loads, cpu, notaries.round_trip_ms, in_firefox, questions, version)


class NotariesInTrio:
    """The lab's notaries, served by Trio in a thread of their own while
    the Marionette calls run in this one; they have observed every site
    (as notaries that keep popular sites fresh would have: a cold check
    costs their cache-hit answer, not a probe)."""

    def __init__(self, lab: Lab, work: Path, count: int, sites: list[Site]) -> None:
        self.lab, self.work, self.count, self.sites = lab, work, count, sites
        self.labs: list[LabNotary] = []
        self.round_trip_ms = 0.0
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NotariesInTrio:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)

    def questions(self) -> int:
        return sum(sum(n.notary.running.service.answered["v2"].values()) for n in self.labs)

    def _run(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as error:  # handed to __enter__
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        async with AsyncExitStack() as stack:
            for index in range(self.count):
                self.labs.append(await stack.enter_async_context(open_lab_notary(
                    self.lab, self.work / f"n{index}", f"127.0.0.{40 + index}", name=f"Notary {index + 1}")))
            for notary in self.labs:
                for site in self.sites:
                    await notary.notary.running.records.refresh(Target(site.address, site.port))
            first = self.labs[0]
            self.round_trip_ms = await trio.to_thread.run_sync(
                one_round_trip_ms, first.host, first.notary.port,
                Target(self.sites[1].address, self.sites[1].port))
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()


def report(args: argparse.Namespace, result: Result) -> str:
    loads = result.loads
    base = statistics.median(loads["without"])
    cpu_base = statistics.mean(result.cpu["without"])
    cold_extra = statistics.median(loads["cold"]) - base
    trip = result.firefox_round_trip_ms
    warm_ratio = statistics.median(loads["warm"]) / base
    asking = statistics.median(loads["cold"]) - statistics.median(loads["warm"])
    hosts = len(HOSTS)
    lines = [
        f"bench_firefox: {hosts * PER_HOST} resources from {hosts} hosts, {args.loads} loads per figure,"
        f" {args.notaries} notaries (majority), Firefox {result.version}"
        + ("" if args.batch_window_ms is None else f", batch window {args.batch_window_ms} ms"),
        f"one notary round trip (v2 query of one target, kept-alive HTTPS, median of 20):"
        f" {result.firefox_round_trip_ms:.2f} ms from the add-on's page in Firefox,"
        f" {result.round_trip_ms:.2f} ms from Python",
        f"notary questions per cold load: {result.questions / args.loads:.1f}"
        f" (each of the {args.notaries} notaries asked once per batch)",
        "",
        "| page load | median ms | min | max | vs without | ratio | Firefox CPU ms (mean) | CPU ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        row("without the add-on", loads["without"], base, result.cpu["without"], cpu_base),
        row("add-on, cold (no cached verdict)", loads["cold"], base, result.cpu["cold"], cpu_base),
        row("add-on, warm (verdicts cached)", loads["warm"], base, result.cpu["warm"], cpu_base),
        "",
        f"warm: {warm_ratio:.3f} x without (goal: within 1.05): {'met' if warm_ratio <= 1.05 else 'NOT met'}",
        f"cold: {cold_extra:+.1f} ms over without = {cold_extra / trip:.1f} round trips as Firefox makes them"
        f" (goal: at most one per new host, {hosts}): {'met' if cold_extra <= hosts * trip else 'NOT met'};"
        f" over warm (the asking alone): {asking:+.1f} ms = {asking / trip:.1f} round trips:"
        f" {'met' if asking <= hosts * trip else 'NOT met'}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=30, help="page loads per figure (default 30)")
    parser.add_argument("--notaries", type=int, default=2, help="notaries asked, majority (default 2)")
    parser.add_argument("--batch-window-ms", type=int, metavar="MS",
                        help="the add-on's batch window for sub-resources (default: its own, 15)")
    parser.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                        help="first wait up to SECONDS for the machine's cores to be idle")
    args = parser.parse_args()
    if args.loads < 1 or not 1 <= args.notaries <= 9:
        parser.error("--loads must be at least 1 and --notaries between 1 and 9")
    reason = missing()
    if reason:
        sys.exit(f"bench_firefox: {reason}")
    header("bench_firefox: page loads with the Firefox add-on",
           "python bench/bench_firefox.py " + " ".join(sys.argv[1:]))
    if args.wait_quiet:
        wait_quiet(list(range(os.cpu_count() or 1)), args.wait_quiet)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as directory:
        result = measure(args, Path(directory))
    print(report(args, result))
    print(f"1-minute load average: {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
          f" ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
