"""Every relative link in README.md and docs/ leads somewhere: a file that
exists and, with a ``#fragment``, a heading of that file (GitHub's anchors).
Links to other sites are not followed (tests never leave this machine)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: ``[text](target)`` and ``![alt](target)``, not inside code spans.
LINK = re.compile(r"(?<!`)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted(p for p in ROOT.glob("*/README.md") if not p.parent.name.startswith("."))]


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup dropped, spaces to
    hyphens, punctuation but hyphens and underscores removed."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of ``path``'s headings (a repeated heading's later ones
    get ``-1``, ``-2``... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(FENCE.sub("", path.read_text())):
        anchor = anchor_of(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def links(path: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text()))
    return [
        target for target in LINK.findall(text)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def broken(path: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``path``) leads nowhere; None if it leads somewhere."""
    file_part, _, fragment = target.partition("#")
    destination = (path.parent / file_part).resolve() if file_part else path
    if not destination.exists():
        return f"{target}: no file {destination}"
    if fragment and destination.suffix == ".md" and fragment not in anchors(destination):
        return f"{target}: no heading #{fragment} in {destination.name}"
    return None


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(path: Path) -> None:
    problems = [problem for target in links(path) if (problem := broken(path, target))]
    assert problems == []


def test_the_checks_catch_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# Top\n## The key document (GET /v2/key)\n## Top\n"
        "[ok](#the-key-document-get-v2key) [again](#top-1) [file](b.md#part)\n"
        "[gone](c.md) [no such](#nowhere) `[code](x.md)` [web](https://example.test/)\n"
    )
    (tmp_path / "b.md").write_text("# Part\n")
    page = tmp_path / "a.md"
    assert links(page) == [
        "#the-key-document-get-v2key", "#top-1", "b.md#part", "c.md", "#nowhere",
    ]
    problems = [target for target in links(page) if broken(page, target)]
    assert problems == ["c.md", "#nowhere"]
