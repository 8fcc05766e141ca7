"""rlm-mcp behind HAProxy (issue 22 item 5): three replicas on one PostgreSQL database behind
Debian's haproxy with the README's configuration, TLS terminated at the balancer, real MCP
clients. A handshake-era session (2025-11-25 through the SDK, 2025-06-18 on the wire) stays on
the replica that created it, learnt from the `initialize` answer; stateless (2026-07-28) calls
spread over the replicas and share contexts; with two `--role both` workers and a `--role front`,
runs spread over both workers and any replica starts, polls and cancels any run; a worker killed
with SIGKILL mid-run leaves its run ended with a status naming it and no container, and runs
outlive a PostgreSQL restart, all read through the balancer; a replica whose database is gone
answers 503 on /healthz and leaves the rotation. Which replica served a request
is read from that replica's own log."""

from __future__ import annotations

import re
import secrets
import shlex
import ssl
import subprocess
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rlm_mcp.cli import build_parser
from rlm_mcp.testing.script import Script
from rlm_mcp.testing.scripted_lm import ScriptedLM
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_haproxy import (
    CONFIG,
    balanced_replicas,
    haproxy_path,
    health_status,
    make_certificate,
    mcp_client,
    render,
    served_by,
)
from tests.fixtures_http import INIT, MCP_HEADERS
from tests.fixtures_postgres import Cluster
from tests.fixtures_surface import ANSWER_NOW, call
from tests.fixtures_team import team_replica
from tests.readme_blocks import DOCS, REPO, blocks

pytestmark = pytest.mark.anyio

ALICE = "alice-lb-token"
BEARER = {"authorization": f"Bearer {ALICE}"}
NO_LM = "http://127.0.0.1:9/v1"  # nothing listens: these calls never reach an LM


def test_the_team_page_links_the_configuration_the_tests_run(tmp_path: Path) -> None:
    # The docs link the shipped file rather than carry a copy that could drift from it.
    assert not [b for b in blocks() if b.lang == "haproxy"], "a copy of the HAProxy configuration in the docs"
    assert "](../deploy/haproxy/haproxy.cfg)" in (DOCS / "team.md").read_text(encoding="utf-8")
    # and what the tests run from it is a configuration Debian's haproxy accepts
    pem, _ = make_certificate(tmp_path)
    text = render(CONFIG.read_text(), port=1, cert=pem, servers=[("127.0.0.1", 2), ("127.0.0.1", 3)])
    assert "stick store-response res.hdr(mcp-session-id)" in text and "option httpchk GET /healthz" in text
    assert "server rlm2 127.0.0.1:3" in text and "10.0.0.11" not in text
    (tmp_path / "haproxy.cfg").write_text(text)
    checked = subprocess.run(
        [haproxy_path(), "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def recipe() -> list[str]:
    (block,) = [b for b in blocks(DOCS / "team.md") if b.marker.startswith("<!-- team-recipe")]
    return block.text.splitlines()


async def test_the_team_recipe_serves_an_mcp_client_through_its_balancer(tmp_path: Path, pg_url: str) -> None:
    # docs/team.md's "A team on one machine", past its PostgreSQL lines (tests/postgres/
    # test_team_recipe.py runs their SQL): its settings, its three replicas, its certificate and
    # balancer lines as written (only the ports and the database are this test's), then a client
    # as the page tells one: the recipe's CA file, `Authorization: Bearer <token>`, the public URL.
    lines = recipe()
    (export,) = [line for line in lines if line.startswith("export ")]
    settings = dict(word.split("=", 1) for word in shlex.split(export)[1:])
    tokens = settings["RLM_MCP_AUTH_TOKENS"].split(",")
    public = urlsplit(settings["RLM_MCP_PUBLIC_URL"])
    assert public.scheme == "https" and public.hostname == "localhost" and public.port and public.port > 1024
    serves = [shlex.split(line.rstrip("&").strip()) for line in lines if " rlm-mcp serve " in line]
    parsed = [build_parser().parse_args(words[words.index("rlm-mcp") + 1 :]) for words in serves]
    (certificate,) = [line for line in lines if line.startswith("openssl req")]
    (balancer,) = [line for line in lines if "deploy/haproxy/haproxy.cfg" in line]
    write_config, start = balancer.rstrip("&").split(" && ")
    assert shlex.split(start) == ["haproxy", "-f", "rlm-haproxy.cfg"]  # no root needed: a port above 1024
    page = (DOCS / "team.md").read_text(encoding="utf-8")
    assert f"Authorization: Bearer {tokens[0]}" in page and "NODE_EXTRA_CA_CERTS=$PWD/rlm.crt" in page

    lb_port = free_port()
    folder = tmp_path / "checkout"
    folder.mkdir()
    (folder / "deploy").symlink_to(REPO / "deploy")
    with ScriptedLM(Script(root=[ANSWER_NOW])) as lm, ExitStack() as stack:
        ports = {str(public.port): str(lb_port)}
        for args in parsed:
            replica = stack.enter_context(
                team_replica(
                    tmp_path / f"replica-{args.port}",
                    role=args.role,
                    database_url=pg_url,
                    lm_url=lm.base_url,
                    tokens=tokens,
                    env={"RLM_MCP_PUBLIC_URL": f"https://localhost:{lb_port}"},
                )
            )
            ports[str(args.port)] = str(urlsplit(replica.base).port)
        script = "\n".join([certificate, write_config])
        for written, used in ports.items():
            script = re.sub(rf"(?<=:){written}\b", used, script)
        made = await anyio.run_process(["bash", "-euo", "pipefail", "-c", script], cwd=folder, check=False)
        assert made.returncode == 0, made.stderr.decode(errors="replace")
        config = (folder / "rlm-haproxy.cfg").read_text()
        servers = re.findall(r"^\s*server \S+ (\S+)", config, re.M)
        mcp_ports = [ports[str(a.port)] for a in parsed if a.role != "worker"]
        assert servers == [f"127.0.0.1:{p}" for p in mcp_ports], servers  # no leftover example address
        assert "/etc/" not in config
        haproxy = [haproxy_path(), "-db", "-f", "rlm-haproxy.cfg"]
        stack.enter_context(server_process(haproxy, port=lb_port, cwd=folder, within_s=60, log=folder / "lb.log"))
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {tokens[0]}"},
            verify=ssl.create_default_context(cafile=folder / "rlm.crt"),
            timeout=120,
        )
        url = f"https://localhost:{lb_port}/mcp"
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            loaded = await call(client, "rlm_load_context", text="through the recipe's balancer")
            done = await call(client, "rlm_complete", query="what is it?", context_id=loaded["context_id"])
            assert done["status"] == "completed" and done["answer"] == "forty-two", done


async def test_a_handshake_era_session_stays_on_the_replica_that_created_it(tmp_path: Path, pg_url: str) -> None:
    with balanced_replicas(tmp_path, database_url=pg_url, lm_url=NO_LM, tokens=[ALICE]) as balanced:
        before = balanced.requests()
        async with mcp_client(balanced, "legacy", ALICE) as client:
            assert client.protocol_version == "2025-11-25"
            for i in range(6):
                await call(client, "rlm_load_context", text=f"handshake era {i}", name=f"h{i}")
                listed = await call(client, "rlm_list_contexts")
                assert len(listed["contexts"]) == i + 1
        after = balanced.requests()
        moved = {name: after[name] - before[name] for name in after}
        home = [name for name, n in moved.items() if n]
        assert len(home) == 1 and moved[home[0]] >= 13, moved  # initialize, 12 calls (and the stream, the close)
        created = [r.name for r in balanced.replicas if "Created new transport with session ID" in r.text()]
        assert created == home

        # On the wire, protocol 2025-06-18: without stickiness two replicas in three would answer
        # "session not found".
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=balanced.cafile), timeout=60) as raw:
            init = {**INIT, "params": {**INIT["params"], "protocolVersion": "2025-06-18"}}  # type: ignore[dict-item]
            opened = await raw.post(f"{balanced.url}/mcp", json=init, headers={**MCP_HEADERS, **BEARER})
            assert opened.status_code == 200, opened.text
            session = opened.headers["mcp-session-id"]
            headers = {**MCP_HEADERS, **BEARER, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
            note = await raw.post(
                f"{balanced.url}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
            )
            assert note.status_code == 202, note.text
            for i in range(9):
                tools = await raw.post(
                    f"{balanced.url}/mcp",
                    json={"jsonrpc": "2.0", "id": 10 + i, "method": "tools/list"},
                    headers=headers,
                )
                assert tools.status_code == 200, tools.text
                assert "rlm_complete" in tools.text
            owner = [r.name for r in balanced.replicas if r.created_session(session)]
            assert len(owner) == 1
            closed = await raw.delete(f"{balanced.url}/mcp", headers=headers)
            assert closed.status_code == 200, closed.text


async def test_a_replica_whose_database_is_unreachable_leaves_the_rotation_and_comes_back(
    tmp_path: Path, pg_cluster: Cluster, pg_url: str
) -> None:
    lost = "t_lost_" + secrets.token_hex(4)
    pg_cluster.sql(f"CREATE DATABASE {lost}")
    try:
        urls = [pg_url, pg_cluster.url(lost)]
        with balanced_replicas(tmp_path, database_url=urls, lm_url=NO_LM, tokens=[ALICE], count=2) as balanced:
            healthy, doomed = balanced.replicas
            # Its database refuses connections and drops the open ones: unreachable, as in an outage.
            pg_cluster.sql(f"ALTER DATABASE {lost} WITH ALLOW_CONNECTIONS false")
            pg_cluster.sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{lost}'")
            await wait_until(lambda: health_status(doomed.base) == 503, within_s=60, what="503 without its database")
            await wait_until(lambda: balanced.server_down(doomed.name), within_s=60, what="HAProxy to take it out")
            async with mcp_client(balanced, "2026-07-28", ALICE) as client:
                for i in range(4):
                    before = balanced.requests()
                    await call(client, "rlm_load_context", text=f"only the healthy one {i}")
                    assert await served_by(balanced, before) == healthy.name

            pg_cluster.sql(f"ALTER DATABASE {lost} WITH ALLOW_CONNECTIONS true")
            await wait_until(lambda: health_status(doomed.base) == 200, within_s=60, what="200 once it is back")
            await wait_until(lambda: balanced.server_up(doomed.name), within_s=60, what="HAProxy to take it back")
            async with mcp_client(balanced, "2026-07-28", ALICE) as client:
                served = set()
                for _ in range(2):  # round robin over both again
                    before = balanced.requests()
                    await client.list_tools()
                    served.add(await served_by(balanced, before))
                assert served == {healthy.name, doomed.name}
    finally:
        pg_cluster.sql(f"DROP DATABASE IF EXISTS {lost} WITH (FORCE)")
