"""Issue 20 items 6 and 7: the viewer's session cookie is scoped to a path with a random part, so
another listener on 127.0.0.1 (another port, same host: cookies are not port-bound) never
receives it, and it lives an hour; a login link redeemed in a cross-site or same-site navigation
(a page on another local port) logs nobody in. A real uvicorn server on loopback, raw HTTP; the
cookie's path and a spent link over both stores (`database_url`: team mode signs codes and
sessions and derives the path from a key the replicas share)."""

from __future__ import annotations

from http.cookies import SimpleCookie
from pathlib import Path

import anyio
import httpx
import pytest

from rlm_mcp.viewer.auth import SESSION_TTL_S
from tests.fixtures_http import http_settings, serving

pytestmark = pytest.mark.anyio

TOKEN = "viewer-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def _link(client: httpx.AsyncClient, base: str) -> str:
    reply = await client.post(f"{base}/runs/api/login-link", headers=BEARER)
    return base + reply.json()["path"]


async def test_the_cookie_path_has_a_random_part_and_a_short_life(tmp_path: Path, database_url: str | None) -> None:
    settings = http_settings(tmp_path, "127.0.0.1", auth_token=TOKEN, database_url=database_url)
    async with serving(settings) as url, httpx.AsyncClient() as client:
        base = url.removesuffix("/mcp")
        login = await client.get(await _link(client, base))
        assert login.status_code == 303
        morsel = next(iter(SimpleCookie(login.headers["set-cookie"]).values()))
        path = morsel["path"]
        assert path.startswith("/runs/s/") and len(path) >= len("/runs/s/") + 16 + 1, path
        assert login.headers["location"] == path
        assert int(morsel["max-age"]) <= 3600 and SESSION_TTL_S <= 3600
        # The pages live under that path, and the cookie opens them there.
        session = {"Cookie": f"{morsel.key}={morsel.value}"}
        assert (await client.get(base + path, headers=session)).status_code == 200
        assert (await client.get(base + path + "api/runs", headers=session)).json()["data"] == []
        # The same path part for every login of this deployment (replicas share it).
        again = await client.get(await _link(client, base))
        assert next(iter(SimpleCookie(again.headers["set-cookie"]).values()))["path"] == path
        # The link was spent: opening it again logs nobody in (team mode: on any replica).
        spent = await client.get(login.request.url)
        assert spent.status_code == 401 and "set-cookie" not in spent.headers


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
async def test_a_login_link_from_another_site_logs_nobody_in(tmp_path: Path, site: str) -> None:
    settings = http_settings(tmp_path, "127.0.0.1", auth_token=TOKEN)
    async with serving(settings) as url, httpx.AsyncClient() as client:
        base = url.removesuffix("/mcp")
        link = await _link(client, base)
        refused = await client.get(link, headers={"Sec-Fetch-Site": site})
        assert refused.status_code == 403 and "set-cookie" not in refused.headers
        assert "address bar" in refused.text
        # Typed or pasted (no header, or "none"): it works.
        assert (await client.get(await _link(client, base), headers={"Sec-Fetch-Site": "none"})).status_code == 303
        assert (await client.get(await _link(client, base))).status_code == 303


async def test_runs_view_keeps_the_code_off_the_browser_command_line(tmp_path: Path) -> None:
    import os
    import stat
    import subprocess

    from tests.fixtures_e2e import SERVER_SCRIPT, cli_env

    seen = tmp_path / "browser-argv"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\n')
    browser.chmod(0o700)
    settings = http_settings(tmp_path, "127.0.0.1", auth_token=TOKEN)
    async with serving(settings) as url:
        base = url.removesuffix("/mcp")
        env = {**cli_env(tmp_path, RLM_MCP_AUTH_TOKEN=TOKEN), "BROWSER": str(browser)}
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [str(SERVER_SCRIPT), "runs", "view", "--url", base], env=env, capture_output=True, text=True, timeout=60
            )
        )
        assert done.returncode == 0, done.stderr
    argv = seen.read_text()  # what other local users could read in /proc/PID/cmdline
    assert "code=" not in argv, argv
    opened = Path(argv.strip().removeprefix("file://"))
    assert stat.S_IMODE(os.stat(opened).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(opened.parent).st_mode) & 0o077 == 0
    assert "/runs/login?code=" in await anyio.Path(opened).read_text()
