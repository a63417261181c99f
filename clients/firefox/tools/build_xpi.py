"""Build the add-on's .xpi (a zip of manifest.json and src/), the same bytes
for the same sources (fixed times, sorted names): `make firefox-addon`,
and the Firefox tests (tests/support/firefox.py).

    python3 clients/firefox/tools/build_xpi.py [OUT.xpi]   (default build/notary-check.xpi)
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ADDON = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ADDON.parents[1] / "build" / "notary-check.xpi"
#: What the add-on is made of; tests, tools and npm's files stay out.
CONTENTS = ("manifest.json", "src")
_EPOCH = (1980, 1, 1, 0, 0, 0)


def addon_files() -> list[Path]:
    files: list[Path] = []
    for name in CONTENTS:
        path = ADDON / name
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return files


def build_xpi(out: Path = DEFAULT_OUT) -> Path:
    """Write the .xpi to ``out`` (its folder made if needed) and return it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as xpi:
        for path in addon_files():
            info = zipfile.ZipInfo(path.relative_to(ADDON).as_posix(), _EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            xpi.writestr(info, path.read_bytes())
    partial.replace(out)
    return out


if __name__ == "__main__":
    print(build_xpi(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT))
