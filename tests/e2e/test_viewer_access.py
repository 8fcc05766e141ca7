"""The HTTP viewer's doors, without a browser: the bearer token, the Host and Origin checks, the
one-time login link and its cookie, and `rlm-mcp runs view` serving loopback behind such a link."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import anyio
import httpx

from rlm_mcp.testing.servers import close_pipes, free_port
from tests.fixtures_e2e import SERVER_SCRIPT
from tests.fixtures_http import TOKEN, server_env
from tests.fixtures_viewer import HOSTILE, recorded_run, start_http_server, team_env


def test_http_viewer_refuses_requests_without_the_token(tmp_path: Path, database_url: str | None) -> None:
    port = free_port()
    env = server_env(tmp_path, RLM_MCP_AUTH_TOKEN=TOKEN, **team_env(database_url))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with start_http_server(env, port) as base:
        for path in ("/runs/", "/runs/api/runs", "/runs/run_x", "/runs/api/runs/run_x"):
            assert httpx.get(base + path).status_code == 401, path
            assert httpx.get(base + path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
        assert httpx.get(base + "/runs/api/runs", headers=bearer).json()["data"] == []
        assert httpx.get(base + "/runs/api/runs/run_x", headers=bearer).status_code == 404
        # DNS rebinding and cross-site pages: the Host and Origin must be this server
        assert httpx.get(base + "/runs/api/runs", headers={**bearer, "Host": "evil.example:80"}).status_code == 403
        assert (
            httpx.get(base + "/runs/api/runs", headers={**bearer, "Origin": "http://evil.example"}).status_code == 403
        )
        # a session cookie can not mint login links; only the bearer token can
        assert httpx.post(base + "/runs/api/login-link").status_code == 401
        path = httpx.post(base + "/runs/api/login-link", headers=bearer).json()["path"]
        login = httpx.get(base + path, follow_redirects=False)
        home = login.headers["location"]  # /runs/s/<key>/: the cookie's path (issue 20 item 6)
        assert login.status_code == 303 and home.startswith("/runs/s/")
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and f"Path={home}" in cookie
        session = cookie.split(";", 1)[0]
        assert httpx.get(base + "/runs/api/runs", headers={"Cookie": session}).status_code == 200
        assert httpx.post(base + "/runs/api/login-link", headers={"Cookie": session}).status_code == 401
        # the cookie is no key to /mcp
        assert httpx.post(base + "/mcp", headers={"Cookie": session}, json={}).status_code == 401
        # `rlm-mcp runs view --url` prints a one-time link, never the token
        out = subprocess.run(
            [str(SERVER_SCRIPT), "runs", "view", "--url", base, "--no-open"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"{base}/runs/login?code=") and TOKEN not in out.stdout
        assert httpx.get(out.stdout.strip(), follow_redirects=False).status_code == 303


def test_runs_view_serves_loopback_behind_a_one_time_link(tmp_path: Path, database_url: str | None) -> None:
    recorded_run(tmp_path, database_url)
    env = server_env(tmp_path, **team_env(database_url))
    proc = subprocess.Popen(
        [str(SERVER_SCRIPT), "runs", "view", "run_viewer_1", "--no-open"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        link = proc.stdout.readline().strip()
        assert link.startswith("http://127.0.0.1:") and "/runs/login?code=" in link
        base = link.split("/runs/", 1)[0]
        deadline = time.monotonic() + 60
        while True:  # the link is printed just before the server accepts connections
            try:
                assert httpx.get(base + "/runs/").status_code == 401
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                anyio.run(anyio.sleep, 0.05)
        with httpx.Client(follow_redirects=True) as client:
            page = client.get(link)
            assert page.status_code == 200 and re.fullmatch(rf"{base}/runs/s/\w+/run_viewer_1", str(page.url))
            assert "rlm-data" in page.text and HOSTILE not in page.text  # only as JSON escapes
            home = str(page.url).removesuffix("run_viewer_1")  # the cookie is sent under this path only
            assert client.get(home + "api/runs").json()["data"][0]["run_id"] == "run_viewer_1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        close_pipes(proc)
