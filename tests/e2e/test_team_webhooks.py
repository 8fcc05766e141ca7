"""Team mode: a run's end reaches its webhook when the front that accepted the run is gone, and
its event stream is served by another replica. A front and a worker (real processes on one
PostgreSQL database), real Docker, the scripted LM, a loopback receiver: the run is started on
the front, which is killed (SIGKILL) while the worker runs the run's cell; the worker ends the
run, writes the outbox row through the run-end hook and its deliverer delivers it, once, signed;
a second front serves the run's whole event stream afterwards."""

from __future__ import annotations

import base64
import secrets
from contextlib import ExitStack
from pathlib import Path

import pytest

from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.waiting import wait_until
from tests.doc_snippets import snippet
from tests.fixtures_surface import ANSWER_NOW, call
from tests.fixtures_team import SHORT_LEASES, Replica, in_cell, replica_client, row, team_replica
from tests.fixtures_webhooks import Receiver, receiving

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

consume = snippet("events-and-webhooks.md", "consume")["consume"]
verify = snippet("events-and-webhooks.md", "verify")["verify"]
TOKEN = "team-hook-token"
# Long enough for the test to kill the front while it runs (the kill takes well under a second;
# the test sees the cell start within a poll of 20 ms).
SLOW = """```repl
import time
time.sleep(4)
```"""


async def test_a_run_end_is_delivered_when_its_front_is_gone(tmp_path: Path, pg_url: str) -> None:
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    receiver = Receiver()
    script = Script(root_by_query=[{"match": "HOOKED", "replies": [SLOW, ANSWER_NOW]}], root=[ANSWER_NOW])
    async with receiving(receiver) as hook:
        tokens = tmp_path / "tokens"
        tokens.write_text(f"{TOKEN} webhook_secret={secret} webhook_allow={hook}\n")
        env = {
            **SHORT_LEASES,
            "RLM_MCP_AUTH_TOKENS_FILE": str(tokens),
            "RLM_MCP_AUTH_TOKENS": "team-ops-token",  # the file's token is the test's (the file must add one)
            "RLM_MCP_ALLOWED_URL_ADDRESSES": "127.0.0.1",
            "RLM_MCP_WEBHOOK_POLL_S": "0.2",
        }
        with ScriptedLM(script) as lm, ExitStack() as stack:

            def start(name: str, role: str) -> Replica:
                return stack.enter_context(
                    team_replica(
                        tmp_path / name, role=role, database_url=pg_url, lm_url=lm.base_url, tokens=[TOKEN], env=env
                    )
                )

            front, _worker = start("front", "front"), start("worker", "worker")
            async with replica_client(front, TOKEN) as client:
                context = (await call(client, "rlm_load_context", text="alpha beta"))["context_id"]
                run_id = (await call(client, "rlm_start", query="HOOKED", context_id=context, webhook_url=hook))[
                    "run_id"
                ]
            await wait_until(lambda: in_cell(pg_url, run_id), within_s=120, what="the worker running the run's cell")
            front.proc.kill()
            front.proc.wait()
            assert row(pg_url, run_id)["done"] is False  # the run ends after its front is gone
            await wait_until(lambda: receiver.seen, within_s=120, what="the run's end delivered by the worker")
            other = start("front2", "front")
            events = [m async for m in consume(f"{other.base}/runs/api/runs/{run_id}/events", TOKEN)]
    assert [kind for _, kind, _ in events][-2:] == ["run_end", "end"]
    assert events[-1][2] == {"run_id": run_id, "status": "completed"}
    (headers, body), *more = receiver.seen
    assert more == [] and headers["webhook-id"] == f"msg_{run_id}" and verify(secret, headers, body)
