"""``bench/bench_tls.py``'s verdicts: judged on the median of the rounds'
paired ratios, what a run that did not saturate its server does to them said
plainly (issue 35); the rounds' pairing itself (``harness.runs``: reversed
every other round, flagged pairs left out); the options it offers
(``--pure``) parse."""

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
    said = bench_tls.verdict("nginx", [run(**notary)], [run(**nginx)], 0.70)
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


SATURATED = dict(server_busy=0.99, client_busy=0.50)
WRK_BOUND = dict(server_busy=0.85, client_busy=0.99)


def test_the_goal_is_judged_on_the_median_pair_not_the_best_runs(bench_tls):
    # The machine changed speed between rounds: the notary's best run (round 2,
    # fast) and nginx's (round 1, fast again for it) were not measured alike.
    notary = [run(rate=r, **SATURATED) for r in (1_000, 2_000, 1_100)]
    nginx = [run(rate=r, **SATURATED) for r in (2_600, 3_000, 2_000)]
    said = bench_tls.verdict("nginx", notary, nginx, 0.60)
    assert "by rate 55.0% (median of 3 paired round(s): 38.5% / 66.7% / 55.0%)" in said
    assert "-> NOT met" in said
    assert "best run against best run: 66.7% by rate (2,000 / 3,000)" in said


def test_pairs_with_a_flagged_run_are_left_out_unless_every_pair_has_one(bench_tls):
    from harness.runs import paired

    notary = [run(rate=r, **SATURATED) for r in (1_000, 1_000, 1_000)]
    nginx = [run(rate=2_000, **SATURATED), run(rate=1_000, **WRK_BOUND),
             run(rate=2_500, **SATURATED)]
    pairs = paired(notary, nginx)
    assert pairs.rates == (0.5, 0.4) and pairs.left_out == 1
    assert not pairs.theirs_flagged and "1 flagged pair(s) left out" in pairs.rounds()
    every = paired(notary[1:2], nginx[1:2])
    assert every.rates == (1.0,) and every.left_out == 0 and every.theirs_flagged
    assert "baseline was NOT measured at saturation" in bench_tls.verdict(
        "nginx", notary[1:2], nginx[1:2], 0.5)
    with pytest.raises(ValueError):
        paired(notary, nginx[:2])
    with pytest.raises(ValueError):
        paired([], [])


def test_every_other_round_runs_the_rows_in_reverse(bench_tls, capsys):
    from argparse import Namespace

    from harness.runs import run_rounds

    order = []

    def measure(name):
        order.append(name)
        return run(rate=1_000, **SATURATED)

    runs = run_rounds(Namespace(rounds=3, wait_quiet=0), ["notary", "nginx", "minimal"],
                      measure, lambda name, result: name, key=lambda name: name)
    assert order == ["notary", "nginx", "minimal", "minimal", "nginx", "notary",
                     "notary", "nginx", "minimal"]
    assert [len(results) for results in runs.values()] == [3, 3, 3]
    assert "round 2 minimal" in capsys.readouterr().out
