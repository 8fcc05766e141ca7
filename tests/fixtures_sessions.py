"""Helpers the kept-session tests share across tiers: the sandbox images with and without dill,
a hostile cell that hands out snapshot pieces slowly, a session's row as the database holds it, a
replica's session store and queue, and a team database with its queue."""

from __future__ import annotations

import io
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import docker
import psycopg
import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.service.queue.rules import queue_rules
from rlm_mcp.store.pg import bucket_of
from rlm_mcp.store.pg.db import Database
from rlm_mcp.store.pg.queue import PgRunQueue
from rlm_mcp.store.pg.sessions import PgSessionStore


@pytest.fixture(scope="module")
def dill_image(docker_image: str) -> str:
    """The sandbox image must have dill (both build paths install python3-dill); fail with the fix."""
    client = docker.from_env()
    try:
        client.containers.run(docker_image, ["python3", "-c", "import dill"], entrypoint=[], remove=True)
    except docker.errors.ContainerError:
        pytest.fail(
            f"The sandbox image {docker_image} has no dill: rebuild it (`rlm-mcp image build`, or "
            "`rlm-mcp image build --offline` on a machine whose offline base lacks it)."
        )
    finally:
        client.close()
    return docker_image


@pytest.fixture(scope="module")
def image_without_dill(docker_image: str) -> Iterator[str]:
    """`docker_image` with python3-dill deleted, under a tag of its own."""
    tag = f"rlm-mcp-test-nodill:{secrets.token_hex(4)}"
    dockerfile = (
        f"FROM {docker_image}\nUSER root\n"
        "RUN rm -rf /usr/lib/python3/dist-packages/dill /usr/lib/python3/dist-packages/dill-*\n"
        "USER 1000:1000\n"
    )
    client = docker.from_env()
    try:
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
        yield tag
    finally:
        try:
            client.images.remove(tag, force=True)
        finally:
            client.close()


# Every snapshot piece arrives, whole, after a second: ~60 pieces of 4096 characters.
SLOW_PIECES = (
    "import builtins, time\n"
    "_real_print = builtins.print\n"
    "def _slow(*a, **k):\n"
    "    if k.get('end') == '':\n"
    "        time.sleep(1)\n"
    "    return _real_print(*a, **k)\n"
    "builtins.print = _slow\n"
    "big = 'x' * 180000\n"
    "_real_print('ok')"
)


def session_row(db: str, session_id: str) -> dict[str, object]:
    with psycopg.connect(db, autocommit=True) as conn:
        found = conn.execute(
            "SELECT s.generation, s.snapshot_gen, w.owner_id FROM rlm_sessions s "
            "LEFT JOIN rlm_workers w ON w.worker_id = s.worker_id WHERE s.session_id = %s",
            (session_id,),
        ).fetchone()
    assert found is not None
    return {"generation": found[0], "snapshot_gen": found[1], "holder": found[2]}


DAY = 86400.0


@asynccontextmanager
async def replica(
    tmp_path: Path, url: str, name: str, *, blob_url: str | None = None
) -> AsyncIterator[tuple[PgSessionStore, PgRunQueue]]:
    """One replica's session store and queue; with `blob_url`, snapshots go to that bucket."""
    settings = Settings(database_url=url, data_dir=tmp_path / name, worker_lease_s=30.0, blob_url=blob_url)
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        yield PgSessionStore(db, bucket_of(stores)), PgRunQueue(queue_rules(settings.queue), db)


@asynccontextmanager
async def team(tmp_path: Path, url: str, **overrides: Any) -> AsyncIterator[tuple[Database, PgRunQueue, Settings]]:
    settings = Settings(database_url=url, data_dir=tmp_path / "data", **({"worker_lease_s": 5.0} | overrides))
    async with make_stores(settings) as stores:
        db = stores.lifecycle
        assert isinstance(db, Database)
        yield db, PgRunQueue(queue_rules(settings.queue), db), settings
