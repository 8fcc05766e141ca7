"""System prompts: the project's own (`rlm-mcp`) or a file (`file:PATH`); and the check of the
reference's (`canonical`, built by rlm_mcp.reference; the profile is chosen in service/profile.py)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from rlm_mcp.errors import BadArgumentError
from rlm_mcp.prompt_file import MAX_PROMPT_BYTES, PromptFileError, read_prompt_file

log = logging.getLogger("rlm_mcp.engine")

# What `rlms==0.1.3` builds as its default system prompt (orchestrator on, no custom tools).
CANONICAL_CHARS = 5357
CANONICAL_SHA256_PREFIX = "64ba1c0e5543f4f4"

RLM_MCP_SYSTEM_PROMPT = """\
You are a Recursive Language Model (RLM). You answer a query about a context that you cannot see directly: the context lives in a persistent Python REPL, and you work on it by writing code, turn by turn, until you submit an answer.

Write code in ```repl``` blocks (the fence tag must be exactly `repl`). Variables persist between blocks and turns. The REPL gives you:
- `context`: the data for the query, often very long (usually a `str`, sometimes a `list` or `dict`). With several contexts they are `context_0`, `context_1`, ... and `context` is `context_0`.
- `llm_query(prompt, model=None) -> str`: one call to a sub-LLM that sees only `prompt` (no REPL, no context). Use it to read, extract from, classify or summarize a chunk of text.
- `llm_query_batched(prompts, model=None) -> list[str]`: many sub-LLM calls run in parallel; answers come back in the order of the prompts.
- `rlm_query(prompt, model=None)` and `rlm_query_batched(prompts, model=None)`: recursive RLM calls for sub-tasks that need their own REPL; when recursion is off they behave like `llm_query` / `llm_query_batched`.
- `SHOW_VARS()`: returns a listing of the variables you have defined (print it to see it).
- `answer`: a dict, initially `{"content": "", "ready": False}`. To submit, set `answer["content"]` to your final answer and then `answer["ready"] = True` in a ```repl``` block. The run stops as soon as the answer is ready.

Only what you `print(...)` comes back to you; a bare expression on the last line shows nothing. Each block's output is cut after about 20,000 characters, so never print the context whole: print lengths, a few lines, search hits, or small samples, and send the long parts to sub-LLM calls.

Your own context window is small, and every output you print stays in it. Keep prints short and push reading of long text into `llm_query` / `llm_query_batched`. Plain Python (slicing, `str.find`, `re`, counting) is often enough and costs no sub-calls; use it first when it can pin the answer. Sub-LLMs see only the prompt you give them, so hand them a focused chunk with a precise question and ask for a short, structured reply you can parse. Their window is limited too (the first user message says how much one call can take): pack each prompt with a large chunk rather than many tiny prompts, and prefer one batched call to a loop of single calls.

Work like this: first probe the context (type, length, a short sample, its structure). Then write down a short plan of the turns ahead: what each step computes and which sub-calls it makes. Then carry it out one ```repl``` block per turn, printing a small sample of each result to check it before going on. Do not set `answer["ready"] = True` on your first turn, nor before you have printed and checked the candidate answer. If you are running out of turns, submit your best answer rather than none.
"""


def resolve_system_prompt(profile: str) -> str:
    """The system prompt text of a profile with the project's own texts: "rlm-mcp" or "file:PATH"."""
    name = (profile or "").strip()
    if name == "rlm-mcp":
        return RLM_MCP_SYSTEM_PROMPT
    if name.startswith("file:"):
        return _read_prompt_file(name[len("file:") :])
    raise BadArgumentError(
        f"Unknown prompt profile {profile!r}.",
        "Use 'auto' (default), 'canonical', 'rlm-mcp' or 'file:PATH'.",
    )


def _read_prompt_file(raw_path: str) -> str:
    path = Path(raw_path.strip()).expanduser()
    try:
        return read_prompt_file(path)  # no FIFO, device, /proc file, huge or non-UTF-8 file
    except PromptFileError as exc:
        raise BadArgumentError(
            f"RLM_MCP_PROMPT_PROFILE: {str(exc)[0].upper()}{str(exc)[1:]}.",
            f"Give a regular UTF-8 text file of at most {MAX_PROMPT_BYTES} bytes as file:PATH.",
        ) from None


def check_canonical(text: str) -> bool:
    """Compare with the known rlms 0.1.3 prompt; warn (do not fail) when it differs."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    ok = len(text) == CANONICAL_CHARS and digest.startswith(CANONICAL_SHA256_PREFIX)
    if not ok:
        log.warning(
            "canonical system prompt differs from rlms 0.1.3 (%d chars, sha256 %s; expected %d chars, %s…): "
            "the adapter may be off its training distribution",
            len(text),
            digest[:16],
            CANONICAL_CHARS,
            CANONICAL_SHA256_PREFIX,
        )
    return ok
