"""``bench/bench_connection.py`` runs end to end in its quick mode: each of
its four measurements gives the notary's and plain Trio's figures and their
ratio (what they are worth is for ``bench/RESULTS.md``, not for a test)."""

from __future__ import annotations

import re

import pytest

from tests.support.bench import bench_on_path

ROW = re.compile(r"^\| (.+), per (connection|request) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", re.M)


def test_the_quick_run_measures_all_four(capsys: pytest.CaptureFixture[str]) -> None:
    with bench_on_path():
        import bench_connection

        assert bench_connection.main(["--quick", "--cpu", "-1"]) == 0
    rows = ROW.findall(capsys.readouterr().out)
    assert [row[0].split(" (")[0] for row in rows] == [
        "a connection", "a keep-alive request", "accepting a queued connection",
        "accepting a queued connection on Trio's stream"]
    for _, _, ours, plain, ratio in rows:
        assert float(ours) > 0 and float(plain) > 0
        assert float(ratio) == pytest.approx(float(ours) / float(plain), abs=0.011)
