"""Team mode while its database is unreachable: every MCP tool that needs the database answers a
tool error that names the database (user@host:port/db, never the password) and the fix, not an
internal error; once the database is back the same server answers again. In process, a front
(no sandbox: no Docker), its database made unreachable by PostgreSQL itself (connections refused
and the open ones dropped, as in an outage)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

import rlm_mcp.store.pg.db as pg_db
from rlm_mcp.server.app import build_server
from rlm_mcp.store.pg.db import describe
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.settings import make_settings
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_postgres import PASSWORD, Cluster
from tests.fixtures_surface import ANSWER_NOW, call

pytestmark = pytest.mark.anyio


@pytest.fixture
def lost_db(pg_cluster: Cluster) -> Iterator[str]:
    """A database of its own (it is made unreachable), dropped afterwards."""
    name = "t_outage_" + secrets.token_hex(4)
    pg_cluster.sql(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        pg_cluster.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_tool_calls_while_the_database_is_down_name_it_and_the_fix(
    tmp_path: Path, pg_cluster: Cluster, lost_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_db, "CONNECT_TIMEOUT_S", 2.0)  # how long a call waits for a connection
    url = pg_cluster.url(lost_db)
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm:
        settings = make_settings(tmp_path, base_url=lm.base_url, database_url=url, role="front")
        async with Client(build_server(settings)) as client:
            cid = (await call(client, "rlm_load_context", text="before the outage"))["context_id"]

            pg_cluster.sql(f"ALTER DATABASE {lost_db} WITH ALLOW_CONNECTIONS false")
            try:
                # With a timeout, it returns once each session has ended (its socket says so): a
                # call made now cannot still reach a session that is only about to end.
                pg_cluster.sql(
                    f"SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = '{lost_db}'"
                )
                calls = {
                    "rlm_list_contexts": {},
                    "rlm_load_context": {"text": "during the outage"},
                    "rlm_start": {"query": "q", "context_id": cid},
                    "rlm_status": {"run_id": "run_00000000000000000000"},
                    "rlm_delete_context": {"context_id": cid},
                }
                answers: dict[str, tuple[bool, str]] = {}

                async def ask(tool: str, args: dict[str, str]) -> None:
                    result = await client.call_tool(tool, args)
                    answers[tool] = (result.is_error, " ".join(getattr(c, "text", "") for c in result.content))

                async with anyio.create_task_group() as tg:  # at once: each waits for a connection
                    for tool, args in calls.items():
                        tg.start_soon(ask, tool, args)
            finally:
                pg_cluster.sql(f"ALTER DATABASE {lost_db} WITH ALLOW_CONNECTIONS true")

            for tool, (is_error, text) in answers.items():
                assert is_error, (tool, text)
                assert f"The database {describe(url)} is unreachable" in text, (tool, text)
                assert "RLM_MCP_DATABASE_URL" in text and "rlm-mcp doctor" in text, (tool, text)
                assert "Internal error" not in text and "Traceback" not in text, (tool, text)
                assert PASSWORD not in text, tool

            # Back: the same server answers again (its pool reconnects by itself, with a backoff),
            # and nothing was deleted.
            async def answers_again() -> bool:
                return not (await client.call_tool("rlm_list_contexts", {})).is_error

            await wait_until(answers_again, within_s=60, what="the server to reach its database again")
            listed = await call(client, "rlm_list_contexts")
            assert [c["context_id"] for c in listed["contexts"]] == [cid]
