"""The README and docs/ hold together: the README stays a front door, every fenced block says
whether the suite runs it, every link and every pointer from the code into the docs lands on a
file and heading that exist."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RUN_PAGE = REPO / "docs" / "agents.md"  # its `run` blocks are executed by tests/e2e/test_agent_examples.py
OPENING = re.compile(r"^```(.*)$")
TAG = re.compile(r"^\w[\w+-]* (?:run(?:-[\w-]+)?|norun \S.*)$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A pointer from code to a page: README.md or docs/….md, with an optional #anchor.
CODE_POINTER = re.compile(r"\b(README\.md|docs/[\w/.-]+\.md)(#[\w-]+)?")
CODE_DIRS = ("schemas", "streams", "services", "infra", "tests", "benchmarks", "scripts", "clients/python", "clients/typescript/src")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache  # a page is read once however many links point into it
def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


@cache
def fences(page: Path) -> list[tuple[int, str]]:
    """(line number, info string) of every opening fence."""
    out, inside = [], False
    for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        m = OPENING.match(line)
        if m is None:
            continue
        if not inside:
            out.append((i, m.group(1)))
        inside = not inside
    assert not inside, f"{page}: a fenced block is not closed"
    return out


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert len(text.split()) <= 3_000


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_block_says_whether_the_suite_runs_it(page):
    bad = [(n, info) for n, info in fences(page) if not TAG.match(info)]
    assert not bad, f"{page.name}: blocks need '```<lang> run' or '```<lang> norun <reason>': {bad}"
    if page != RUN_PAGE:
        ran = [(n, info) for n, info in fences(page) if info.split(" ")[1].startswith("run")]
        assert not ran, f"{page.name}: only docs/agents.md holds executed examples, so these cannot be 'run': {ran}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_lands(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    missing = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            missing.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            missing.append(target)
    assert not missing, f"{page.name}: links to nothing: {missing}"


def _code_files():
    for d in CODE_DIRS:
        for p in (REPO / d).rglob("*"):
            if p.suffix in {".py", ".sh", ".ts"} and "node_modules" not in p.parts and p.is_file():
                yield p


def test_every_pointer_from_the_code_lands():
    missing, vague = [], []
    for p in _code_files():
        text = p.read_text(encoding="utf-8", errors="replace")
        for m in CODE_POINTER.finditer(text):
            dest = REPO / m.group(1)
            if not dest.exists() or (m.group(2) and m.group(2)[1:] not in anchors(dest)):
                missing.append(f"{p.relative_to(REPO)}: {m.group(0)}")
        # A section named by its title only cannot be checked (and moves): point to a page instead.
        if p != Path(__file__):
            vague += [f"{p.relative_to(REPO)}: {text[m.start():m.start() + 40]!r}" for m in re.finditer(r"README(?!\.md)", text)]
    assert not missing, f"pointers to pages or headings that do not exist: {missing}"
    assert not vague, f"pointers to README sections by title (point to docs/<page>.md#<heading>): {vague}"
