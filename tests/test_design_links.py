"""The rationale stays inside the repo: every link into ``docs/`` resolves, nothing points outside.

Code comments, docstrings, tests and docs give their reasons as links into ``docs/`` (most into
``docs/design.md`` and ``docs/reliability.md``). This test walks ``src``, ``tests``, ``docs``,
``examples``, ``scripts`` and ``README.md`` and fails on

- a reference to a document or issue tracker a person with a clone cannot open (the upstream
  specification by section, its reliability and style files, numbered issues), and
- a link to ``docs/<page>.md#<anchor>`` (or ``<page>.md#<anchor>`` inside ``docs/``) whose page
  is missing or has no heading with that anchor, by GitHub's heading-slug rules.

``CHANGELOG.md`` is history and may name what it likes. The checker itself runs on a small fake
tree below, so it is seen to fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "tests", "docs", "examples", "scripts", "README.md")
SUFFIXES = frozenset({".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ""})

# Built in pieces so this file does not match itself.
_OUTSIDE = re.compile(
    "|".join(
        (
            r"\b" + "SP" + r"EC\s*§",
            r"\b" + "SP" + r"EC\.md\b",
            r"\b" + "RELIA" + r"BILITY\.md\b",
            r"\b" + "ST" + r"YLE\.md\b",
            r"\b[Ii]" + "ssue" + r"s?\s+#?\d+",
            r"\b[Ii]" + "ssue" + r"\s+#\d+",
            r"(?<![\w/])§\s*\d+",
        )
    )
)
_LINK = re.compile(r"(?P<page>(?:docs/)?[A-Za-z0-9_-]+\.md)#(?P<anchor>[A-Za-z0-9_-]+)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (before de-duplication)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans keep their text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their label
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # punctuation goes; word chars, '-', '_' and spaces stay
    return text.replace(" ", "-")


def anchors_of(markdown: str) -> frozenset[str]:
    """Every heading anchor of one page, with GitHub's ``-1``, ``-2`` suffixes for repeats."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        match = _HEADING.match(line)
        if match is None:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(out)


def _files(root: Path) -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = root / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and p.suffix in SUFFIXES
                and "__pycache__" not in p.parts
                and ".egg-info" not in str(p)
            )
    return files


def problems(root: Path) -> list[str]:
    """Every outside reference and every unresolved docs link under ``root``."""
    docs = root / "docs"
    anchor_cache: dict[Path, frozenset[str] | None] = {}

    def anchors(page: Path) -> frozenset[str] | None:
        if page not in anchor_cache:
            anchor_cache[page] = (
                anchors_of(page.read_text(encoding="utf-8")) if page.is_file() else None
            )
        return anchor_cache[page]

    found: list[str] = []
    for path in _files(root):
        rel = path.relative_to(root)
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for match in _OUTSIDE.finditer(line):
                found.append(f"{rel}:{lineno}: points outside the repo: {match.group(0)!r}")
            for match in _LINK.finditer(line):
                page_name = match.group("page")
                if page_name.startswith("docs/"):
                    page = root / page_name
                elif path.is_relative_to(docs):
                    page = path.parent / page_name
                else:
                    continue  # a bare ``x.md#y`` outside docs/ is not a docs link
                known = anchors(page)
                if known is None:
                    found.append(f"{rel}:{lineno}: no such page {page_name}")
                elif match.group("anchor") not in known:
                    found.append(f"{rel}:{lineno}: {page_name} has no #{match.group('anchor')}")
    return found


def test_every_reason_points_inside_the_repo() -> None:
    assert problems(ROOT) == []


def test_code_points_into_the_design_record() -> None:
    """The comments that give reasons do cite the design record (a floor, so a mass removal
    shows)."""
    cites = 0
    for path in (ROOT / "src").rglob("*.py"):
        cites += len(
            re.findall(r"docs/(?:design|reliability)\.md#", path.read_text(encoding="utf-8"))
        )
    assert cites >= 40


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Turns and steps", "turns-and-steps"),
        ("Code shape", "code-shape"),
        ("`explore_cancellation`", "explore_cancellation"),
        ("What a cancel reaches", "what-a-cancel-reaches"),
        ("Exit codes (CLI)", "exit-codes-cli"),
        ("A [link](x.md) here", "a-link-here"),
        ("Leases, with fencing!", "leases-with-fencing"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_repeated_headings_get_numbered_anchors() -> None:
    page = "# Top\n## Notes\n```\n# not a heading\n```\n## Notes\n"
    assert anchors_of(page) == {"top", "notes", "notes-1"}


def test_checker_fails_on_a_bad_tree(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# Design\n## Inbox\n", encoding="utf-8")
    (tmp_path / "docs" / "guide.md").write_text(
        "See [inbox](design.md#inbox) and [gone](design.md#outbox) and [x](nope.md#a).\n",
        encoding="utf-8",
    )
    (tmp_path / "src").mkdir()
    bad_ref = "SP" + "EC " + "\u00a7" + "5"
    bad_issue = "is" + "sue 12"
    (tmp_path / "src" / "m.py").write_text(
        "# fine: docs/design.md#inbox\n"
        f"# bad: docs/design.md{'#'}nowhere\n# {bad_ref}\n# see {bad_issue}\n",
        encoding="utf-8",
    )
    found = problems(tmp_path)
    assert len(found) == 5, found
    assert any("design.md has no #outbox" in p for p in found)
    assert any("no such page nope.md" in p for p in found)
    assert any("m.py:2" in p and "#nowhere" in p for p in found)
    assert any("m.py:3" in p and "outside" in p for p in found)
    assert any("m.py:4" in p and "outside" in p for p in found)
