"""The README and docs/ stay a small documentation set whose links lead somewhere.

The README opens with the two commands a new user runs (CI runs the same test command), stays
within its line budget, keeps no dated session log, and every relative link in it and in
docs/**/*.md names an existing file, and an existing heading when it carries an anchor.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 350
# The two commands, as the README's first code block gives them and `.ci/run` runs the second.
RUN, TEST = "make up", "make test"

_FENCE = re.compile(r"^(```|~~~)")
# [text](target): inline links and images; reference definitions "[id]: target" too.
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"`[^`]*`")
# A heading that is a session log entry: a date, or "Session …".
_DATED_HEADING = re.compile(r"^#{1,6}\s.*(\b\d{4}-\d{2}-\d{2}\b|\bsession\b)", re.IGNORECASE)


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(_INLINE_CODE.sub("``", line))
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 … for repeats."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if match is None:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(path: Path) -> list[str]:
    targets: list[str] = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        targets.extend(_INLINE_LINK.findall(line))
        ref = _REF_LINK.match(line)
        if ref is not None:
            targets.append(ref.group(1))
    return targets


def _is_external(target: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None


def test_the_readme_stays_within_its_line_budget() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_opens_with_the_run_and_test_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert first_block is not None, "README.md has no code block"
    before = text[: first_block.start()]
    assert [line for line in before.splitlines() if line.strip()] == ["# Bullpen"], (
        "only the title comes before the two commands"
    )
    commands = [line.split("#", 1)[0].strip() for line in first_block.group(1).splitlines()]
    assert [c for c in commands if c] == [RUN, TEST]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(rf"^\s*{re.escape(TEST)}\b", ci, re.MULTILINE), "CI runs the README's command"


def test_the_readme_holds_no_dated_session_log() -> None:
    text = README.read_text(encoding="utf-8")
    headings = [line for line in _prose_lines(text) if _HEADING.match(line)]
    dated = [h for h in headings if _DATED_HEADING.match(h)]
    assert dated == [], f"session log headings in README.md: {dated}"


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken: list[str] = []
    for target in _links(path):
        if _is_external(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"broken links in {path.relative_to(ROOT)}: {broken}"


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n[ok](#a-page) [missing](gone.md) `[code](skipped.md)`\n"
        "```\n[fenced](skipped-too.md)\n```\n",
        encoding="utf-8",
    )
    assert _links(page) == ["#a-page", "gone.md"]
    assert _anchors(page) == {"a-page"}
    assert _slug("Measured (2026-12-05, this project's 2-core VM)") == (
        "measured-2026-12-05-this-projects-2-core-vm"
    )
