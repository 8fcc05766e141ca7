"""Run the scripted LM in a subprocess: for tests whose server under test is itself a subprocess
(an MCP server over stdio) or that must not share the test's process."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlm_mcp.testing.script import Script


@contextmanager
def scripted_lm_process(
    script: Script | dict[str, Any] | str | Path | None = None,
    *,
    log_path: str | Path | None = None,
    port: int = 0,
    python: str | Path | None = None,
    cwd: str | Path | None = None,
) -> Iterator[str]:
    """Start `python -m rlm_mcp.testing.scripted_lm`, yield its base URL, stop it on exit.

    `script` may be a Script (its callables are not carried over), a dict, or a JSON file (given
    to the server as it is, unread here). Read the request log from `log_path` (JSON lines)
    after or during the run.

    `python`: another interpreter (another checkout's venv) runs its own scripted LM. Give it a
    `cwd` outside this checkout (`-m` imports from the working folder first) and the script as a
    file: an older `Script` may refuse the fields this one writes out.
    """
    with tempfile.TemporaryDirectory(prefix="scripted-lm-") as tmp:
        if isinstance(script, (str, Path)):
            script_file = Path(script)
        else:
            model = script if isinstance(script, Script) else Script.model_validate(script or {})
            script_file = Path(tmp) / "script.json"
            script_file.write_text(model.model_dump_json(), encoding="utf-8")
        argv = [
            str(python or sys.executable),
            "-m",
            "rlm_mcp.testing.scripted_lm",
            "--script",
            str(script_file),
            "--port",
            str(port),
        ]
        if log_path is not None:
            argv += ["--log", str(log_path)]
        # `with`: the stdout pipe is closed when the server is gone, not left to the collector.
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=cwd) as proc:
            try:
                assert proc.stdout is not None
                url = proc.stdout.readline().strip()
                if not url.startswith("http://"):
                    raise RuntimeError(f"scripted LM did not start (exit code {proc.poll()})")
                yield url
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The requests a subprocess server logged, in order."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
