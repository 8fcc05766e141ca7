"""Tracking the run's answer across cells: the ready answer, else the last content set."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def stringify(content: Any) -> str:
    """Answer content as text: strings as they are, anything else as `str()` would show it."""
    if isinstance(content, str):
        return content
    if isinstance(content, (dict, list)):
        # Sandboxes send content over JSON; a dict/list is shown the way Python's str() would.
        try:
            return str(json.loads(json.dumps(content)))
        except (TypeError, ValueError):
            return str(content)
    return str(content)


@dataclass
class AnswerState:
    ready: bool = False
    content: str | None = None  # last non-empty content seen (the answer when the run stops early)

    def observe(self, answer: dict[str, Any] | None) -> bool:
        """Read the sandbox's end-of-cell view of `answer`; True when it is ready."""
        if not isinstance(answer, dict):
            return False
        content = answer.get("content")
        if content is not None and content != "":
            self.content = stringify(content)
        # The sandbox already applied the readiness rule (rlm_mcp/sandbox/guest/answer_rules.py) and
        # sends a bool (frames.py refuses anything else): only True ends the run.
        if answer.get("ready") is True:
            if self.content is None:
                self.content = "" if content is None else stringify(content)
            self.ready = True
        return self.ready

    def submit_text(self, text: str) -> None:
        """A legacy FINAL(text) in the reply."""
        self.content = text
        self.ready = True
