"""The health route `GET /healthz` (rlm_mcp/server/health.py): unauthenticated, tiny, cheap.

The route's own rules run against the ASGI app in process (a readiness check that succeeds,
fails, raises; many callers sharing one check; a worker-only app); the real `rlm-mcp serve`
process answers it without a token while /mcp still asks for one, and in team mode turns 503
while its PostgreSQL is down and 200 again once it is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import httpx
import pytest

from rlm_mcp import __version__
from rlm_mcp.server.health import Readiness, health_app, health_endpoint, with_health
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.fixtures_postgres import PASSWORD, Cluster

pytestmark = pytest.mark.anyio

TOKEN = "health-test-token"


def _client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica")  # type: ignore[arg-type]


async def _ready() -> Readiness:
    return Readiness(ready=True)


async def test_a_ready_process_answers_200_with_only_status_version_and_role() -> None:
    async with _client(health_app(_ready, role="worker")) as client:
        response = await client.get("/healthz")
        assert response.status_code == 200
        assert response.json() == {"status": "ok", "version": __version__, "role": "worker"}
        assert response.headers["cache-control"] == "no-store"
        head = await client.head("/healthz")
        assert head.status_code == 200 and head.content == b""
        assert (await client.post("/healthz")).status_code == 405
        # a worker-only process serves nothing else
        assert (await client.get("/mcp")).status_code == 404
        assert (await client.get("/healthz/x")).status_code == 404


async def test_a_process_whose_database_is_unreachable_answers_503() -> None:
    async def down() -> Readiness:
        return Readiness(ready=False, database=False)

    async def broken() -> Readiness:
        raise RuntimeError("password=hunter2 host=db.internal")  # never shown to the caller

    async with _client(health_app(down)) as client:
        response = await client.get("/healthz")
        assert response.status_code == 503
        assert response.json() == {"status": "unavailable", "version": __version__, "database": "unreachable"}
    async with _client(health_app(broken)) as client:
        response = await client.get("/healthz")
        assert response.status_code == 503
        assert "hunter2" not in response.text and "db.internal" not in response.text


async def test_many_callers_share_one_check() -> None:
    calls = 0

    async def counted() -> Readiness:
        nonlocal calls
        calls += 1
        await anyio.lowlevel.checkpoint()
        return Readiness(ready=True, database=True)

    app = health_app(counted, cache_s=3600)  # (the default: one check per second at most)
    async with _client(app) as client:
        answers: list[int] = []

        async def probe() -> None:
            answers.append((await client.get("/healthz")).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(probe)
    assert answers == [200] * 20
    assert calls == 1


async def test_the_route_bypasses_only_itself() -> None:
    seen: list[str] = []

    async def guarded(scope: object, receive: object, send: object) -> None:
        seen.append(scope["path"])  # type: ignore[index]
        await send({"type": "http.response.start", "status": 401, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    app = with_health(guarded, health_endpoint(_ready))
    async with _client(app) as client:
        assert (await client.get("/healthz")).status_code == 200
        for path in ("/mcp", "/runs/", "/healthz/", "/HEALTHZ"):
            assert (await client.get(path)).status_code == 401
    assert seen == ["/mcp", "/runs/", "/healthz/", "/HEALTHZ"]


def _serve(port: int) -> list[str]:
    return [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]


@pytest.fixture
def embedded_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = cli_env(tmp_path, RLM_MCP_AUTH_TOKEN=TOKEN)
    with server_process(_serve(port), port=port, env=env):
        yield f"http://127.0.0.1:{port}"


def test_the_server_answers_health_without_a_token_and_still_guards_mcp(embedded_server: str) -> None:
    health = httpx.get(f"{embedded_server}/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "version": __version__}  # the embedded store: no database, no role
    # a balancer's probe names no host the replica knows: still answered
    assert httpx.get(f"{embedded_server}/healthz", headers={"host": "10.1.2.3:9999"}).status_code == 200
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    mcp = httpx.post(f"{embedded_server}/mcp", json=body, headers={"accept": "application/json, text/event-stream"})
    assert mcp.status_code == 401
    assert httpx.get(f"{embedded_server}/runs/api/runs").status_code == 401


def _health(base: str) -> httpx.Response | None:
    try:
        return httpx.get(f"{base}/healthz", timeout=10)
    except httpx.HTTPError:
        return None


def _status_is(base: str, status: int) -> bool:
    response = _health(base)
    return response is not None and response.status_code == status


async def test_team_mode_health_follows_the_database(tmp_path: Path, pg_cluster: Cluster, pg_url: str) -> None:
    port = free_port()
    env = cli_env(tmp_path, RLM_MCP_AUTH_TOKEN=TOKEN, RLM_MCP_DATABASE_URL=pg_url)
    base = f"http://127.0.0.1:{port}"
    with server_process(_serve(port), port=port, env=env):
        await wait_until(lambda: _status_is(base, 200), within_s=120, what="the replica to report healthy")
        up = _health(base)
        assert up is not None
        assert up.json() == {"status": "ok", "version": __version__, "role": "both", "database": "reachable"}
        pg_cluster.stop()
        try:
            await wait_until(lambda: _status_is(base, 503), within_s=120, what="503 while PostgreSQL is down")
            down = _health(base)
            assert down is not None and down.json()["database"] == "unreachable"
            assert PASSWORD not in down.text and "127.0.0.1" not in down.text
        finally:
            pg_cluster.start()
        await wait_until(lambda: _status_is(base, 200), within_s=120, what="200 again once PostgreSQL is back")


async def test_a_busy_pool_is_not_an_unreachable_database(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlm_mcp.store.pg import Database, lending

    monkeypatch.setattr(lending, "ANSWERED_S", 0.0)  # every ping asks (a recent answer would stand for it)
    db = Database(pg_url, replica=False, max_size=1)
    await db.open()
    try:
        assert await db.ping()
        async with db.connection() as conn:  # its one connection lent out, as under load
            assert await db.ping()  # busy, not down: the replica stays in its balancer
            await conn.execute("SELECT 1")
    finally:
        await db.close()
    assert not await db.ping()  # closed: nothing answers
