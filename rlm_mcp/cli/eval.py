"""`rlm-mcp eval`: its argument parsing and command, hooked into the parser (cli/parser.py) by one line.

    rlm-mcp eval TASKS.jsonl --output DIR [--parallel N] [--baseline direct] [...]
    rlm-mcp eval generate KIND --output DIR [--n N] [--seed S] [--sizes ...]
    rlm-mcp eval import BENCHMARK FILE --output DIR [--n N] [...]

Three forms, each an argparse parser with its own handler: `generate` and `import` are
subcommands; any other first word is a task file, parsed by the run form (a task file named
`generate` can be given as `./generate`). `rlm-mcp eval --help` shows the run form's options too.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from rlm_mcp.cli.options import add_override_options
from rlm_mcp.config import Settings
from rlm_mcp.eval import generate_cli, import_cli
from rlm_mcp.visible import visible, visible_line

if TYPE_CHECKING:
    from rlm_mcp.eval.results import TaskResult

_USAGE = """rlm-mcp eval TASKS.jsonl --output DIR [--parallel N] [--baseline direct] [options]
       rlm-mcp eval generate {needle,oolong,pairs,code,suite} --output DIR [--n N] [--seed S]
       rlm-mcp eval import {oolong,oolong-pairs,longbench-code,browsecomp-plus} FILE --output DIR [--n N]"""
_RUN_DESCRIPTION = "Run every task of a task file through rlm-mcp, score the answers, write DIR/summary.md."


class Forms(argparse._SubParsersAction):  # type: ignore[type-arg]
    """`eval`'s subcommands (generate, import); a first word that names none of them is a task
    file, and the whole rest is parsed by the run form."""

    def __init__(self, *args: Any, run_form: argparse.ArgumentParser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_form = run_form
        # Any word may come first (a task file's path), so argparse's choice check is off; the
        # named forms stay in `_name_parser_map`, and the help lists them.
        self.choices = None  # type: ignore[assignment]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        words = list(values or [])
        if words and words[0] in self._name_parser_map:
            super().__call__(parser, namespace, words, option_string)
            return
        for key, value in vars(self.run_form.parse_args(words)).items():
            setattr(namespace, key, value)


def add_parser(sub: Any) -> None:
    """Register `eval` on the top-level subparsers."""
    run_form = _run_parser()
    p = sub.add_parser(
        "eval",
        help="score a task file (or generate/import tasks)",
        usage=_USAGE,
        description="Evaluate answer quality: score a task file's answers, or generate or import tasks. "
        "`rlm-mcp eval generate -h` and `rlm-mcp eval import -h` describe those two.",
        epilog=_run_options(run_form),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    forms = p.add_subparsers(
        dest="form",
        required=True,
        prog="rlm-mcp eval",
        title="forms",
        metavar="TASKS.jsonl | generate | import",
        action=Forms,
        run_form=run_form,
    )
    generate_cli.configure(
        forms.add_parser("generate", help="write offline tasks", description=generate_cli.DESCRIPTION)
    )
    import_cli.configure(
        forms.add_parser("import", help="convert a benchmark file", description=import_cli.DESCRIPTION)
    )


def _run_options(run_form: argparse.ArgumentParser) -> str:
    """The run form's arguments and options, as its own help prints them (so they never drift)."""
    text = run_form.format_help()
    return f"rlm-mcp eval TASKS.jsonl: {_RUN_DESCRIPTION}\n\n" + text.split("\n\n", 2)[-1]


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlm-mcp eval TASKS.jsonl", description=_RUN_DESCRIPTION)
    p.add_argument("tasks", metavar="TASKS.jsonl", help="the task file (JSONL)")
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
    p.set_defaults(handler=lambda args, settings: _evaluate(Path(args.tasks), args, settings))
    return p


# The flags that are `EvalOptions` fields of the same name, taken as parsed (as `overrides_of`
# takes the run's): a new one is added here and to the parser.
_EVAL_FLAGS = ("parallel", "baseline", "judge_model", "judge_base_url", "keep_errors")


def _evaluate(task_file: Path, opts: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.cli.options import overrides_of
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
        overrides=overrides,
        **{name: getattr(opts, name) for name in _EVAL_FLAGS},
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
