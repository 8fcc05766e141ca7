"""Webhooks (`service/webhooks/`), against both stores' outbox and a real loopback receiver.

The receiver verifies every request as a Standard Webhooks consumer would, with the standard
library only (`verify`, the snippet docs/events-and-webhooks.md shows). Covered: one outbox row
and one `webhook-id` per run end however many writers tell it; a 500 retried after the backoff,
with the same id and a fresh valid signature; a rotation's two signatures; a delivery made by
another process than the one that wrote the row (the accepting front is gone); two deliverers
never post one row at once; the allow-list and the address rules refuse what they must; the
manual redelivery and the retention.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import uvicorn

from rlm_mcp.access import owner_of_token, webhook_grants
from rlm_mcp.assembly import make_stores
from rlm_mcp.assembly.roles import webhooks
from rlm_mcp.config import Settings
from rlm_mcp.errors import AccessDeniedError, BadArgumentError
from rlm_mcp.owners import EVERY_OWNER, Owner
from rlm_mcp.ports.runs import RunEnded
from rlm_mcp.ports.webhooks import Attempt
from rlm_mcp.service.loaders.addresses import AddressPolicy, parse_networks
from rlm_mcp.service.run_ends import RunEnds
from rlm_mcp.service.webhooks.deliverer import Deliverer
from rlm_mcp.testing.servers import free_port
from tests.doc_snippets import snippet
from tests.fixtures_store import final
from tests.fixtures_webhooks import Receiver, receiving

pytestmark = pytest.mark.anyio

TOKEN, OTHER = "hook-token", "plain-token"
OWNER = owner_of_token(TOKEN)
OLD, NEW = secrets.token_bytes(32), secrets.token_bytes(32)


def whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


# -- the receiver's side: the page's snippet (docs/events-and-webhooks.md) -------------------------
verify = snippet("events-and-webhooks.md", "verify")["verify"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def configured(store_settings: Callable[..., Settings], tmp_path: Path, allow: str, **more: object) -> Settings:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"{TOKEN} webhook_secret={whsec(NEW)} webhook_secret={whsec(OLD)} webhook_allow={allow}\n{OTHER}\n"
    )
    return store_settings(auth_tokens_file=tokens, allowed_url_addresses="127.0.0.1", **more)


def ended(run_id: str, url: str | None) -> RunEnded:
    record = final(run_id)
    request = record.request.model_copy(update={"owner": Owner(OWNER), "webhook_url": url})
    return RunEnded.of(record.model_copy(update={"request": request}))


def deliverer(settings: Settings, stores: object, clock: Clock) -> Deliverer:
    outbox = stores.webhooks  # type: ignore[attr-defined]
    policy = AddressPolicy(listed=tuple(parse_networks(settings.loads.allowed_url_addresses)))
    return Deliverer(outbox, webhook_grants(settings.server), settings.events, policy, clock=clock)


async def test_a_run_end_is_delivered_once_signed_and_retried_after_a_500(
    store_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    receiver = Receiver(answers=[500])
    async with receiving(receiver) as url:
        settings = configured(store_settings, tmp_path, url.rsplit("/", 1)[0] + "/")
        accepting = make_stores(settings, replica=True)
        # Another process on the same store (a second replica; for SQLite, the same data dir).
        other = make_stores(settings, replica=True)
        async with accepting, other:
            hooks = webhooks(settings, accepting)
            assert hooks.check(Owner(OWNER), url) == url
            ends = RunEnds([hooks.on_run_end])
            told = ended("run_hook00000001", url)
            await ends.ended(told.record)
            await ends.ended(told.record)  # a second writer tells the same end: one row
            await ends.ended(ended("run_hook00000002", None).record)  # asked for no webhook
            rows = await accepting.webhooks.list(EVERY_OWNER, 10)  # type: ignore[union-attr]
            assert [(r.run_id, r.state, r.webhook_id) for r in rows] == [
                ("run_hook00000001", "pending", "msg_run_hook00000001")
            ]
            # The accepting process is gone; the other one's deliverers deliver (two racing: one posts).
            clock = Clock()
            first, second = deliverer(settings, other, clock), deliverer(settings, other, clock)
            counts: list[int] = []

            async def run(d: Deliverer) -> None:
                counts.append(await d.deliver_due())

            async with anyio.create_task_group() as tg:
                tg.start_soon(run, first)
                tg.start_soon(run, second)
            assert sorted(counts) == [0, 1] and len(receiver.seen) == 1
            (row,) = await other.webhooks.list(Owner(OWNER), 10)  # type: ignore[union-attr]
            assert (row.state, row.attempts, row.last_status, row.next_at) == ("pending", 1, 500, clock.now + 5)
            assert await first.deliver_due() == 0  # not due before its backoff
            clock.now += 5
            assert await first.deliver_due() == 1
            (row,) = await other.webhooks.list(Owner(OWNER), 10)  # type: ignore[union-attr]
            assert (row.state, row.attempts, row.last_status, row.delivered_at) == ("delivered", 2, 200, clock.now)
            assert await other.webhooks.list(Owner("someone-else"), 10) == []  # type: ignore[union-attr]
    assert len(receiver.seen) == 2
    for headers, body in receiver.seen:
        assert headers["webhook-id"] == "msg_run_hook00000001"
        assert verify(whsec(NEW), headers, body) and verify(whsec(OLD), headers, body)  # a rotation: both sign
        assert not verify(whsec(secrets.token_bytes(32)), headers, body)
        assert len(headers["webhook-signature"].split()) == 2
        payload = json.loads(body)
        assert payload["type"] == "run.ended" and payload["data"] == {
            "run_id": "run_hook00000001",
            "status": "completed",
        }
        assert headers["host"] == url.split("/")[2]


async def test_failures_back_off_then_fail_and_a_manual_redelivery_delivers(
    store_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    receiver = Receiver(answers=[500, 503, 302])  # a redirect is a failure: never followed
    async with receiving(receiver) as url:
        settings = configured(store_settings, tmp_path, url, webhook_max_attempts=3)
        stores = make_stores(settings, replica=True)
        async with stores:
            hooks = webhooks(settings, stores)
            await RunEnds([hooks.on_run_end]).ended(ended("run_hook00000003", url).record)
            clock = Clock()
            d = deliverer(settings, stores, clock)
            waits = []
            for _ in range(3):
                assert await d.deliver_due() == 1
                (row,) = await stores.webhooks.list(EVERY_OWNER, 10)  # type: ignore[union-attr]
                waits.append(row.next_at - clock.now)
                clock.now = row.next_at
            assert (row.state, row.attempts, row.last_status) == ("failed", 3, 302)
            assert waits[:2] == [5, 10]
            assert await d.deliver_due() == 0
            assert not await stores.webhooks.redeliver(row.webhook_id, Owner("someone-else"), clock.now)  # type: ignore[union-attr]
            assert await stores.webhooks.redeliver(row.webhook_id, Owner(OWNER), clock.now)  # type: ignore[union-attr]
            assert await d.deliver_due() == 1
            (row,) = await stores.webhooks.list(EVERY_OWNER, 10)  # type: ignore[union-attr]
            assert row.state == "delivered" and row.webhook_id == "msg_run_hook00000003"
            # The retention removes finished records created before the cut.
            assert await stores.webhooks.prune(row.created_at + 1) == 1  # type: ignore[union-attr]
            assert await stores.webhooks.list(EVERY_OWNER, 10) == []  # type: ignore[union-attr]
    assert len({h["webhook-id"] for h, _ in receiver.seen}) == 1 and len(receiver.seen) == 4


async def test_callbacks_off_the_allow_list_or_the_address_rules_are_refused(
    store_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    receiver = Receiver()
    async with receiving(receiver) as url:
        base = url.rsplit("/", 1)[0]
        settings = configured(store_settings, tmp_path, f"{base}/hooks")
        stores = make_stores(settings, replica=True)
        async with stores:
            hooks = webhooks(settings, stores)
            for refused in (
                f"{base}/other",
                f"{base}/hooksmith",
                "https://example.com/hooks",
                f"{base}.evil.net/hooks",
            ):
                with pytest.raises(AccessDeniedError, match="allow-list"):
                    hooks.check(Owner(OWNER), refused)
            assert hooks.check(Owner(OWNER), f"{base}/hooks/run?x=1")
            with pytest.raises(AccessDeniedError, match="no webhook secret"):
                hooks.check(Owner(owner_of_token(OTHER)), url)
            for bad in ("ftp://127.0.0.1/x", "http://user:pw@127.0.0.1/hooks", "not a url"):
                with pytest.raises((BadArgumentError, AccessDeniedError)):
                    hooks.check(Owner(OWNER), bad)
            # Loopback is private: without RLM_MCP_ALLOWED_URL_ADDRESSES the delivery is refused, unsent.
            strict = settings.model_copy(update={"allowed_url_addresses": []})
            await RunEnds([hooks.on_run_end]).ended(ended("run_hook00000004", url).record)
            clock = Clock()
            assert await deliverer(strict, stores, clock).deliver_due() == 1
            (row,) = await stores.webhooks.list(EVERY_OWNER, 10)  # type: ignore[union-attr]
            assert row.state == "pending" and "private or local address" in (row.last_error or "")
    assert receiver.seen == []


def test_the_tokens_file_stays_one_token_per_line_and_checks_its_options(tmp_path: Path) -> None:
    from rlm_mcp.access import load_tokens
    from rlm_mcp.testing.settings import make_settings

    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"# team tokens\nplain\nwith space inside\n{TOKEN} webhook_secret={whsec(NEW)} webhook_allow=https://h.example/\n"
    )
    settings = make_settings(tmp_path, auth_tokens_file=tokens)
    assert load_tokens(settings.server) == ["plain", "with space inside", TOKEN]
    grants = webhook_grants(settings.server)
    assert (
        list(grants) == [OWNER] and grants[OWNER].secrets == (NEW,) and grants[OWNER].allow == ("https://h.example/",)
    )
    assert whsec(NEW) not in repr(grants) and base64.b64encode(NEW).decode() not in repr(grants)
    tokens.write_text(f"{TOKEN} webhook_secret=nope\n")
    with pytest.raises(ValueError, match="whsec_") as refused:
        webhook_grants(settings.server)
    assert "nope" not in str(refused.value)


async def test_the_cli_lists_deliveries_and_redelivers_one(
    store_settings: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from rlm_mcp.cli.webhooks import webhooks_list, webhooks_redeliver

    settings = configured(store_settings, tmp_path, "https://hooks.example/")
    async with make_stores(settings) as stores:
        hooks = webhooks(settings, stores)
        await RunEnds([hooks.on_run_end]).ended(ended("run_hook00000005", "https://hooks.example/x").record)
        await stores.webhooks.record(  # type: ignore[union-attr]
            "msg_run_hook00000005",
            Attempt(state="failed", attempts=8, next_at=0, status=500, error="answered HTTP 500", now=0),
        )
    assert await webhooks_list(argparse.Namespace(), settings) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[1].split()[:4] == ["msg_run_hook00000005", "failed", "8", "500"]
    assert "https://hooks.example/x (answered HTTP 500)" in listed[1]
    assert await webhooks_redeliver(argparse.Namespace(webhook_id="msg_run_hook00000005"), settings) == 0
    with pytest.raises(BadArgumentError, match="No webhook delivery 'msg_nothing'"):
        await webhooks_redeliver(argparse.Namespace(webhook_id="msg_nothing"), settings)
    async with make_stores(settings) as stores:
        (row,) = await stores.webhooks.list(EVERY_OWNER, 10)  # type: ignore[union-attr]
    assert (row.state, row.attempts, row.webhook_id) == ("pending", 8, "msg_run_hook00000005")


async def test_the_viewer_shows_each_owner_its_deliveries_and_redelivers_them(
    store_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    import httpx

    from rlm_mcp.access import HostPolicy
    from rlm_mcp.viewer.auth import ViewerAuth
    from rlm_mcp.viewer.routes import build_viewer

    settings = configured(store_settings, tmp_path, "https://hooks.example/")
    async with make_stores(settings) as stores:
        hooks = webhooks(settings, stores)
        await RunEnds([hooks.on_run_end]).ended(ended("run_hook00000006", "https://hooks.example/x").record)
        port = free_port()
        auth = ViewerAuth(tokens=[TOKEN, OTHER], policy=HostPolicy("127.0.0.1", port, [], []))
        app = build_viewer(stores.runs, auth, webhooks=stores.webhooks)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            while not server.started:
                await anyio.sleep(0.01)
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/runs/api", timeout=30) as http:
                    mine, theirs = ({"Authorization": f"Bearer {t}"} for t in (TOKEN, OTHER))
                    (row,) = (await http.get("/webhooks", headers=mine)).json()["data"]
                    assert (row["webhook_id"], row["state"], row["url"]) == (
                        "msg_run_hook00000006",
                        "pending",
                        "https://hooks.example/x",
                    )
                    assert "body" not in row and "owner" not in row
                    assert (await http.get("/webhooks", headers=theirs)).json() == {"data": []}
                    again = "/webhooks/msg_run_hook00000006/redeliver"
                    refused = await http.post(again, headers=theirs)
                    assert (refused.status_code, refused.json()) == (404, {"error": "Unknown webhook id."})
                    assert (await http.post(again)).status_code == 401
                    done = await http.post(again, headers=mine)
                    assert done.json() == {"webhook_id": "msg_run_hook00000006", "state": "pending"}
            finally:
                server.should_exit = True
