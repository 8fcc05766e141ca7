"""What a person at a shell sees when a setting is slightly wrong or the command is not what they
thought: one line naming the cause and the fix, never a traceback or a silent wait. The real
console script in a subprocess; Docker is pointed at a socket that does not exist, so no test
here reaches a sandbox."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
from pathlib import Path

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env

NO_DOCKER = "unix:///nonexistent/docker.sock"


def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SERVER_SCRIPT), *args],
        env=cli_env(tmp_path, DOCKER_HOST=NO_DOCKER, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_base_url_without_its_scheme_is_a_configuration_error_with_the_fix(tmp_path: Path) -> None:
    done = _cli(tmp_path, "doctor", RLM_MCP_BASE_URL="localhost:8000/v1")
    assert done.returncode == 2
    assert "RLM_MCP_BASE_URL='localhost:8000/v1'" in done.stderr
    assert "write it in full, e.g. http://localhost:8000/v1" in done.stderr
    assert "unreachable" not in done.stderr + done.stdout


def test_doctor_says_a_base_url_without_v1_lists_no_models_and_how_to_fix_it(tmp_path: Path) -> None:
    with ScriptedLM(Script()) as lm:
        root = lm.base_url.removesuffix("/v1")
        done = _cli(tmp_path, "doctor", RLM_MCP_BASE_URL=root)
    assert done.returncode == 1
    model_line = next(line for line in done.stdout.splitlines() if " model " in line)
    assert model_line.startswith("FAIL") and "lists no models" in model_line, done.stdout
    assert f"set RLM_MCP_BASE_URL={root}/v1" in done.stdout
    assert "served" not in done.stdout


def test_an_http_port_in_use_is_one_line_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _cli(tmp_path, "serve", "--transport", "http", "--port", str(port))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"rlm-mcp: Port {port} on 127.0.0.1 is already in use (another rlm-mcp or another server listens there). "
        f"Stop that process (`ss -ltnp 'sport = :{port}'` names it), or choose another with --port N or RLM_MCP_PORT."
    ]


def test_stdio_on_a_terminal_says_what_it_waits_for_and_how_to_try_it(tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    server = subprocess.Popen(
        [str(SERVER_SCRIPT)],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(tmp_path, DOCKER_HOST=NO_DOCKER),
    )
    os.close(terminal)
    try:
        assert server.stderr is not None
        # A generous deadline, so that a server which says nothing fails instead of hanging.
        ready, _, _ = select.select([server.stderr], [], [], 120)
        assert ready, "nothing on stderr: the server waits silently"
        first = server.stderr.readline().decode()
        assert "waiting for an MCP client to speak on stdin" in first
        rest = b"".join(server.stderr.readline() for _ in range(5)).decode()
        assert "rlm-mcp doctor" in rest and "npx @modelcontextprotocol/inspector rlm-mcp" in rest
    finally:
        server.terminate()
        server.communicate(timeout=60)
        os.close(controller)


def test_stdio_from_a_client_stays_silent(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SERVER_SCRIPT)],
        input="",
        env=cli_env(tmp_path, DOCKER_HOST=NO_DOCKER, RLM_MCP_LOG_LEVEL="WARNING"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout == "" and "waiting for an MCP client" not in done.stderr


def test_a_team_role_without_a_database_is_one_line_with_the_fix(tmp_path: Path) -> None:
    for role in ("front", "worker"):
        done = _cli(tmp_path, "serve", "--role", role)
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert f"--role {role} needs team mode" in done.stderr and "RLM_MCP_DATABASE_URL" in done.stderr
    refused = _cli(tmp_path, "serve", RLM_MCP_ROLE="neither")
    assert refused.returncode == 2 and "RLM_MCP_ROLE" in refused.stderr
