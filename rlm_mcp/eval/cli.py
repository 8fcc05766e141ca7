"""`rlm-mcp eval`: its argument parsing and command, hooked into `rlm_mcp.cli` by two lines.

    rlm-mcp eval TASKS.jsonl --output DIR [--parallel N] [--baseline direct] [...]
    rlm-mcp eval generate KIND --output DIR [--n N] [--seed S] [--sizes ...]
    rlm-mcp eval import BENCHMARK FILE --output DIR [--n N] [...]

`generate` and `import` are words in the first position (a task file named `generate` can be
given as `./generate`), so the three share one argparse entry.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from rlm_mcp.cli_options import add_override_options
from rlm_mcp.config import Settings
from rlm_mcp.visible import visible, visible_line

if TYPE_CHECKING:
    from rlm_mcp.eval.results import TaskResult

_USAGE = """rlm-mcp eval TASKS.jsonl --output DIR [--parallel N] [--baseline direct] [options]
       rlm-mcp eval generate {needle,oolong,pairs,code,suite} --output DIR [--n N] [--seed S]
       rlm-mcp eval import {oolong,oolong-pairs,longbench-code,browsecomp-plus} FILE --output DIR [--n N]"""


def add_parser(sub: Any) -> None:
    """Register `eval` on the top-level subparsers."""
    p = sub.add_parser(
        "eval",
        help="score a task file (or generate/import tasks)",
        usage=_USAGE,
        description="Evaluate answer quality. Run `rlm-mcp eval TASKS.jsonl -h` for run options, "
        "`rlm-mcp eval generate -h`, `rlm-mcp eval import -h`.",
    )
    p.add_argument("target", help="a task file (JSONL), or the word generate or import")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlm-mcp eval TASKS.jsonl",
        description="Run every task of a task file through rlm-mcp, score the answers, write DIR/summary.md.",
    )
    p.add_argument("--output", "-o", required=True, help="folder for results.jsonl and summary.md")
    p.add_argument("--parallel", "-j", type=int, default=1, help="tasks run at once (default 1)")
    p.add_argument("--baseline", choices=["direct"], help="also score the model called once, context cut to fit")
    add_override_options(p)  # --max-iterations, --max-depth, --timeout-s, --token-budget: as `rlm-mcp run`
    p.add_argument("--judge-model", help="model of the `judge` scorer (default: RLM_MCP_MODEL)")
    p.add_argument("--judge-base-url", help="endpoint of the judge model (default: RLM_MCP_BASE_URL)")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument(
        "--keep-errors", action="store_true", help="on resume, keep tasks that ended in error (default: run them again)"
    )
    return p


def forms() -> dict[str, argparse.ArgumentParser]:
    """The parser of each form of `rlm-mcp eval` (its first word, or TASKS.jsonl): for help checks."""
    from rlm_mcp.eval.generate_cli import _parser as generate_parser
    from rlm_mcp.eval.import_cli import _parser as import_parser

    return {"TASKS.jsonl": _run_parser(), "generate": generate_parser(), "import": import_parser()}


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.target == "generate":
        from rlm_mcp.eval.generate_cli import generate_command

        return generate_command(args.rest)
    if args.target == "import":
        from rlm_mcp.eval.import_cli import import_command

        return import_command(args.rest)
    return _evaluate(Path(args.target), _run_parser().parse_args(args.rest), settings)


def _evaluate(task_file: Path, opts: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli_options import overrides_of
    from rlm_mcp.eval.display import Tally, make_display
    from rlm_mcp.eval.report import render_markdown, summarize
    from rlm_mcp.eval.results import BASELINE_FILES, RESULTS_FILE, SUMMARY_FILE, read_results
    from rlm_mcp.eval.runner import EvalOptions, run_eval, settled
    from rlm_mcp.eval.tasks import load_tasks

    tasks = load_tasks(task_file)
    output = Path(opts.output)
    overrides = overrides_of(opts)
    options = EvalOptions(
        task_file=task_file,
        output_dir=output,
        parallel=opts.parallel,
        baseline=opts.baseline,
        overrides=overrides,
        judge_model=opts.judge_model,
        judge_base_url=opts.judge_base_url,
        keep_errors=opts.keep_errors,
    )
    ids = {t.id for t in tasks}
    already = [r for r in settled(read_results(output / RESULTS_FILE), opts.keep_errors).values() if r.id in ids]
    tally = Tally(len(tasks), already)
    display = make_display(tally, live=False if opts.plain else None)
    started = time.monotonic()
    try:
        anyio.run(run_eval, tasks, settings, options, display)
    finally:
        display.close()
    rlm_results = [r for r in read_results(output / RESULTS_FILE).values() if r.id in ids]
    summaries = [summarize("rlm", rlm_results)]
    if opts.baseline:
        baseline = read_results(output / BASELINE_FILES[opts.baseline]).values()
        summaries.append(summarize(opts.baseline, [r for r in baseline if r.id in ids]))
    markdown = render_markdown(summaries, wall_s=time.monotonic() - started, title=f"rlm-mcp eval: {task_file.name}")
    (output / SUMMARY_FILE).write_text(markdown, encoding="utf-8")
    sys.stdout.write(visible(markdown))  # task ids from downloaded files: controls shown
    return _exit_status(rlm_results)


def _exit_status(results: list[TaskResult]) -> int:
    """1 when every task ended in `error` (nothing was measured: the cause is a setup problem),
    with the first cause on stderr; otherwise 0, whatever the scores."""
    if not results or any(r.status != "error" for r in results):
        return 0
    first = next((r.error for r in results if r.error), "no reason recorded")
    sys.stderr.write(  # the cause may quote a downloaded task's path: controls shown, one line
        f"rlm-mcp eval: every task ({len(results)}) ended in error; the first: {visible_line(first)}\n"
        "Fix that cause and run the same command again: tasks that ended in error run again "
        "(--keep-errors keeps them).\n"
    )
    return 1
