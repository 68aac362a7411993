"""The repository stands alone: no tracked file cites notes, issues or trackers that a clone
does not contain, and every pointer into docs/lessons.md names a section that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = [
    (re.compile(r"\bLESSONS(?:\.md|\s+\d)"), "the team's lessons notes"),
    (re.compile(r"\b[Ll]essons?\s+\d"), "a numbered lesson"),
    (re.compile(r"\.\./shared\b|\bshared/(?:notes|LESSONS)"), "a directory beside the repository"),
    (re.compile(r"\b[Ii]ssues?\s+#?\d+"), "an issue by number"),
    (re.compile(r"\b(?:the|this)\s+issue's\b"), "an issue by reference"),
    (re.compile(r"github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d"), "a GitHub issue"),
]
# "#123" cites an issue or pull request, unless it numbers a thing: "rank #0", "GPU #1", or
# follows a bracket: a C++ lambda's name in a profiled kernel's ("{lambda()#3}")
HASH_NUMBER = re.compile(r"(?:(\w+)\s+)?(?<![\w&/)])#\d{1,5}\b(?![\w-])")
COUNTED = {"rank", "gpu", "node", "host", "step", "worker", "device", "process", "row", "item", "no"}
ANCHOR_REF = re.compile(r"lessons\.md#([a-z0-9-]+)")


def tracked_text_files() -> list[Path]:
    """Tracked files that read as text (images and other binaries are skipped)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def outside_citations(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) for each line of ``text`` that cites something outside."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern, what in OUTSIDE:
            if pattern.search(line):
                found.append((n, what, line.strip()))
        if any((m.group(1) or "").lower() not in COUNTED for m in HASH_NUMBER.finditer(line)):
            found.append((n, "an issue or pull request by number", line.strip()))
    return found


def test_no_file_cites_anything_outside_the_repository() -> None:
    here = Path(__file__).resolve()  # this file quotes citations as examples of what the check catches
    bad = [f"{path.relative_to(ROOT)}:{n}: {what}: {line[:120]}"
           for path in tracked_text_files() if path.resolve() != here
           for n, what, line in outside_citations(path.read_text(encoding="utf-8"))]
    assert not bad, "cites what a clone does not contain:\n" + "\n".join(bad)


@pytest.mark.parametrize("line", [
    "# see LESSONS 12",
    "(LESSONS.md beside the repository)",
    "a closure (lesson 9)",
    "Recipe: ../shared/notes/ENVIRONMENT.md",
    "Goal (issue 11): status < 0.5 s",
    "fixed upstream, see #1234",
    "the issue's targets",
    "https://github.com/pytorch/pytorch/issues/12345",
])
def test_the_check_catches_a_citation(line: str) -> None:
    assert outside_citations(line)


@pytest.mark.parametrize("line", [
    "the lessons in docs/lessons.md#no-silent-default",
    "fill: #98e024; color #094573",
    "a host's shared filesystem, shared/runs",
    "the next K/V load is issued while this one is computed",
    "rank #0 and step 12, GPU #3",
    "nccl/rank_1 and the 3 issues it raised",
    '"kernel": "void at::native::elementwise_kernel<128, 4, ...{lambda()#3}::operator()() const"',
])
def test_the_check_spares_ordinary_text(line: str) -> None:
    assert not outside_citations(line)


def test_every_lessons_reference_names_a_section() -> None:
    sections = set(re.findall(r"^### ([a-z0-9-]+)\s*$", (ROOT / "docs" / "lessons.md").read_text(), re.M))
    assert sections, "docs/lessons.md has no named sections"
    bad = [f"{path.relative_to(ROOT)}: #{name}"
           for path in tracked_text_files()
           for name in ANCHOR_REF.findall(path.read_text(encoding="utf-8"))
           if name not in sections]
    assert not bad, "point at no section of docs/lessons.md:\n" + "\n".join(bad)
