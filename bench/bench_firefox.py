"""Page-load time a person feels with the Firefox add-on (issue 33): a page
of 30 resources from 5 hosts on loopback, in headless Firefox ESR, without
the add-on, and with it cold (no cached verdict: every certificate asked
about) and warm (every verdict cached).

    .venv/bin/python bench/bench_firefox.py [--loads N] [--notaries K]

Baseline in the same run: the same page in a Firefox without the add-on
(same profile settings, same lab). The notaries (v2, K of them, majority)
have observed the five sites before the runs, as notaries that keep popular
sites fresh would have: a cold check costs their cache-hit answer, not a
probe. One notary round trip is measured on its own (a v2 query of one
target over a kept-alive HTTPS connection from Python) to read the cold
figures against. Each load starts from about:blank with Firefox's HTTP cache
off (every resource fetched) and its connections kept alive between loads,
in both browsers; the time is the page's Navigation Timing loadEventEnd.
Loopback only (tests/support/firefox.py's lab).
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import trio
import trustme

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from notary.model.targets import Target  # noqa: E402
from tests.support.firefox import (  # noqa: E402
    FIREFOX,
    PIXEL,
    Lab,
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


def runs(lab: Lab, url: str, loads: int, before: object = None) -> list[float]:
    times = []
    for _ in range(loads):
        if callable(before):
            before()
        times.append(load_ms(lab, url))
        if times[-1] > 2000 and lab.browser.addon != "moz-extension://":
            slow = lab.browser.m.execute_script(
                "return performance.getEntriesByType('resource').filter((e) => e.duration > 1000).map((e) => [e.name, e.startTime, e.duration])")
            lab.browser.popup(url)
            print("SLOW", times[-1], slow, lab.browser.m.execute_script("return document.body.innerText"))
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


def row(name: str, times: list[float], base: float) -> str:
    median = statistics.median(times)
    return (f"| {name} | {median:.1f} | {min(times):.1f} | {max(times):.1f} "
            f"| {median - base:+.1f} | {median / base:.3f} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=15, help="page loads per figure")
    parser.add_argument("--notaries", type=int, default=2, help="notaries asked (majority)")
    args = parser.parse_args()
    reason = missing()
    if reason:
        sys.exit(f"bench_firefox: {reason}")
    ca = trustme.CA(key_type=trustme.KeyType.RSA)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        labs: list[Iterator[Lab]] = []

        def start(name: str, with_addon: bool) -> Lab:
            (work / name).mkdir()
            labs.append(open_lab(work / name, with_addon=with_addon, ca=ca))
            return next(labs[-1])

        try:
            plain = await trio.to_thread.run_sync(start, "plain", False)
            addon = await trio.to_thread.run_sync(start, "addon", True)
            sites = build_sites(addon)
            url = sites[0].url("/")
            async with AsyncExitStack() as stack:
                notaries = [await stack.enter_async_context(open_lab_notary(
                    addon, work / f"n{index}", f"127.0.0.{40 + index}", name=f"Notary {index + 1}"))
                    for index in range(args.notaries)]
                for notary in notaries:
                    for site in sites:
                        await notary.notary.running.records.refresh(Target(site.address, site.port))
                rtt = await trio.to_thread.run_sync(
                    one_round_trip_ms, notaries[0].host, notaries[0].notary.port,
                    Target(sites[1].address, sites[1].port))
                bundles = [n.bundle for n in notaries]
                settings = {"checkInternalAddresses": True, "threshold": "majority",
                            "quorum": args.notaries}

                def measure() -> dict[str, list[float]]:
                    addon.browser.configure(settings, bundles)
                    runs(plain, url, 2)  # Firefox's own first-load costs, in both
                    runs(addon, url, 2)
                    result: dict[str, list[float]] = {"without": [], "cold": [], "warm": []}
                    for _ in range(args.loads):  # interleaved: the machine's noise hits all three
                        result["without"] += runs(plain, url, 1)
                        result["cold"] += runs(
                            addon, url, 1, lambda: addon.browser.configure(settings, bundles))
                        result["warm"] += runs(addon, url, 1)
                    return result

                result = await trio.to_thread.run_sync(measure)
            for site in sites:
                site.close()
        finally:
            for lab in reversed(labs):
                await trio.to_thread.run_sync(lab.close)
    base = statistics.median(result["without"])
    version = subprocess.run([FIREFOX, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"bench_firefox: {len(HOSTS) * PER_HOST} resources from {len(HOSTS)} hosts, "
          f"{args.loads} loads per figure, {args.notaries} notaries (majority), {version}")
    print(f"one notary round trip (v2 query, kept-alive HTTPS, median of 20): {rtt:.2f} ms\n")
    print("| page load | median ms | min | max | vs without | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(row("without the add-on", result["without"], base))
    print(row("add-on, cold (no cached verdict)", result["cold"], base))
    print(row("add-on, warm (verdicts cached)", result["warm"], base))


if __name__ == "__main__":
    trio.run(main)
