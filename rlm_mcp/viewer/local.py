"""`rlm-mcp runs view`: open the viewer.

- `--url http://host:port` (a running `rlm-mcp serve --transport http`): ask it for a one-time
  login link with the bearer token (RLM_MCP_AUTH_TOKEN) and print/open that link; the token
  itself never goes into a URL.
- `--output FILE`: write a self-contained static page (a run, or the index) and open it.
- neither (a stdio user): serve the live viewer for this data dir on a loopback port, behind a
  random per-process token, and print/open a one-time login link; Ctrl-C stops it.
"""

from __future__ import annotations

import html
import os
import secrets
import socket
import ssl
import sys
import tempfile
import webbrowser
from pathlib import Path

import anyio
import httpx
import uvicorn

from rlm_mcp.access import HostPolicy
from rlm_mcp.errors import AccessDeniedError, BadArgumentError, NotFoundError
from rlm_mcp.owners import EVERY_OWNER
from rlm_mcp.store.bundle import Stores
from rlm_mcp.store.runs import check_run_id
from rlm_mcp.viewer import render_index_html, render_run_html, render_session_html
from rlm_mcp.viewer.auth import ViewerAuth
from rlm_mcp.viewer.chain import is_session_id, session_runs
from rlm_mcp.viewer.routes import PREFIX, build_viewer


def _say(line: str) -> None:
    print(line, flush=True)


def _open(target: str, open_browser: bool) -> None:
    if open_browser:
        webbrowser.open(_private_page(target) if "code=" in target else target)


def _private_page(link: str) -> str:
    """A file only this user can read that sends the browser to `link`: a
    browser's command line is readable by every local user (/proc/PID/cmdline), and a one-time
    login code there could be spent by one of them first."""
    folder = Path(tempfile.mkdtemp(prefix="rlm-mcp-view-"))  # 0700
    page = folder / "login.html"
    fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    quoted = html.escape(link, quote=True)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(
            f"<!doctype html><meta charset='utf-8'><meta name='referrer' content='no-referrer'>"
            f"<meta http-equiv='refresh' content='0; url={quoted}'><title>rlm-mcp</title>"
            f"<p><a href='{quoted}'>Open the run viewer</a></p>"
        )
    return page.as_uri()


def _with_run(path: str, run_id: str | None) -> str:
    return f"{path}&run={run_id}" if run_id else path


async def view(
    stores: Stores,
    run_id: str | None,
    *,
    url: str | None,
    output: str | None,
    open_browser: bool,
    max_records: int,
    auth_token: str | None,
) -> int:
    """`stores` (not opened yet: only a page written or served here opens them); `max_records`:
    RLM_MCP_RUN_MAX_RECORDS, the runs a session's page looks through; `auth_token`: what a
    server's login-link route wants (RLM_MCP_AUTH_TOKEN)."""
    if run_id is not None:
        check_run_id(run_id)
    if output:
        return await _write(stores, max_records, run_id, Path(output), open_browser)
    if url:
        return await _link_from_server(auth_token, url.rstrip("/"), run_id, open_browser)
    return await _serve_local(stores, run_id, open_browser)


async def _write(stores: Stores, max_records: int, run_id: str | None, output: Path, open_browser: bool) -> int:
    async with stores:
        records = stores.runs
        if run_id and is_session_id(run_id):
            listed = await records.list(max_records, owner=EVERY_OWNER)
            if not session_runs(listed, run_id):
                raise NotFoundError(f"No run records of session {run_id}.", "List runs with `rlm-mcp runs list`.")
            page = render_session_html(run_id, listed)
        elif run_id:
            summary = await records.read_summary(run_id, owner=EVERY_OWNER)
            page = render_run_html(summary, await records.read_events(run_id, owner=EVERY_OWNER))
        else:
            page = render_index_html(await records.list(500, owner=EVERY_OWNER), run_href="")
    target = anyio.Path(output)
    await target.write_text(page, encoding="utf-8")
    _say(str(output))
    _open((await target.resolve()).as_uri(), open_browser)
    return 0


def _unreachable(url: str, exc: httpx.HTTPError) -> BadArgumentError:
    """Why `--url` could not be asked for a link: an untrusted certificate (a private CA, a
    self-signed balancer) has its own fix; anything else means nothing answered there."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return BadArgumentError(
            f"{url} answered, but its TLS certificate is not trusted here ({cause.verify_message or cause}).",
            "Name the CA that signed it: SSL_CERT_FILE=/path/to/ca.pem rlm-mcp runs view --url ... "
            "(or SSL_CERT_DIR for a folder of CA certificates).",
        )
    return BadArgumentError(
        f"Could not reach {url}: {exc}",
        "Check the address, and that an rlm-mcp server runs there (rlm-mcp serve --transport http).",
    )


async def _link_from_server(auth_token: str | None, url: str, run_id: str | None, open_browser: bool) -> int:
    headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
    async with httpx.AsyncClient(timeout=10.0) as client:
        try:
            response = await client.post(f"{url}{PREFIX}/api/login-link", headers=headers)
        except httpx.HTTPError as exc:
            raise _unreachable(url, exc) from None
    if response.status_code == 401:
        raise AccessDeniedError(
            f"{url} refused the token.", "Set RLM_MCP_AUTH_TOKEN to the token that server was started with."
        )
    response.raise_for_status()
    link = url + _with_run(str(response.json()["path"]), run_id)
    _say(link)
    _open(link, open_browser)
    return 0


async def _serve_local(stores: Stores, run_id: str | None, open_browser: bool) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        await stores.__aenter__()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        # A random token no one knows: only the one-time link below gets a browser in.
        auth = ViewerAuth(tokens=[secrets.token_urlsafe(32)], policy=HostPolicy("127.0.0.1", port, [], []))
        app = build_viewer(stores.runs, auth)
        link = f"http://127.0.0.1:{port}" + _with_run(f"{PREFIX}/login?code={auth.issue_code(EVERY_OWNER)}", run_id)
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        _say(link)
        print("Serving the run viewer on loopback; Ctrl-C stops it.", file=sys.stderr, flush=True)
        _open(link, open_browser)
        await server.serve(sockets=[sock])
    finally:
        sock.close()
        await stores.__aexit__(None, None, None)
    return 0
