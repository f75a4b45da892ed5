"""The repository stands alone: no file sends a reader to documents outside it, and every
relative link of its Markdown reaches a file (and heading) in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The workspace's own notes, which a clone does not have (spelled in pieces: this file is
# tracked too).
OUTSIDE = ("BENCH" + ".md", "DESIGN" + ".md", "STYLE" + ".md", "../" + "shared")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *patterns], cwd=ROOT, capture_output=True,
                         check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def _anchors(markdown: Path) -> set[str]:
    """GitHub's anchors of a file's headings: lower case, punctuation but `-` and `_`
    dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", markdown.read_text(), flags=re.MULTILINE)}


def test_no_file_names_a_document_outside_the_repository() -> None:
    found = []
    for path in _tracked():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):  # binaries; deleted, not committed
            continue
        found += [f"{path.relative_to(ROOT)}: {name}" for name in OUTSIDE if name in text]
    assert found == []


def test_every_relative_link_of_the_markdown_reaches_its_file_and_heading() -> None:
    broken = []
    for markdown in _tracked("*.md"):
        for target in LINK.findall(markdown.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            path = (markdown.parent / name).resolve() if name else markdown
            if not path.exists() or (anchor and path.suffix == ".md"
                                     and anchor not in _anchors(path)):
                broken.append(f"{markdown.relative_to(ROOT)}: {target}")
    assert broken == []
