"""`rlm-mcp eval generate KIND --output DIR`: write DIR/tasks.jsonl and DIR/contexts/."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from rlm_mcp.eval.codegen import generate_code
from rlm_mcp.eval.generators import NEEDLE_SIZES, generate_needle, generate_oolong, generate_pairs
from rlm_mcp.eval.tasks import Task, write_tasks


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated character counts, e.g. 8000,100000") from exc


DESCRIPTION = "Generate offline tasks (deterministic)."


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of `rlm-mcp eval generate`, and its handler, on `p`."""
    p.add_argument(
        "kind",
        choices=["needle", "oolong", "pairs", "code", "suite"],
        help="suite: a small mix of all four (a quick check of a model)",
    )
    p.add_argument("--output", "-o", required=True, help="folder for tasks.jsonl and contexts/")
    p.add_argument("--seed", type=int, default=0, help="the generator's seed: the same seed, the same tasks")
    p.add_argument("--n", type=int, help="questions (oolong, pairs, code)")
    p.add_argument(
        "--sizes", type=_sizes, help=f"needle sizes in characters (default {','.join(map(str, NEEDLE_SIZES))})"
    )
    p.add_argument("--records", type=int, default=300, help="oolong: labelled records")
    p.add_argument("--users", type=int, default=40, help="pairs: users")
    p.set_defaults(handler=lambda args, settings: _generate(args))
    return p


def generate(kind: str, out: Path, args: argparse.Namespace) -> list[Task]:
    n: Callable[[int], int] = lambda default: args.n if args.n is not None else default  # noqa: E731
    if kind == "needle":
        return generate_needle(out, seed=args.seed, sizes=args.sizes or NEEDLE_SIZES)
    if kind == "oolong":
        return generate_oolong(out, seed=args.seed, records=args.records, n=n(8))
    if kind == "pairs":
        return generate_pairs(out, seed=args.seed, users=args.users, n=n(2))
    if kind == "code":
        return generate_code(out, seed=args.seed, n=n(4))
    return [  # suite: small enough for a CPU model in minutes
        *generate_needle(out, seed=args.seed, sizes=args.sizes or (8_000, 32_000)),
        *generate_oolong(out, seed=args.seed, records=args.records, n=n(2)),
        *generate_pairs(out, seed=args.seed, users=args.users, n=1),
        *generate_code(out, seed=args.seed, n=n(2)),
    ]


def _generate(args: argparse.Namespace) -> int:
    out = Path(args.output)
    tasks = generate(args.kind, out, args)
    write_tasks(out / "tasks.jsonl", tasks)
    print(f"{len(tasks)} tasks -> {out / 'tasks.jsonl'}", file=sys.stderr)
    print(out / "tasks.jsonl")
    return 0
