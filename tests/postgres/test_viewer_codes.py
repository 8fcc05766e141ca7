"""A viewer login code is spent once: once per process in the embedded default, once across
every replica in team mode (`rlm_mcp.store.spent_codes`, `rlm_mcp.store.pg.spent_codes`).

The store's rule runs against both stores (two processes' worth of stores on one database racing
for one code); then real `rlm-mcp serve --transport http` processes: a code opened on replica A is
refused by replica B of the same database (and the other way round), and a single embedded server
takes a code once; a login while the database is unreachable is refused, saying so.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import anyio
import httpx
import pytest

from rlm_mcp.access import HostPolicy
from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.owners import EVERY_OWNER, Owner
from rlm_mcp.store import RunStore
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until
from rlm_mcp.viewer.auth import COOKIE, ViewerAuth
from rlm_mcp.viewer.routes import build_viewer
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.fixtures_store import run_record

pytestmark = pytest.mark.anyio

TOKEN = "viewer-codes-token"


async def test_a_code_is_spent_once_even_when_two_replicas_race_for_it(
    store_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    one = make_stores(store_settings(), replica=True)
    other = make_stores(store_settings(data_dir=tmp_path / "other"), replica=True)
    async with one, other:
        # Replicas share it in team mode; the embedded default is one process, whose stores hold it.
        ledgers = [one.spent_codes, other.spent_codes] if one.kind == "postgresql" else [one.spent_codes] * 2
        expires = time.time() + 60
        for n in range(5):
            wins: list[bool] = []

            async def spend(i: int, code: str, wins: list[bool] = wins) -> None:
                wins.append(await ledgers[i % 2].spend(code, expires))

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(spend, i, f"code-{n}")
            assert sorted(wins) == [False] * 7 + [True]
        assert await ledgers[1].spend("code-0", expires) is False
        assert await ledgers[0].spend("a fresh code", expires) is True


async def test_the_viewer_takes_a_code_once_in_both_of_its_modes() -> None:
    policy = HostPolicy("127.0.0.1", 1, [], [])
    for key in (None, b"k" * 32):  # random codes kept in memory; signed codes (team mode)
        auth = ViewerAuth(tokens=[TOKEN], policy=policy, key=key)
        code = auth.issue_code(Owner("alice"))
        session = await auth.redeem(code)
        assert session is not None and auth.session_owner(session) == "alice"
        assert await auth.redeem(code) is None
        assert await auth.redeem(code + "x") is None
        assert await auth.redeem("") is None


async def test_the_local_viewers_session_sees_every_owner_and_a_signed_code_names_one(tmp_path: Path) -> None:
    store = RunStore(make_settings(tmp_path).store)
    for i, owner in enumerate(["alice", "bob"]):
        log = await store.create(run_record(f"run_{i:012d}", {"query": "q", "status": "completed", "owner": owner}))
        await log.aclose()
    # As `rlm-mcp runs view` serves it: a random token, a code for every owner.
    auth = ViewerAuth(tokens=["nobody-knows"], policy=HostPolicy("127.0.0.1", 80, [], []))
    session = await auth.redeem(auth.issue_code(EVERY_OWNER))
    assert session is not None and auth.session_owner(session) is EVERY_OWNER
    transport = httpx.ASGITransport(app=build_viewer(store, auth))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", cookies={COOKIE: session}) as client:
        listed = await client.get("/runs/api/runs")
    assert listed.status_code == 200, listed.text
    assert len(listed.json()["data"]) == 2
    # Team mode signs one owner's codes: a signed code for every owner is refused outright.
    with pytest.raises(ValueError, match="one owner"):
        ViewerAuth(tokens=[TOKEN], policy=HostPolicy("127.0.0.1", 80, [], []), key=b"k" * 32).issue_code(EVERY_OWNER)


def _serve(port: int) -> list[str]:
    return [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]


def _replica(stack: ExitStack, root: Path, **env: str) -> str:
    root.mkdir()
    port = free_port()
    stack.enter_context(server_process(_serve(port), port=port, env=cli_env(root, RLM_MCP_AUTH_TOKEN=TOKEN, **env)))
    return f"http://127.0.0.1:{port}"


def _code_path(base: str) -> str:
    link = httpx.post(f"{base}/runs/api/login-link", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert link.status_code == 200, link.text
    return str(link.json()["path"])


def _open(base: str, path: str) -> httpx.Response:
    return httpx.get(base + path, follow_redirects=False, timeout=30)


def _index_status(base: str, cookie: str) -> int:
    return httpx.get(f"{base}/runs/api/runs", cookies={COOKIE: cookie}, timeout=30).status_code


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def two_replicas(tmp_path: Path, pg_url: str) -> Iterator[tuple[str, str]]:
    with ExitStack() as stack:
        yield (
            _replica(stack, tmp_path / "a", RLM_MCP_DATABASE_URL=pg_url),
            _replica(stack, tmp_path / "b", RLM_MCP_DATABASE_URL=pg_url),
        )


async def test_a_code_opened_on_one_replica_is_refused_by_another(two_replicas: tuple[str, str]) -> None:
    a, b = two_replicas
    for base in (a, b):
        await wait_until(functools.partial(_ready, base), within_s=120, what=f"replica {base} to be ready")
    for first, second in ((a, b), (b, a)):
        path = _code_path(first)
        opened = _open(first, path)
        assert opened.status_code == 303, opened.text
        cookie = opened.cookies.get(COOKIE)
        assert cookie
        refused = _open(second, path)
        assert refused.status_code == 401 and "already used" in refused.text
        assert refused.cookies.get(COOKIE) is None
        assert _open(first, path).status_code == 401
        # the session it opened is still good on both
        for base in (a, b):
            assert _index_status(base, cookie) == 200
    # a code asked of one replica and opened first on the other works there, once
    path = _code_path(a)
    assert _open(b, path).status_code == 303
    assert _open(a, path).status_code == 401


def test_a_single_embedded_server_takes_a_code_once(tmp_path: Path) -> None:
    with ExitStack() as stack:
        base = _replica(stack, tmp_path / "solo")
        path = _code_path(base)
        opened = _open(base, path)
        assert opened.status_code == 303 and opened.cookies.get(COOKIE)
        assert _open(base, path).status_code == 401
        assert _open(base, _code_path(base)).status_code == 303  # a new code works


async def test_a_login_while_the_database_is_unreachable_is_refused_saying_so(tmp_path: Path) -> None:
    from rlm_mcp.store.pg import Database
    from rlm_mcp.store.pg.spent_codes import PgSpentCodes

    # A pool never opened answers as an unreachable database does (DatabaseUnavailableError).
    db = Database(f"postgresql://rlm:hunter2-pw@127.0.0.1:{free_port()}/rlm", replica=False)
    auth = ViewerAuth(tokens=[TOKEN], policy=HostPolicy("127.0.0.1", 80, [], []), key=b"k" * 32, spent=PgSpentCodes(db))
    app = build_viewer(RunStore(make_settings(tmp_path).store), auth)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        refused = await client.get("/runs/login", params={"code": auth.issue_code(Owner("alice"))})
    assert refused.status_code == 503 and "database is unreachable" in refused.text
    assert "set-cookie" not in refused.headers and "hunter2" not in refused.text
