"""Loaders for the real benchmarks' public files (downloaded by the user; nothing is fetched here).

Each reads JSON (an array) or JSONL, writes one context file per distinct context under
`out_dir/contexts/` and returns tasks in our format (docs/evaluation.md):

- OOLONG (`oolongbench/oolong-synth`, split test): rows with `id`, `context_window_id`,
  `dataset`, `context_window_text`, `question`, `answer` (a Python literal list such as
  "['location']", "[12]" or "[datetime.date(2023, 1, 2)]"), `answer_type`, `context_len`.
  Filtered to `dataset` (trec_coarse) and `context_len`.
- OOLONG-Pairs (`mit-oasys/oolong-pairs`): rows with a question (`question` or `query`), a
  context (`context_window_text` or `context`) and the gold pairs (`answer`: a list of pairs or
  text of `(a, b)` lines). The key names accepted are listed in `_PAIRS_KEYS`.
- LongBench-v2 (`THUDM/LongBench-v2` data.json): `_id`, `domain`, `question`, `choice_A..D`,
  `answer` (a letter), `context`; filtered to the Code Repository Understanding domain.
- BrowseComp-Plus (`Tevatron/browsecomp-plus` queries, decrypted): `query_id`, `query`,
  `answer`, and documents in `gold_docs` / `evidence_docs` / `negative_docs` (each `{docid,
  text}`, or bare docids resolved through a corpus file of `{docid, text}` rows); the context is
  the first k documents, positives first, in a seeded shuffle.
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Iterable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

from rlm_mcp.errors import BadArgumentError
from rlm_mcp.eval.tasks import Task

LONGBENCH_CODE_DOMAIN = "Code Repository Understanding"
_PAIRS_KEYS = {
    "query": ("question", "query"),
    "context": ("context_window_text", "context", "context_text"),
    "id": ("id", "query_id", "_id"),
}


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSON array or a JSONL file (one object per line)."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
        yield from (r for r in rows if isinstance(r, dict))
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise BadArgumentError(
                    f"{path}:{number}: not JSON ({exc}).", "Give a JSON array or JSONL file."
                ) from exc


def _write_context(out_dir: Path, name: str, text: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    path = out_dir / "contexts" / f"{safe}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return f"contexts/{safe}.txt"


def _first(row: dict[str, Any], keys: Iterable[str]) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


# --- OOLONG --------------------------------------------------------------------------------------

_DATE_LITERAL = re.compile(r"datetime\.date\((\d+),\s*(\d+),\s*(\d+)\)")


def oolong_gold(raw: Any) -> str | int:
    """OOLONG's answer literal as a value: the first element; dates as ISO text."""
    if not isinstance(raw, str):
        first = raw[0] if isinstance(raw, list) and raw else raw
        return first if isinstance(first, int) else str(first)
    if m := _DATE_LITERAL.search(raw):
        return date(int(m[1]), int(m[2]), int(m[3])).isoformat()
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw.strip().strip("[]").strip("'\"")
    value = value[0] if isinstance(value, list | tuple) and value else value
    return value if isinstance(value, int) else str(value)


def load_oolong(
    src: Path, out_dir: Path, *, dataset: str = "trec_coarse", context_len: int | None = 131072, n: int | None = 50
) -> list[Task]:
    tasks: list[Task] = []
    for row in read_rows(src):
        if row.get("dataset") != dataset or (context_len and row.get("context_len") != context_len):
            continue
        path = _write_context(out_dir, f"oolong-{dataset}-{row['context_window_id']}", row["context_window_text"])
        meta: dict[str, Any] = {
            k: row[k] for k in ("answer_type", "task", "task_group", "context_len", "context_window_id") if k in row
        }
        tasks.append(
            Task(
                id=str(row["id"]),
                query=row["question"],
                context_path=path,
                answer=oolong_gold(row["answer"]),
                scorer="oolong",
                metadata={"benchmark": "oolong", **meta},
            )
        )
        if n and len(tasks) >= n:
            break
    return tasks


def load_oolong_pairs(src: Path, out_dir: Path, *, n: int | None = 20) -> list[Task]:
    tasks: list[Task] = []
    for i, row in enumerate(read_rows(src)):
        query, context = _first(row, _PAIRS_KEYS["query"]), _first(row, _PAIRS_KEYS["context"])
        if query is None or context is None or row.get("answer") is None:
            raise BadArgumentError(
                f"{src}: row {i + 1} lacks a question, a context or an answer.",
                f"Each row needs one of {_PAIRS_KEYS['query']}, one of {_PAIRS_KEYS['context']} and answer.",
            )
        task_id = str(_first(row, _PAIRS_KEYS["id"]) or f"pairs-{i}")
        answer = row["answer"]
        if isinstance(answer, list):
            answer = [list(p) if isinstance(p, list | tuple) else p for p in answer]
        tasks.append(
            Task(
                id=task_id,
                query=query,
                context_path=_write_context(out_dir, f"pairs-{task_id}", context),
                answer=answer,
                scorer="pairs_f1",
                metadata={"benchmark": "oolong-pairs"},
            )
        )
        if n and len(tasks) >= n:
            break
    return tasks


# --- LongBench-v2 Code repo QA ---------------------------------------------------------------------


def longbench_query(row: dict[str, Any]) -> str:
    choices = "\n".join(f"({x}) {row[f'choice_{x}']}" for x in "ABCD")
    return (
        f"{row['question']}\n{choices}\nAnswer with the letter of the correct choice, as 'The correct answer is (X)'."
    )


def load_longbench_code(
    src: Path, out_dir: Path, *, domain: str = LONGBENCH_CODE_DOMAIN, n: int | None = 50
) -> list[Task]:
    tasks: list[Task] = []
    for row in read_rows(src):
        if row.get("domain") != domain:
            continue
        path = _write_context(out_dir, f"longbench-{row['_id']}", row["context"])
        meta: dict[str, Any] = {k: row[k] for k in ("sub_domain", "difficulty", "length") if k in row}
        tasks.append(
            Task(
                id=str(row["_id"]),
                query=longbench_query(row),
                context_path=path,
                answer=str(row["answer"]).strip(),
                scorer="choice",
                metadata={"benchmark": "longbench-v2", **meta},
            )
        )
        if n and len(tasks) >= n:
            break
    return tasks


# --- BrowseComp-Plus ----------------------------------------------------------------------------------


def _docs(value: Any, corpus: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for doc in value or []:
        if isinstance(doc, dict):
            docid = str(doc.get("docid"))
            found.append((docid, str(doc.get("text") or corpus.get(docid, ""))))
        else:
            found.append((str(doc), corpus.get(str(doc), "")))
    return [(d, t) for d, t in found if t]


def load_browsecomp_plus(
    src: Path, out_dir: Path, *, corpus_path: Path | None = None, k: int = 50, n: int | None = 150, seed: int = 0
) -> list[Task]:
    corpus = {str(r["docid"]): str(r.get("text", "")) for r in read_rows(corpus_path)} if corpus_path else {}
    tasks: list[Task] = []
    for row in read_rows(src):
        qid = str(row["query_id"])
        rng = random.Random(f"{seed}-{qid}")
        positives: dict[str, str] = {}
        for key in ("gold_docs", "evidence_docs"):
            positives.update(_docs(row.get(key), corpus))
        negatives = [d for d in _docs(row.get("negative_docs"), corpus) if d[0] not in positives]
        rng.shuffle(negatives)
        chosen = (list(positives.items()) + negatives)[:k]
        rng.shuffle(chosen)
        text = "".join(f"Document {docid}:\n{body}\n\n" for docid, body in chosen)
        tasks.append(
            Task(
                id=qid,
                query=row["query"],
                context_path=_write_context(out_dir, f"browsecomp-{qid}", text),
                answer=str(row["answer"]),
                scorer="judge",
                metadata={
                    "benchmark": "browsecomp-plus",
                    "documents": len(chosen),
                    "positives": min(len(positives), k),
                },
            )
        )
        if n and len(tasks) >= n:
            break
    return tasks
