"""The Firefox add-on without a browser: its pure logic in Node's test
runner against answers the Python notary signs now (a fresh
clients/firefox/test/make_fixtures.py run, not only the committed file),
``web-ext lint``, and the .xpi that ``make firefox-addon`` builds.

Like the Firefox tests, the Node and lint tests run in make test's compiled
pass only, and skip with a reason where Node or web-ext is missing
(a failure under CI, whose ``.ci/run`` has both: Node and npm from
``.ci/install-tools tests``, web-ext from ``make test``'s ``npm ci``). Node
18 (Debian 12's) is enough: web-ext is pinned at the last release that runs
on it, and test/webcrypto.mjs gives Node 18 the global ``crypto``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.firefox import in_ci

ROOT = Path(__file__).resolve().parents[1]
ADDON = ROOT / "clients" / "firefox"
NODE = shutil.which("node")
sys.path.insert(0, str(ADDON / "tools"))
from build_xpi import build_xpi  # noqa: E402


def need(tool: str | None, reason: str) -> None:
    if os.environ.get("NOTARY_NO_EXTENSIONS"):
        pytest.skip("the add-on's tests run once, in make test's compiled pass")
    if tool is None:
        if in_ci():
            pytest.fail(f"{reason}; CI must run the add-on's tests")
        pytest.skip(reason)


def test_node_unit_tests_against_answers_the_notary_signs_now(tmp_path: Path) -> None:
    need(NODE, "Node is not installed: the add-on's unit tests need `node --test`")
    fixtures = tmp_path / "answers.json"
    subprocess.run([sys.executable, str(ADDON / "test" / "make_fixtures.py"), str(fixtures)],
                   check=True, capture_output=True, timeout=120)
    tests = sorted(str(p.relative_to(ADDON)) for p in (ADDON / "test").glob("*.test.mjs"))
    assert tests
    run = subprocess.run([NODE, "--test", *tests], cwd=ADDON, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "NOTARY_FIXTURES": str(fixtures)})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = re.search(r"^# pass (\d+)$", run.stdout, re.M)
    assert passed and int(passed.group(1)) >= 30, run.stdout[-2000:]
    assert re.search(r"^# fail 0$", run.stdout, re.M)


def test_web_ext_lint_passes() -> None:
    web_ext = ADDON / "node_modules" / ".bin" / "web-ext"
    need(NODE and (str(web_ext) if web_ext.exists() else None),
         "web-ext is not installed: make firefox-lint (npm ci in clients/firefox) installs it")
    run = subprocess.run(["npm", "run", "--silent", "lint"], cwd=ADDON, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"errors\s+0", run.stdout) and re.search(r"warnings\s+0", run.stdout)


def test_xpi_holds_the_addon_and_nothing_else(tmp_path: Path) -> None:
    xpi = build_xpi(tmp_path / "a.xpi")
    assert build_xpi(tmp_path / "b.xpi").read_bytes() == xpi.read_bytes()  # reproducible
    with zipfile.ZipFile(xpi) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
    assert not any(n.startswith(("test/", "tools/", "node_modules/")) or "package" in n for n in names)
    referenced = [manifest["background"]["page"], manifest["browser_action"]["default_popup"],
                  manifest["options_ui"]["page"], *manifest["web_accessible_resources"]]
    for page in referenced:
        assert page in names, page
    # Every script and stylesheet a page names, and every module a script imports, is there.
    inside = {os.path.normpath(n) for n in names}
    for name in [n for n in names if n.endswith((".html", ".js"))]:
        text = (ADDON / name).read_text(encoding="utf-8")
        for src, module in re.findall(r'(?:src|href)="([^"#:]+)"|from "(\.[^"]+)"', text):
            assert os.path.normpath(Path(name).parent / (src or module)) in inside, (name, src or module)
