"""The code blocks a docs page marks `<!-- snippet: NAME -->`, run by the tests that use them, so
the page shows code the suite runs (docs/events-and-webhooks.md)."""

from __future__ import annotations

import re
from typing import Any

from tests.paths import REPO


def snippet(page: str, name: str) -> dict[str, Any]:
    """The names the page's `name` snippet defines (its code block executed)."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    found = re.search(rf"^<!-- snippet: {re.escape(name)} -->\n```python\n(.*?)^```$", text, re.M | re.S)
    assert found is not None, f"docs/{page} has no snippet {name!r}"
    namespace: dict[str, Any] = {}
    exec(compile(found[1], f"docs/{page} (snippet {name})", "exec"), namespace)
    return namespace
