"""Benchmark loaders on small hand-made files in the benchmarks' public formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlm_mcp.cli import main
from rlm_mcp.eval.loaders import load_browsecomp_plus, load_longbench_code, load_oolong, load_oolong_pairs, oolong_gold
from rlm_mcp.eval.scorers import score
from rlm_mcp.eval.tasks import load_tasks


def jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def oolong_row(
    i: int, answer: str, answer_type: str, *, dataset: str = "trec_coarse", length: int = 131072, window: int = 7
) -> dict[str, object]:
    return {
        "id": i,
        "context_window_id": window,
        "dataset": dataset,
        "context_len": length,
        "context_window_text": f"Date: Jan 01, 2023 || User: 1 || Instance: q{window}?",
        "question": f"question {i}",
        "answer": answer,
        "answer_type": answer_type,
        "task": "TASK_TYPE.X",
    }


def test_oolong_filters_parses_answers_and_shares_contexts(tmp_path: Path) -> None:
    src = jsonl(
        tmp_path / "oolong.jsonl",
        [
            oolong_row(1, "['location']", "ANSWER_TYPE.LABEL"),
            oolong_row(2, "[12]", "ANSWER_TYPE.NUMERIC"),
            oolong_row(3, "[datetime.date(2023, 1, 2)]", "ANSWER_TYPE.DATE"),
            oolong_row(4, "['x']", "ANSWER_TYPE.LABEL", dataset="spam"),
            oolong_row(5, "['x']", "ANSWER_TYPE.LABEL", length=32768),
        ],
    )
    tasks = load_oolong(src, tmp_path / "out")
    assert [t.id for t in tasks] == ["1", "2", "3"]
    assert [t.answer for t in tasks] == ["location", 12, "2023-01-02"]
    assert {t.context_path for t in tasks} == {"contexts/oolong-trec_coarse-7.txt"}  # one file per window
    assert (tmp_path / "out" / tasks[0].context_path).read_text().startswith("Date: Jan 01")  # type: ignore[operator]
    assert score("oolong", "Answer: 11", tasks[1].answer, tasks[1].metadata) == 0.75
    assert score("oolong", "Date: Jan 02, 2023", tasks[2].answer, tasks[2].metadata) == 1.0
    assert oolong_gold("['more common than']") == "more common than"


def test_oolong_pairs_accepts_pair_lists_and_text(tmp_path: Path) -> None:
    src = jsonl(
        tmp_path / "pairs.jsonl",
        [
            {"id": "p1", "question": "which pairs?", "context_window_text": "ctx", "answer": [[1, 2], [3, 4]]},
            {"query_id": "p2", "query": "which?", "context": "ctx2", "answer": "(5, 6)\n(7, 8)"},
        ],
    )
    tasks = load_oolong_pairs(src, tmp_path / "out")
    assert [t.id for t in tasks] == ["p1", "p2"]
    assert score("pairs_f1", "(2, 1)\n(4, 3)", tasks[0].answer) == 1.0
    assert score("pairs_f1", "(5, 6)", tasks[1].answer) == 2 * (1 * 0.5) / 1.5


def test_longbench_code_repo_qa(tmp_path: Path) -> None:
    rows = [
        {
            "_id": "lb1",
            "domain": "Code Repository Understanding",
            "sub_domain": "Code repo QA",
            "difficulty": "hard",
            "length": "long",
            "question": "What does f do?",
            "choice_A": "adds",
            "choice_B": "subtracts",
            "choice_C": "nothing",
            "choice_D": "loops",
            "answer": "B",
            "context": "def f(a, b): return a - b",
        },
        {
            "_id": "lb2",
            "domain": "Single-Document QA",
            "question": "?",
            "choice_A": "a",
            "choice_B": "b",
            "choice_C": "c",
            "choice_D": "d",
            "answer": "A",
            "context": "x",
        },
    ]
    src = tmp_path / "data.json"
    src.write_text(json.dumps(rows))  # LongBench-v2 ships one JSON array
    (task,) = load_longbench_code(src, tmp_path / "out")
    assert task.id == "lb1" and task.answer == "B" and task.scorer == "choice"
    assert "(B) subtracts" in task.query and task.metadata["difficulty"] == "hard"
    assert score("choice", "The correct answer is (B)", task.answer) == 1.0


def test_browsecomp_plus_takes_k_documents_positives_first(tmp_path: Path) -> None:
    corpus = jsonl(tmp_path / "corpus.jsonl", [{"docid": f"d{i}", "text": f"body {i}"} for i in range(100)])
    src = jsonl(
        tmp_path / "queries.jsonl",
        [
            {
                "query_id": "q1",
                "query": "Who?",
                "answer": "Ada",
                "gold_docs": [{"docid": "d1", "text": "gold body"}],
                "evidence_docs": ["d2", "d3"],
                "negative_docs": [f"d{i}" for i in range(4, 100)],
            }
        ],
    )
    (task,) = load_browsecomp_plus(src, tmp_path / "out", corpus_path=corpus, k=10)
    text = (tmp_path / "out" / task.context_path).read_text()  # type: ignore[operator]
    assert text.count("Document d") == 10
    for positive in ("Document d1:\ngold body", "Document d2:\nbody 2", "Document d3:\nbody 3"):
        assert positive in text
    assert task.scorer == "judge" and task.answer == "Ada" and task.metadata["positives"] == 3
    again = load_browsecomp_plus(src, tmp_path / "again", corpus_path=corpus, k=10)[0]
    assert (tmp_path / "again" / again.context_path).read_text() == text  # type: ignore[operator]


def test_import_command_writes_a_task_file_eval_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_MCP_DATA_DIR", str(tmp_path / "data"))
    src = jsonl(tmp_path / "oolong.jsonl", [oolong_row(i, "[3]", "ANSWER_TYPE.NUMERIC") for i in range(60)])
    assert main(["eval", "import", "oolong", str(src), "--output", str(tmp_path / "out")]) == 0
    tasks = load_tasks(tmp_path / "out" / "tasks.jsonl")
    assert len(tasks) == 50  # the card's n
    path = tasks[0].resolved_context_path(tmp_path / "out" / "tasks.jsonl")
    assert path is not None and path.is_file()
    assert main(["eval", "import", "oolong", str(src), "--output", str(tmp_path / "none"), "--dataset", "nope"]) == 1
