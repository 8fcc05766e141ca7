"""Runs the reference library (`rlms` 0.1.3, local REPL) once, for bench/prefix.py.

Runs in the reference's own virtual environment, never in the project's:

    /tmp/rlms-venv/bin/python bench/reference/conversation.py BASE_URL CONTEXT_FILE [--compaction]

Prints one line: the run's outcome (its answer, or the exception that ended it).
"""

from __future__ import annotations

import contextlib
import io
import sys


def main() -> int:
    base_url, context_file = sys.argv[1:3]
    from rlm import RLM

    with open(context_file, encoding="utf-8") as fh:
        context = fh.read()
    rlm = RLM(
        backend="openai",
        backend_kwargs={"model_name": "rlm-v0.1", "base_url": base_url, "api_key": "unused"},
        environment="local",
        max_iterations=30,
        compaction="--compaction" in sys.argv,
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # stdout is this driver's answer channel
            result = rlm.completion(context, root_prompt="Walk through the context.")
        outcome = f"answer {result.response!r}"
    except Exception as exc:  # the figure is what happened, whatever it was
        outcome = f"ended by {type(exc).__name__}: {str(exc)[:200]}"
    print(outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
