"""`rlm-mcp eval import BENCHMARK FILE --output DIR`: a downloaded benchmark file as a task file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlm_mcp.eval.loaders import load_browsecomp_plus, load_longbench_code, load_oolong, load_oolong_pairs
from rlm_mcp.eval.tasks import Task, write_tasks

# The card's settings: OOLONG trec_coarse @132k n=50, OOLONG-Pairs n=20, BrowseComp-Plus n=150
# with k=50 documents, LongBench-v2 Code repo QA n=50.
DEFAULT_N = {"oolong": 50, "oolong-pairs": 20, "longbench-code": 50, "browsecomp-plus": 150}


DESCRIPTION = "Convert a downloaded benchmark file."


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of `rlm-mcp eval import`, and its handler, on `p`."""
    p.add_argument("benchmark", choices=sorted(DEFAULT_N), help="which benchmark the file comes from")
    p.add_argument("file", help="the benchmark's JSON or JSONL file")
    p.add_argument("--output", "-o", required=True, help="folder for tasks.jsonl and contexts/")
    p.add_argument("--n", type=int, help="tasks to take (default: the card's n; 0 = all)")
    p.add_argument("--context-len", type=int, default=131072, help="oolong: context_len to keep (0 = any)")
    p.add_argument("--dataset", default="trec_coarse", help="oolong: dataset to keep")
    p.add_argument("--corpus", help="browsecomp-plus: corpus file of {docid, text} rows")
    p.add_argument("--k", type=int, default=50, help="browsecomp-plus: documents per query")
    p.add_argument("--seed", type=int, default=0, help="browsecomp-plus: document order")
    p.set_defaults(handler=lambda args, settings: _import(args))
    return p


def load(args: argparse.Namespace, out: Path) -> list[Task]:
    src = Path(args.file)
    n = DEFAULT_N[args.benchmark] if args.n is None else (args.n or None)
    if args.benchmark == "oolong":
        return load_oolong(src, out, dataset=args.dataset, context_len=args.context_len or None, n=n)
    if args.benchmark == "oolong-pairs":
        return load_oolong_pairs(src, out, n=n)
    if args.benchmark == "longbench-code":
        return load_longbench_code(src, out, n=n)
    corpus = Path(args.corpus) if args.corpus else None
    return load_browsecomp_plus(src, out, corpus_path=corpus, k=args.k, n=n, seed=args.seed)


def _import(args: argparse.Namespace) -> int:
    out = Path(args.output)
    tasks = load(args, out)
    if not tasks:
        print(f"rlm-mcp eval import: no {args.benchmark} rows matched in {args.file}", file=sys.stderr)
        return 1
    write_tasks(out / "tasks.jsonl", tasks)
    print(f"{len(tasks)} tasks -> {out / 'tasks.jsonl'}", file=sys.stderr)
    print(out / "tasks.jsonl")
    return 0
