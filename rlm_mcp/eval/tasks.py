"""The task file format (JSONL, one task per line) and its loading. Documented in docs/evaluation.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlm_mcp.errors import BadArgumentError

ScorerName = Literal["exact", "contains", "oolong", "pairs_f1", "choice", "judge"]


class Task(BaseModel):
    """One evaluation task. Exactly one of `context` (inline text) and `context_path` (a file or
    folder; relative to the task file)."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    context: str | None = None
    context_path: str | None = None
    answer: str | int | float | list[Any]
    scorer: ScorerName
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_context(self) -> Task:
        if (self.context is None) == (self.context_path is None):
            raise ValueError("give exactly one of `context` and `context_path`")
        return self

    def resolved_context_path(self, task_file: Path) -> Path | None:
        """The context's absolute path: a relative one is taken from the task file's folder
        (whatever the current directory and however the task file itself was named)."""
        if self.context_path is None:
            return None
        path = Path(self.context_path).expanduser()
        return (path if path.is_absolute() else task_file.parent / path).absolute()


def load_tasks(path: Path) -> list[Task]:
    """Every task of a JSONL file, in order; blank lines are skipped. Errors name the line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadArgumentError(f"Cannot read task file '{path}': {exc}.", "Check the path.") from exc
    tasks: list[Task] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            task = Task.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise BadArgumentError(
                f"{path}:{number}: not a valid task ({_first_error(exc)}).",
                "Each line is a JSON object with id, query, context or context_path, answer and scorer.",
            ) from exc
        if task.id in seen:
            raise BadArgumentError(f"{path}:{number}: duplicate task id {task.id!r}.", "Give every task its own id.")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise BadArgumentError(f"Task file '{path}' has no tasks.", "Write one JSON task per line.")
    return tasks


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))
    return str(exc)


def write_tasks(path: Path, tasks: list[Task]) -> None:
    """Write tasks as JSONL (what generators and loaders produce)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for task in tasks:
            out.write(json.dumps(task.model_dump(exclude_none=True), ensure_ascii=False) + "\n")
