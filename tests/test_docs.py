"""The README and docs/ stay short, true and linked: size, the two commands, links, paths.

Fast: reads Markdown files only (no TVM compile).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_LIMIT_BYTES = 12_000
# backticked text starting with one of these is read as a path relative to the repository root
REPO_PREFIXES = (
    "python/",
    "passes/",
    "schedules/",
    "warehouse/",
    "scripts/",
    "tests/",
    "docs/",
    "notebooks/",
)
PLACEHOLDER = re.compile(r"[*<>{}$]|\bNAME\b")  # a pattern, not one path

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def link_targets(text: str) -> list[str]:
    """Relative link targets (``#anchor`` suffixes stripped) outside code; web links, mail
    links and anchors within the page are left out."""
    targets = []
    for line in prose_lines(text):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
                continue  # http(s):, mailto: ... and same-page anchors
            path = target.split("#", 1)[0]
            if path:
                targets.append(path)
    return targets


def broken_links(md: Path) -> list[str]:
    """Link targets of ``md`` that name no existing file or folder (relative to ``md``)."""
    return [t for t in link_targets(md.read_text()) if not (md.parent / t).exists()]


def repo_paths(text: str) -> list[str]:
    """Paths written in backticks (outside fenced blocks) that start with a repository folder,
    also as words of a backticked command; patterns (``*``, ``<name>``, ``NAME``) left out."""
    paths = []
    for line in prose_lines(text):
        for _, code in INLINE_CODE.findall(line):
            for word in code.split():
                path = word.strip("\"'()[],;:")
                if path.startswith(REPO_PREFIXES) and not PLACEHOLDER.search(path):
                    paths.append(path)
    return paths


def missing_paths(md: Path, root: Path = ROOT) -> list[str]:
    """Backticked repository paths in ``md`` that do not exist under ``root``."""
    return [p for p in repo_paths(md.read_text()) if not (root / p).exists()]


def test_readme_is_short():
    size = README.stat().st_size
    assert size < README_LIMIT_BYTES, f"README.md is {size} bytes; keep it under 12,000"


def test_readme_names_the_two_commands_and_they_are_executable():
    text = README.read_text()
    for command in ("scripts/demo", "scripts/test"):
        assert f"`{command}`" in text, f"README.md does not name {command}"
        path = ROOT / command
        assert path.is_file(), f"{command} is missing"
        assert os.access(path, os.X_OK), f"{command} is not executable"
    assert "sets everything up on a fresh machine by itself" in text


def test_ci_runs_the_test_command():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    code = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    assert any("scripts/test" in ln for ln in code), ".ci/run does not run scripts/test"


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
    assert broken_links(md) == []


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_backticked_repository_paths_exist(md):
    assert missing_paths(md) == []


def test_readme_indexes_every_docs_page():
    linked = {(ROOT / t).resolve() for t in link_targets(README.read_text())}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert unlinked == [], f"docs pages missing from the README's index: {unlinked}"


def test_the_checks_catch_a_broken_link_and_a_missing_path(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "real.md").write_text("# Real\n")
    (tmp_path / "python").mkdir()
    md = tmp_path / "docs" / "page.md"
    md.write_text(
        "See [real](real.md#real), [the top](#top), [web](https://example.org/x.md),\n"
        "[gone](missing.md#part) and [up](../docs/).\n"
        "```\n[in a code block](not-checked.md) `python/not/checked.py`\n```\n"
        "Code: `python/` exists, `python/gone.py --flag` does not, `warehouse/*.toml` is a\n"
        "pattern, `tests/test_<name>.py` too, `[x](inline-code.md)` is not a link, and\n"
        "`.venv/bin/python scripts/gone --json F` names a missing script.\n"
    )
    assert broken_links(md) == ["missing.md"]
    assert missing_paths(md, root=tmp_path) == ["python/gone.py", "scripts/gone"]
