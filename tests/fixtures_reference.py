"""The pinned reference wheel (rlms 0.1.3), fetched once per machine for the tests that need it.

Fetching needs PyPI (CI reaches it: it installs the project from there). A test that needs the
wheel fails, never skips, when it cannot be had: the fidelity tests are the point of it.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.reference.wheel import fetch_wheel, wheel_path
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.parallel import shared_lock
from tests.paths import TESTS

CACHE = Path(os.environ.get("RLM_MCP_TEST_CACHE", Path.home() / ".cache" / "rlm-mcp-tests"))


@pytest.fixture(scope="session")
def reference_wheel() -> Path:
    try:
        with shared_lock(CACHE / "reference-wheel"):  # one download, not one per worker
            return fetch_wheel(CACHE)
    except Exception as exc:
        pytest.fail(f"the pinned reference wheel rlms 0.1.3 could not be fetched from PyPI: {exc}")


def seed_data_dir(data_dir: Path, wheel: Path) -> None:
    """Put the reference wheel where a server with this data dir finds it."""
    target = wheel_path(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(wheel, target)


# The reference itself, runnable: its own venv with only what RLM(environment="local") imports.
# `openai` is pinned as the reference's lock file pins it (3.x breaks its batched calls); the
# SDKs of other backends (anthropic, google-genai, portkey) are never imported on this path.
REFERENCE_REQUIREMENTS = ["openai==2.14.0", "python-dotenv==1.2.1", "rich==14.2.0"]


@pytest.fixture(scope="session")
def reference_python(reference_wheel: Path) -> Path:
    """A venv (cached per machine) with rlms 0.1.3; its python. Fails clearly if it cannot be built."""
    venv = CACHE / "rlms-0.1.3-venv"
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    if marker.is_file():
        return python
    with shared_lock(venv):  # another worker's `venv --clear` would wipe a venv being built
        if not marker.is_file():
            _build_reference_venv(venv, python, reference_wheel)
            marker.write_text("ok\n")
    return python


def _build_reference_venv(venv: Path, python: Path, reference_wheel: Path) -> None:
    import subprocess
    import sys

    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(reference_wheel)],
        [str(python), "-m", "pip", "install", "-q", *REFERENCE_REQUIREMENTS],
    ]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            pytest.fail(f"building the reference venv failed at {' '.join(step[-3:])}:\n{proc.stderr[-2000:]}")


# The reference run as the adapter card shows it, in the reference's venv (reference_python).
RUNNER = TESTS / "reference_runner.py"
MAX_ITERATIONS = 20  # the adapter card's and rlm-mcp's default


def repl(*blocks: str, prose: str = "Next step.") -> str:
    """A root reply: `prose`, then one ```repl block per code string."""
    return prose + "".join(f"\n```repl\n{code}\n```" for code in blocks)


def run_reference(python: Path, job: dict[str, Any]) -> dict[str, Any]:
    """Run `job` with the reference library itself (tests/reference_runner.py, in the reference's
    venv, in an empty directory): what it printed, {"answer": ...} or, for a session, {"answers": [...]}."""
    with tempfile.TemporaryDirectory() as cwd:  # no stray .env for the reference to load
        proc = subprocess.run(
            [str(python), str(RUNNER)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=300,
            check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": cwd},
        )
    assert proc.returncode == 0, f"the reference run failed:\n{proc.stderr[-3000:]}"
    return dict(json.loads(proc.stdout))


def load_args(context: Any) -> dict[str, Any]:
    """rlm_load_context's arguments for a case's context: a string as text, anything else as JSON."""
    return {"text": context} if isinstance(context, str) else {"text": json.dumps(context), "format": "json"}


def root_conversations(lm: ScriptedLM) -> list[list[dict[str, Any]]]:
    """The messages of every root request `lm` received, in order (roles and contents only)."""
    return [
        [{"role": m["role"], "content": m["content"]} for m in r["body"]["messages"]]
        for r in lm.requests_by_role("root")
    ]


def first_difference(expected: list[list[dict[str, Any]]], got: list[list[dict[str, Any]]]) -> str | None:
    """Where two runs' root conversations first differ, with a diff of that message; None if they match."""
    if len(expected) != len(got):
        return f"{len(expected)} root requests from the reference, {len(got)} from rlm-mcp"
    for turn, (want, have) in enumerate(zip(expected, got, strict=True), start=1):
        for index in range(max(len(want), len(have))):
            a = want[index] if index < len(want) else None
            b = have[index] if index < len(have) else None
            if a == b:
                continue
            diff = "\n".join(
                difflib.unified_diff(
                    json.dumps(a, indent=0).splitlines() if a is None else a["content"].splitlines(),
                    json.dumps(b, indent=0).splitlines() if b is None else b["content"].splitlines(),
                    "training (reference)",
                    "rlm-mcp canonical",
                    lineterm="",
                )
            )
            role = (a or b or {}).get("role")
            return f"root request {turn}, message {index} ({role}) differs:\n{diff}\n{a!r}\n{b!r}"
    return None
