"""``bench/bench_tls.py``'s verdicts: what a run that did not saturate its
server does to the goal's ratios is said plainly (issue 35), and the options
it offers (``--pure``) parse."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.support.bench import BENCH, bench_on_path


@pytest.fixture(scope="module")
def bench_tls():
    """The script as a module (it imports ``harness`` from ``bench/``)."""
    with bench_on_path():
        yield importlib.import_module("bench_tls")


def run(*, rate: float, server_busy: float, client_busy: float):
    from harness.runs import Run

    return Run(rate=rate, count=int(rate * 10), elapsed_s=10.0, server_cpu_s=10 * server_busy,
               client_cpu_s=10 * client_busy, server_busy=server_busy, client_busy=client_busy)


@pytest.mark.parametrize(
    ("notary", "nginx", "said_in", "not_said"),
    [
        pytest.param(  # wrk was the limit of the baseline
            dict(rate=1_000, server_busy=0.99, client_busy=0.50),
            dict(rate=2_000, server_busy=0.80, client_busy=0.99),
            ["by rate 50.0%", "NOT met", "baseline was NOT measured at saturation",
             "overstate the notary"],
            [],
            id="an unsaturated baseline is said to flatter the notary",
        ),
        pytest.param(
            dict(rate=1_000, server_busy=0.50, client_busy=0.99),
            dict(rate=1_200, server_busy=0.99, client_busy=0.50),
            ["notary was not measured at saturation", "understate it"],
            ["overstate"],
            id="an unsaturated notary is said to be understated",
        ),
        pytest.param(
            dict(rate=1_000, server_busy=0.99, client_busy=0.50),
            dict(rate=1_250, server_busy=0.99, client_busy=0.60),
            ["by rate 80.0%", "-> met"],
            ["saturation"],
            id="saturated runs need no caveat",
        ),
    ],
)
def test_a_verdict_says_which_way_an_unsaturated_run_leans(
    bench_tls, notary, nginx, said_in: list[str], not_said: list[str]
):
    # Runs made here: their class comes from bench/, on the path only now.
    said = bench_tls.verdict("nginx", run(**notary), run(**nginx), 0.70)
    for words in said_in:
        assert words in said
    for words in not_said:
        assert words not in said


def test_pure_is_an_option():
    done = subprocess.run([sys.executable, str(BENCH / "bench_tls.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "--pure" in done.stdout and "NOTARY_NO_EXTENSIONS" in done.stdout


def test_resumed_connections_are_read_from_s_times_progress_lines_only(bench_tls):
    header = "\n\nNow timing with session id reuse.\nstarting\n"  # words with an "r"
    tail = "\n\n3 connections in 0.01s; 300.00 connections/user sec, bytes read 0\n"
    assert bench_tls.resumed_marks(header + "***" + tail) == 0
    assert bench_tls.resumed_marks(header + "*rr" + tail) == 2
    assert bench_tls.resumed_marks(header + tail) == 0
