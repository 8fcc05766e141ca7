"""Product code speaks of itself: a comment or docstring in rlm_mcp/ says what the code does and
why, never which issue asked for it (an issue number means nothing to a reader of the code, and
the history keeps the link: `git log -S`)."""

from __future__ import annotations

import re

from tests.paths import REPO

ISSUE_REFERENCE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def issue_references(text: str) -> list[str]:
    return [m.group(0) for m in ISSUE_REFERENCE.finditer(text)]


def test_the_pattern_finds_the_usual_spellings() -> None:
    assert issue_references("(issue 20 item 13)") == ["issue 20"]
    assert issue_references("Issue #3: every hostile cell") == ["Issue #3"]
    assert issue_references("issues 14 and 20") == ["issues 14"]
    assert issue_references("an issue with 2 causes; tissue 5") == []


def test_no_product_module_names_an_issue() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "rlm_mcp").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if issue_references(line)
    ]
    assert found == [], "say what the code does and why instead:\n" + "\n".join(found)
