"""Prefix reuse of the root conversation: what share of its prompt tokens a prefix cache (vLLM's
automatic prefix caching, on one replica thanks to the session key) could serve from cache.

A 30-turn trajectory whose REPL outputs overflow a 16k window runs through rlm-mcp (engine, real
LM client, real Docker sandbox) against the scripted server, which records for every root
request the longest common prefix with the session's previous request plus its completion
(`rlm_mcp.testing.prefix`). Printed: the share of root prompt tokens reused, the turns that
re-prefill more than 2,000 tokens, and the same for the reference library's conversation on the
same trajectory where it can run it (`--reference-python`, a venv with rlms 0.1.3, built as
bench/compare_reference.py says; it runs with its local REPL: the conversation does not depend
on where code runs). Never fails on a figure.

    .venv/bin/python bench/prefix.py [--target-fraction 0.6] [--reference-python PY]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.engine import RLMEngine, RunLimits, RunProgress
from rlm_mcp.engine import window as window_module
from rlm_mcp.engine.prompts import RLM_MCP_SYSTEM_PROMPT
from rlm_mcp.events import HistoryElided, RunEvent
from rlm_mcp.lm.client import LMClient
from rlm_mcp.ports import ContextSpec
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.testing import count_prompt_tokens
from rlm_mcp.testing.prefix import PrefixTurn
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.settings import make_settings

HERE = Path(__file__).resolve().parent
TURNS = 30
WINDOW = 16384
BIG_PREFILL = 2000
# Output sizes (characters) of the turns, in a repeating pattern: mostly a few thousand, now and
# then one near the 20,000-character cap. About 31k tokens of output over the run.
SIZES = [1500, 3000, 6000, 800, 12000, 2500]


def trajectory() -> list[str]:
    replies = []
    for turn in range(1, TURNS):
        size = SIZES[turn % len(SIZES)]
        prose = f"Turn {turn}: I look at the next part of the context and print what I need. " * 3
        code = f"part = context[{turn * 100}:{turn * 100 + 50}]\nprint(('turn {turn} ' + 'abcdefghij' * {size // 10 + 1})[:{size}])"
        replies.append(f"{prose}\n```repl\n{code}\n```")
    replies.append('Done.\n```repl\nanswer["content"] = "done"\nanswer["ready"] = True\n```')
    return replies


def script() -> dict[str, Any]:
    return {"root": trajectory(), "max_model_len": WINDOW, "sub_default": "ok"}


def new_tokens(messages: list[dict[str, Any]]) -> int:
    """Tokens no cache can hold: what follows the last reply (its end token, the REPL output and
    the next turn's message, the generation prompt); the whole prompt of a first request."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    return count_prompt_tokens(messages) if last is None else count_prompt_tokens(messages[last + 1 :]) + 1


def summary(name: str, turns: list[PrefixTurn], bodies: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = sum(t.prompt_tokens for t in turns)
    reused = sum(t.reused_tokens for t in turns)
    ceiling = 1 - sum(new_tokens(b["messages"]) for b in bodies[: len(turns)]) / prompt if prompt else 0.0
    big = [i + 1 for i, t in enumerate(turns) if t.prefilled > BIG_PREFILL]
    share = reused / prompt if prompt else 0.0
    print(
        f"{name}: {len(turns)} root requests, {prompt} prompt tokens, {reused} reusable "
        f"({share:.1%}; append-only ceiling {ceiling:.1%}); {len(big)} re-prefill > {BIG_PREFILL} tokens (turns {big})"
    )
    return {
        "requests": len(turns),
        "prompt_tokens": prompt,
        "reused_tokens": reused,
        "share": share,
        "ceiling": ceiling,
        "big": big,
    }


async def ours(target: float) -> dict[str, Any]:
    window_module.TARGET_FRACTION = target
    with tempfile.TemporaryDirectory(prefix="rlm-prefix-") as tmp:
        context = Path(tmp) / "context.txt"
        context.write_text("The quick brown fox jumps over the lazy dog. " * 20000, encoding="utf-8")
        spec = ContextSpec(path=context, format="text", kind="str", chars=900000, bytes=900000, name="ctx")
        async with ScriptedLM(script()) as server:
            settings = make_settings(base_url=server.base_url, pool_size=1, data_dir=Path(tmp) / "data")
            async with LMClient(settings.lm) as lm, SandboxManager(settings.sandbox) as sandboxes:
                engine = RLMEngine(settings.engine, lm, sandboxes.open, system_prompt=RLM_MCP_SYSTEM_PROMPT)
                limits = RunLimits(max_iterations=TURNS, max_depth=1, timeout_s=600, token_budget=None, max_errors=5)
                events: list[RunEvent] = []

                async def sink(event: RunEvent) -> None:
                    events.append(event)

                result = await engine.run(
                    run_id="prefix",
                    query="Walk through the context.",
                    contexts=[spec],
                    limits=limits,
                    progress=RunProgress(run_id="prefix", max_iterations=TURNS),
                    emit=sink,
                )
            turns = server.prefix.by_session("prefix")
            bodies = [r["body"] for r in server.requests_by_role("root") if r["status"] == 200]
        elisions = sum(1 for e in events if isinstance(e, HistoryElided))
        print(f"rlm-mcp run: {result.status}, {result.iterations} turns, {elisions} elisions (target {target:g})")
        figures = summary("rlm-mcp", turns, bodies)
        figures["turns"], figures["bodies"] = turns, bodies
        return figures


def reference(python: str, compaction: bool) -> dict[str, Any] | None:
    with tempfile.TemporaryDirectory(prefix="rlm-prefix-ref-") as tmp, ScriptedLM(script()) as server:
        context = "The quick brown fox jumps over the lazy dog. " * 20000
        (Path(tmp) / "context.txt").write_text(context, encoding="utf-8")
        proc = subprocess.run(
            [python, str(HERE / "reference" / "conversation.py"), server.base_url, str(Path(tmp) / "context.txt")]
            + (["--compaction"] if compaction else []),
            capture_output=True,
            text=True,
            cwd=tmp,
            timeout=900,
        )
        outcome = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-300:]
        turns = server.prefix.by_session("")
        statuses = [r["status"] for r in server.requests_by_role("root")]
        refused = sum(1 for s in statuses if s != 200)
        name = "reference" + (" (compaction=True)" if compaction else "")
        print(f"{name} run: {outcome[:200]}; {len(statuses)} root requests, {refused} refused by the server")
        bodies = [r["body"] for r in server.requests_by_role("root") if r["status"] == 200]
        return summary(name, turns, bodies) if turns else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-fraction", type=float, default=window_module.TARGET_FRACTION)
    parser.add_argument("--reference-python", help="python of a venv with rlms==0.1.3 (else: ours only)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    mine = anyio.run(ours, args.target_fraction)
    turns, bodies = mine.pop("turns"), mine.pop("bodies")
    figures: dict[str, Any] = {"ours": mine}
    if args.reference_python:
        for key, compaction in (("reference", False), ("reference_compaction", True)):
            figures[key] = theirs = reference(args.reference_python, compaction=compaction)
            if theirs is not None and theirs["requests"] < len(turns):
                # The same turns of ours, for a like-for-like figure over what the reference ran.
                figures[f"ours_first_{theirs['requests']}"] = summary(
                    f"rlm-mcp, its first {theirs['requests']} turns", turns[: theirs["requests"]], bodies
                )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
