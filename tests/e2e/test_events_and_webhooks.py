"""The event stream and a webhook end to end: the real HTTP server (uvicorn on loopback, tokens
from a tokens file with webhook options), the MCP client over streamable HTTP, real Docker
sandboxes, the scripted LM, and a real loopback receiver. Alice starts a run with a webhook_url
on her allow-list, follows its events with the page's `consume` until the end, and her receiver
gets the run's end once, signed with her secret (checked with the page's `verify`); Bob cannot
read Alice's stream, and his own request for a webhook is refused."""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

import httpx
import pytest

from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port
from rlm_mcp.testing.waiting import wait_until
from tests.doc_snippets import snippet
from tests.fixtures_e2e import cli, cli_env, stdio_client
from tests.fixtures_http import as_token, serving
from tests.fixtures_surface import SCRIPT, call, call_error, make_settings
from tests.fixtures_webhooks import Receiver, receiving

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

consume = snippet("events-and-webhooks.md", "consume")["consume"]
verify = snippet("events-and-webhooks.md", "verify")["verify"]


async def test_a_run_is_followed_to_its_end_and_its_end_is_delivered_signed(tmp_path: Path) -> None:
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    receiver = Receiver()
    async with receiving(receiver) as hook:
        tokens = tmp_path / "tokens"
        tokens.write_text(f"alice-token webhook_secret={secret} webhook_allow={hook}\nbob-token\n")
        with ScriptedLM(SCRIPT) as lm:
            settings = make_settings(
                tmp_path,
                lm.base_url,
                pool_size=0,
                host="127.0.0.1",
                port=free_port("127.0.0.1"),
                auth_tokens_file=tokens,
                allowed_url_addresses=["127.0.0.1"],
                webhook_poll_s=0.2,
                event_stream_poll_s=0.1,
            )
            async with (
                serving(settings) as url,
                as_token(url, "alice-token") as alice,
                as_token(url, "bob-token") as bob,
            ):
                context = (await call(alice, "rlm_load_context", text="alpha beta alpha gamma"))["context_id"]
                started = await call(alice, "rlm_start", query="FIRST-Q", context_id=context, webhook_url=hook)
                run_id = started["run_id"]
                stream = f"{url.removesuffix('/mcp')}/runs/api/runs/{run_id}/events"
                events = [m async for m in consume(stream, "alice-token")]
                kinds = [kind for _, kind, _ in events]
                assert kinds[0] == "run_start" and kinds[-2:] == ["run_end", "end"]
                assert {"turn", "cell", "llm_call"} <= set(kinds)
                assert events[-1][2] == {"run_id": run_id, "status": "completed"}
                ids = [i for i, _, _ in events]
                assert len(ids) == len(set(ids))
                # Bob: Alice's stream is unknown to him; a webhook of his own is refused.
                async with httpx.AsyncClient(timeout=30) as http:
                    theirs = await http.get(stream, headers={"Authorization": "Bearer bob-token"})
                assert theirs.status_code == 404 and theirs.json() == {"error": "Unknown run id."}
                assert "no webhook secret" in await call_error(
                    bob, "rlm_start", query="FIRST-Q", context_id=context, webhook_url=hook
                )
                await wait_until(lambda: receiver.seen, what="the run's end delivered to the receiver")
    (headers, body), *more = receiver.seen
    assert more == []
    assert headers["webhook-id"] == f"msg_{run_id}" and verify(secret, headers, body)
    assert json.loads(body)["data"] == {"run_id": run_id, "status": "completed"}


async def test_a_stdio_users_run_end_is_delivered_with_the_webhook_settings(tmp_path: Path) -> None:
    # stdio has no tokens file: the local user's grant comes from RLM_MCP_WEBHOOK_SECRET/_ALLOW.
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    receiver = Receiver()
    async with receiving(receiver) as hook:
        with ScriptedLM(SCRIPT) as lm:
            env = cli_env(
                tmp_path,
                RLM_MCP_BASE_URL=lm.base_url,
                RLM_MCP_WEBHOOK_SECRET=secret,
                RLM_MCP_WEBHOOK_ALLOW=hook,
                RLM_MCP_ALLOWED_URL_ADDRESSES="127.0.0.1",
                RLM_MCP_WEBHOOK_POLL_S="0.2",
            )
            async with stdio_client(env) as client:
                context = (await call(client, "rlm_load_context", text="alpha beta alpha gamma"))["context_id"]
                elsewhere = await call_error(
                    client, "rlm_start", query="FIRST-Q", context_id=context, webhook_url="https://else.example/x"
                )
                assert "not on your token's allow-list" in elsewhere and "RLM_MCP_WEBHOOK_ALLOW" in elsewhere
                done = await call(client, "rlm_complete", query="FIRST-Q", context_id=context, webhook_url=hook)
                assert done["status"] == "completed"
                await wait_until(lambda: receiver.seen, what="the run's end delivered to the receiver")
    (headers, body), *more = receiver.seen
    assert more == []
    assert headers["webhook-id"] == f"msg_{done['run_id']}" and verify(secret, headers, body)


def test_the_webhook_settings_refuse_to_start_half_set(tmp_path: Path) -> None:
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    for half, missing in (
        ({"RLM_MCP_WEBHOOK_SECRET": secret}, "RLM_MCP_WEBHOOK_ALLOW"),
        ({"RLM_MCP_WEBHOOK_ALLOW": "https://ci.example.com/hooks/"}, "RLM_MCP_WEBHOOK_SECRET"),
    ):
        done = cli(tmp_path, "serve", "--transport", "http", "--port", str(free_port()), **half)
        out = done.stdout + done.stderr
        assert done.returncode != 0 and "Traceback" not in out, out
        assert f"without {missing}" in out and "Fix RLM_MCP_WEBHOOK_SECRET / RLM_MCP_WEBHOOK_ALLOW" in out, out
        assert secret not in out
