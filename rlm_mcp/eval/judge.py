"""The `judge` scorer: a configured model grades an answer against the gold one.

BrowseComp-Plus's official scoring uses an LLM judge; this is the same idea with our own prompt:
the judge sees the question, the gold answer and the response, and must end with
`correct: yes` or `correct: no`. Anything else scores 0.
"""

from __future__ import annotations

import re
from typing import Any

from rlm_mcp.config import Settings
from rlm_mcp.lm.client import LMClient
from rlm_mcp.ports.chat import LMError

_VERDICT = re.compile(r"correct\s*:\s*\**\s*(yes|no)\b", re.IGNORECASE)

JUDGE_PROMPT = """You grade answers to questions. Decide whether the RESPONSE answers the QUESTION \
with the same meaning as the GOLD ANSWER. Small differences in wording, formatting or units that do \
not change the meaning are fine; a missing, vaguer, hedged between several options, or different \
answer is not.

QUESTION:
{question}

GOLD ANSWER:
{gold}

RESPONSE:
{response}

Explain in one or two sentences, then end with a line that is exactly `correct: yes` or `correct: no`."""


def verdict(text: str) -> bool | None:
    """The judge's last `correct: yes|no`, or None when it gave none."""
    found = _VERDICT.findall(text)
    return None if not found else found[-1].lower() == "yes"


class Judge:
    """Grades with one model; owns its LM client (closed by `aclose`)."""

    def __init__(self, settings: Settings, *, model: str | None = None, base_url: str | None = None) -> None:
        # The judge talks to one endpoint, its own (default: the root's), never the sub-call one.
        update: dict[str, Any] = {"sub_base_url": None, "sub_api_key": None, "sub_extra_body": None}
        if base_url:
            update["base_url"] = base_url
        self.model = model or settings.lm.model
        self._client = LMClient(settings.model_copy(update=update).lm)
        self._max_tokens = 512

    async def grade(self, question: str, gold: Any, response: str | None) -> tuple[float, str | None]:
        """(score, error): 1.0 for `correct: yes`, else 0.0; an LM failure is an error, not a 0 verdict."""
        if response is None:
            return 0.0, None
        prompt = JUDGE_PROMPT.format(question=question, gold=gold, response=response)
        try:
            completion = await self._client.complete(
                [{"role": "user", "content": prompt}], model=self.model, max_tokens=self._max_tokens, role="sub"
            )
        except LMError as exc:
            return 0.0, f"judge failed: {exc}"
        said = verdict(completion.text)
        if said is None:
            return 0.0, "judge gave no verdict"
        return float(said), None

    async def aclose(self) -> None:
        await self._client.aclose()
