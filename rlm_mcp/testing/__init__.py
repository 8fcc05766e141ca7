"""Test support shipped with the package: the scripted OpenAI-compatible LM server.

See `rlm_mcp.testing.script` for the script format, `rlm_mcp.testing.scripted_lm` for the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlm_mcp.testing.process import read_log, scripted_lm_process
from rlm_mcp.testing.script import Fault, RootScript, Script, SubRule, count_prompt_tokens, count_text_tokens

if TYPE_CHECKING:
    from rlm_mcp.testing.scripted_lm import ScriptedLM

__all__ = [
    "Fault",
    "RootScript",
    "Script",
    "ScriptedLM",
    "SubRule",
    "count_prompt_tokens",
    "count_text_tokens",
    "read_log",
    "scripted_lm_process",
]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `python -m rlm_mcp.testing.scripted_lm` does not find the module
    # already imported by its package (runpy warns about that).
    if name == "ScriptedLM":
        from rlm_mcp.testing.scripted_lm import ScriptedLM

        return ScriptedLM
    raise AttributeError(name)
