"""The summary: mean score x100 with a 95% bootstrap interval, status counts, tokens, time.

The interval is a percentile bootstrap: 2,000 resamples of the per-task scores (with
replacement, seeded, so the same scores always give the same interval), the 2.5th and 97.5th
percentiles of the resampled means. Tasks that ended without an answer or in an error score 0
and count in every mean.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlm_mcp.eval.results import TaskResult

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def bootstrap_interval(
    scores: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of the mean (both ends equal the mean when n < 2)."""
    n = len(scores)
    if n == 0:
        return 0.0, 0.0
    if n == 1 or len(set(scores)) == 1:
        return scores[0], scores[0]
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(scores, k=n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]


@dataclass
class Summary:
    label: str
    n: int
    mean: float
    low: float
    high: float
    lenient_mean: float | None
    statuses: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # USD by the price table (RLM_MCP_MODEL_PRICES) of the tasks' priced calls; None: none priced.
    cost_usd: float | None = None
    task_seconds: float = 0.0
    by_scorer: dict[str, tuple[int, float]] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)  # cause -> task ids that ended with it


def summarize(label: str, results: Sequence[TaskResult]) -> Summary:
    scores = [r.score for r in results]
    n = len(scores)
    mean = sum(scores) / n if n else 0.0
    low, high = bootstrap_interval(scores)
    lenient = [r.lenient_score if r.lenient_score is not None else r.score for r in results]
    has_lenient = any(r.lenient_score is not None for r in results)
    summary = Summary(label, n, mean, low, high, (sum(lenient) / n) if has_lenient and n else None)
    for r in results:
        summary.statuses[r.status] += 1
        summary.prompt_tokens += r.usage.total.prompt_tokens
        summary.completion_tokens += r.usage.total.completion_tokens
        if r.usage.total.cost_usd is not None:
            summary.cost_usd = (summary.cost_usd or 0.0) + r.usage.total.cost_usd
        summary.task_seconds += r.duration_s
        if r.status == "error":
            summary.errors.setdefault(_one_line(r.error or "no reason recorded"), []).append(r.id)
    for scorer in sorted({r.scorer for r in results}):
        picked = [r.score for r in results if r.scorer == scorer]
        summary.by_scorer[scorer] = (len(picked), sum(picked) / len(picked))
    return summary


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _error_lines(summaries: Sequence[Summary]) -> list[str]:
    """Why tasks ended in error: each distinct cause once, with how many tasks and which."""
    if not any(s.errors for s in summaries):
        return []
    lines = ["", "| system | tasks in error | cause (first tasks) |", "|---|---:|---|"]
    for s in summaries:
        for cause, ids in sorted(s.errors.items(), key=lambda item: -len(item[1])):
            shown = ", ".join(ids[:3]) + (", …" if len(ids) > 3 else "")
            lines.append(f"| {s.label} | {len(ids)} | {cause} ({shown}) |")
    return lines


def _cost(usd: float | None) -> str:
    """The cost column: "–" when no call had a price (never a guessed one)."""
    return "–" if usd is None else f"{usd:.4f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def render_markdown(summaries: Sequence[Summary], *, wall_s: float, title: str) -> str:
    """The summary as Markdown: one row per system (RLM, baseline), then per-scorer means."""
    lines = [
        f"# {title}",
        "",
        "| system | tasks | mean ×100 | 95% CI | lenient ×100 | statuses | prompt tokens | "
        "completion tokens | cost (USD) | task time (s) |",
        "|---|---:|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for s in summaries:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))
        lenient = _pct(s.lenient_mean) if s.lenient_mean is not None else "–"
        lines.append(
            f"| {s.label} | {s.n} | {_pct(s.mean)} | {_pct(s.low)}–{_pct(s.high)} | {lenient} | {statuses} | "
            f"{s.prompt_tokens:,} | {s.completion_tokens:,} | {_cost(s.cost_usd)} | {s.task_seconds:.1f} |"
        )
    if any(len(s.by_scorer) > 1 for s in summaries):
        lines += ["", "| system | scorer | tasks | mean ×100 |", "|---|---|---:|---:|"]
        for s in summaries:
            for scorer, (count, mean) in s.by_scorer.items():
                lines.append(f"| {s.label} | {scorer} | {count} | {_pct(mean)} |")
    lines += _error_lines(summaries)
    lines += [
        "",
        f"Wall time of this invocation: {wall_s:.1f} s. Mean over every task; tasks without an answer or "
        "ending in an error score 0. CI: 95% percentile bootstrap, 2,000 seeded resamples. "
        "Lenient: the reference training environment's OOLONG reward (case-insensitive, gold anywhere in the "
        "answer); other scorers count as themselves.",
        "",
    ]
    return "\n".join(lines)
