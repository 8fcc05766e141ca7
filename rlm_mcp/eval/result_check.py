"""Is a line of results.jsonl a result a resumed eval may trust?

A resumed eval keeps each task's last result line and skips that task. A line that is not such
a result (a traceback pasted in, a torn write, NaN or Infinity, which Python's json accepts, a
score outside [0, 1], token counts that are not counts) must not be kept: it would skip a task
and poison the summary. `parse_result_line` returns the result or raises ValueError saying why.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

__all__ = ["parse_result_line"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a result may hold")


def _check(result: Any) -> None:
    scores = [("score", result.score), ("lenient_score", result.lenient_score)]
    for name, value in scores:
        if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"{name} {value!r} is not within [0, 1]")
    if not (math.isfinite(result.duration_s) and result.duration_s >= 0):
        raise ValueError(f"duration_s {result.duration_s!r} is not a duration")
    if result.sub_calls < 0 or result.iterations < 0:
        raise ValueError("negative counts")
    total = result.usage.total
    for key in ("prompt_tokens", "completion_tokens"):
        value = getattr(total, key)
        if value < 0:
            raise ValueError(f"usage.total.{key} {value!r} is not a token count")


M = TypeVar("M", bound=BaseModel)


def parse_result_line(line: str, model: type[M]) -> M:
    """The result on this line as `model` (results.TaskResult), checked; ValueError naming what is
    wrong otherwise."""
    try:
        data = json.loads(line, parse_constant=_no_constant)
        result = model.model_validate(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    except ValidationError as exc:
        raise ValueError(f"not a result ({exc.error_count()} field errors)") from None
    _check(result)
    return result
