"""The code blocks of the README and the docs pages, as tests read them: shell blocks marked
runnable, client snippets, endpoint guides. A block is found by its marker wherever it lives, so a
test follows its text from page to page."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
RUNNABLE = "<!-- runnable"


def pages() -> list[Path]:
    """The README, then every page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str  # the HTML comment right above the fence, or ""
    text: str
    page: str = "README.md"  # where it is, relative to the repository

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of one page, with the `<!-- ... -->` comment on the line just above it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(REPO).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1].strip() if i > 0 else ""
        marker = above if above.startswith("<!--") else ""
        found.append(Block(i + 1, fence[1], marker, "\n".join(lines[i + 1 : end]), name))
        i = end + 1
    return found


def blocks(page: Path | None = None) -> list[Block]:
    """The blocks of one page, or of the README and every docs page."""
    return page_blocks(page) if page is not None else [b for p in pages() for b in page_blocks(p)]


def runnable_blocks() -> list[Block]:
    return [b for b in blocks() if b.marker.startswith(RUNNABLE) and b.lang == "bash"]
