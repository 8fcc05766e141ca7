"""Generators: deterministic by seed, and every answer right. An oracle solves each task from the
written context alone (parsing the text, not the generator's records) and must get full marks."""

from __future__ import annotations

import ast
import itertools
import re
from collections import Counter
from pathlib import Path

import pytest

from rlm_mcp.cli import main
from rlm_mcp.eval.codegen import generate_code
from rlm_mcp.eval.generators import generate_needle, generate_oolong, generate_pairs
from rlm_mcp.eval.scorers import score
from rlm_mcp.eval.tasks import Task, load_tasks


def context_of(task: Task, root: Path) -> Path:
    path = task.resolved_context_path(root / "tasks.jsonl")
    assert path is not None
    return path


def tree_text(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*.py"))}


def test_generation_is_deterministic_by_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_MCP_DATA_DIR", str(tmp_path / "data"))
    for seed_dir, seed in (("a", 3), ("b", 3), ("c", 4)):
        assert main(["eval", "generate", "suite", "--output", str(tmp_path / seed_dir), "--seed", str(seed)]) == 0
    a, b, c = (load_tasks(tmp_path / d / "tasks.jsonl") for d in "abc")
    assert a == b and a != c
    for task in a:
        pa, pb = context_of(task, tmp_path / "a"), context_of(task, tmp_path / "b")
        if pa.is_dir():
            assert tree_text(pa) == tree_text(pb)
        else:
            assert pa.read_bytes() == pb.read_bytes()


@pytest.mark.parametrize("size", [8_000, 100_000, 10_000_000])
def test_needle_oracle_and_size(tmp_path: Path, size: int) -> None:
    (task,) = generate_needle(tmp_path, seed=1, sizes=(size,))
    text = context_of(task, tmp_path).read_text()
    assert size * 0.95 <= len(text) <= size * 1.05
    project = re.search(r"project (\S+)\?", task.query)
    assert project is not None
    found = re.findall(rf"access code for project {re.escape(project[1])} is (\w+)\.", text)
    assert len(found) == 1
    assert score(task.scorer, found[0], task.answer) == 1.0


def oolong_oracle(task: Task, text: str) -> str:
    labels = Counter(line.rsplit("|| Label: ", 1)[1] for line in text.splitlines())
    q = task.query
    if m := re.search(r"How many records have the label '([^']+)'", q):
        return f"Answer: {labels[m[1]]}"
    if "most frequent" in q:
        return f"Answer: {labels.most_common()[0][0]}"
    if "least frequent" in q:
        return f"Answer: {labels.most_common()[-1][0]}"
    m = re.search(r"Is the label '([^']+)' .* as the label '([^']+)'", q)
    assert m is not None
    a, b = labels[m[1]], labels[m[2]]
    return "Answer: " + ("more common than" if a > b else "less common than" if a < b else "same frequency as")


def test_oolong_oracle(tmp_path: Path) -> None:
    tasks = generate_oolong(tmp_path, seed=2, records=200, n=8)
    kinds = Counter(t.metadata["question_kind"] for t in tasks)
    assert kinds == {"count": 2, "most": 2, "least": 2, "compare": 2}
    text = context_of(tasks[0], tmp_path).read_text()
    assert len(text.splitlines()) == 200
    counts = Counter(line.rsplit("|| Label: ", 1)[1] for line in text.splitlines())
    assert len(set(counts.values())) == len(counts)  # most/least frequent are unique
    for task in tasks:
        assert score("oolong", oolong_oracle(task, text), task.answer, task.metadata) == 1.0, task.query


def test_pairs_oracle(tmp_path: Path) -> None:
    for task in generate_pairs(tmp_path, seed=5, users=30, n=2):
        rows = [
            re.match(r"User (\d+) \|\| city: (\w+) \|\| team: (\w+)", line).groups()  # type: ignore[union-attr]
            for line in context_of(task, tmp_path).read_text().splitlines()
        ]
        pairs = [(a[0], b[0]) for a, b in itertools.combinations(rows, 2) if a[1:] == b[1:]]
        assert pairs, "a task with no pairs would test nothing"
        assert score("pairs_f1", "\n".join(f"({a}, {b})" for a, b in pairs), task.answer) == 1.0


def code_oracle(task: Task, repo: Path) -> str:
    """Parse the repository with `ast` and follow calls to answer."""
    defs: dict[str, tuple[str, ast.FunctionDef]] = {}
    for path in repo.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                defs[node.name] = (str(path.relative_to(repo)), node)

    def run(name: str, x: int) -> int:
        ret = defs[name][1].body[0]
        assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.BinOp)
        const = ast.literal_eval(ret.value.left)
        inner = ret.value.right
        return const * (run(inner.func.id, x) if isinstance(inner, ast.Call) else x)  # type: ignore[attr-defined]

    options = dict(re.findall(r"^\(([A-D])\) (.+)$", task.query, re.MULTILINE))
    if m := re.search(r"defines the function `(\w+)`", task.query):
        right = defs[m[1]][0]
    else:
        m = re.search(r"`(\w+)\((\d+)\)` return", task.query)
        assert m is not None
        right = str(run(m[1], int(m[2])))
    (letter,) = [k for k, v in options.items() if v == right]
    return f"The correct answer is ({letter})"


def test_code_oracle(tmp_path: Path) -> None:
    tasks = generate_code(tmp_path, seed=7, n=6)
    assert {t.answer for t in tasks} <= set("ABCD")
    for task in tasks:
        assert score("choice", code_oracle(task, context_of(task, tmp_path)), task.answer) == 1.0, task.query
