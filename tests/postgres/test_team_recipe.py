"""docs/team.md's "A team on one machine", checked line by line: at most ten lines; its role and
database, made by its own SQL on a private cluster, are all the privileges rlm-mcp needs (the
migrations run as that role, which is no superuser); its three `serve` lines are commands the CLI
accepts, one per role, each with a data dir and port of its own, from a `uv run --extra team`."""

from __future__ import annotations

import re
import shlex

import anyio
import psycopg

from rlm_mcp.cli import build_parser
from rlm_mcp.store.pg.migrations import migrate
from tests.fixtures_postgres import Cluster
from tests.readme_blocks import DOCS, blocks


def recipe() -> list[str]:
    (block,) = [b for b in blocks(DOCS / "team.md") if b.marker.startswith("<!-- team-recipe")]
    return block.text.splitlines()


def test_the_recipe_is_ten_lines_and_installs_from_a_checkout() -> None:
    lines = recipe()
    assert len(lines) <= 10, lines
    assert "uv sync --extra team" in lines
    assert any("deploy/haproxy/haproxy.cfg" in line for line in lines)
    assert any(line.startswith("openssl req -x509") for line in lines)


def test_the_recipe_assumes_no_sudo() -> None:
    # Root in a container has no sudo; a user has no write access to /etc nor ports below 1024.
    lines = recipe()
    (chooser,) = [line for line in lines if "sudo" in line]
    assert "runuser -u postgres" in chooser and '[ "$(id -u)" = 0 ]' in chooser, chooser
    assert not any(line.lstrip().startswith("sudo") for line in lines)
    assert all(line.startswith("$PG ") for line in lines if "psql" in line or "pg_ctlcluster" in line)
    assert not any(re.search(r"(>|install\b.*)\s*/etc/", line) for line in lines)
    binds = re.findall(r"s\|[^|]*\|:(\d+) ssl crt", "\n".join(lines))  # what the bind line becomes
    assert binds and all(int(port) > 1024 for port in binds), binds


def test_the_serve_lines_are_one_per_role_each_with_its_own_data_dir_and_port() -> None:
    serves = [line for line in recipe() if " rlm-mcp serve " in line]
    roles, ports, dirs = [], set(), set()
    for line in serves:
        words = shlex.split(line.rstrip("&").strip())
        assert words[0].startswith("RLM_MCP_DATA_DIR=")
        dirs.add(words[0])
        assert words[1:5] == ["uv", "run", "--extra", "team"], words  # a plain `uv run` drops the driver
        args = build_parser().parse_args(words[words.index("rlm-mcp") + 1 :])
        roles.append(args.role)
        ports.add(args.port)
        assert args.transport == "http"
    assert sorted(roles) == ["both", "front", "worker"] and len(ports) == 3 and len(dirs) == 3


def test_the_role_and_database_it_makes_are_all_rlm_mcp_needs(pg_cluster: Cluster) -> None:
    (psql,) = [line for line in recipe() if "psql" in line]
    statements = re.findall(r'-c "([^"]+)"', psql)
    assert [s.split()[:2] for s in statements] == [["CREATE", "ROLE"], ["CREATE", "DATABASE"]]
    role = re.search(r"CREATE ROLE (\w+)", statements[0])
    password = re.search(r"PASSWORD '([^']+)'", statements[0])
    database = re.search(r"CREATE DATABASE (\w+)", statements[1])
    assert role and password and database
    url = next(line for line in recipe() if "RLM_MCP_DATABASE_URL=" in line)
    assert f"postgresql://{role[1]}:{password[1]}@127.0.0.1:5432/{database[1]}" in url
    if pg_cluster.proc is None:
        pg_cluster.start()
    for statement in statements:
        pg_cluster.sql(statement)
    try:
        as_role = f"postgresql://{role[1]}:{password[1]}@127.0.0.1:{pg_cluster.port}/{database[1]}"

        async def apply() -> int:
            async with await psycopg.AsyncConnection.connect(as_role, autocommit=True) as conn:
                superuser = await (
                    await conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
                ).fetchone()
                assert superuser == (False,)
                return await migrate(conn)

        assert anyio.run(apply) > 0  # every migration applied, as the recipe's role
    finally:
        pg_cluster.sql(f"DROP DATABASE IF EXISTS {database[1]} WITH (FORCE)")
        pg_cluster.sql(f"DROP ROLE IF EXISTS {role[1]}")
