"""The health route with a bucket (RLM_MCP_BLOB_URL): `"blobs"` says whether the bucket answers.

A real team replica on a private SeaweedFS: `"ok"` while it answers, `"unreachable"` once it is
stopped (learnt from the replica's own sweep, not from a probe), `"ok"` again once it is back; the
status stays 200 throughout (every replica shares the bucket: a 503 would help no caller). A bucket
that refuses this server's credentials is `"refused"`; neither the bucket's name nor any credential
is shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlm_mcp import __version__
from rlm_mcp.config.blobs import BlobSettings
from rlm_mcp.server.health import store_readiness
from rlm_mcp.store.bucket import Bucket, BucketError
from rlm_mcp.store.bundle import Stores
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_bucket import BUCKET, KEY_ID, SECRET, SeaweedFS
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env

pytestmark = pytest.mark.anyio


@pytest.fixture
def own_seaweedfs() -> Iterator[SeaweedFS]:
    """A SeaweedFS of this test's own: the test stops and restarts it."""
    server = SeaweedFS()
    try:
        server.start()
        yield server
    finally:
        server.close()


def _blobs(base: str) -> tuple[int, dict[str, object]] | None:
    try:
        response = httpx.get(f"{base}/healthz", timeout=10)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


def _blobs_is(base: str, value: str) -> bool:
    answer = _blobs(base)
    return answer is not None and answer[1].get("blobs") == value


async def test_a_replica_reports_its_bucket_down_and_back_and_stays_in_rotation(
    tmp_path: Path, pg_migrated_url: str, own_seaweedfs: SeaweedFS
) -> None:
    port = free_port()
    url = f"s3://{BUCKET}/health"
    env = cli_env(
        tmp_path,
        RLM_MCP_AUTH_TOKEN="health-bucket-token",
        RLM_MCP_DATABASE_URL=pg_migrated_url,
        RLM_MCP_BLOB_URL=url,
        RLM_MCP_BLOB_SWEEP_INTERVAL_S="1",  # the sweep (at each 5 s heartbeat) is what learns of it
        RLM_MCP_BLOB_TIMEOUT_S="3",
        **own_seaweedfs.env(),
    )
    base = f"http://127.0.0.1:{port}"
    argv = [str(SERVER_SCRIPT), "serve", "--transport", "http", "--port", str(port)]
    with server_process(argv, port=port, env=env):
        await wait_until(lambda: _blobs_is(base, "ok"), within_s=120, what="the replica to report its bucket")
        up = _blobs(base)
        assert up == (
            200,
            {"status": "ok", "version": __version__, "role": "both", "database": "reachable", "blobs": "ok"},
        )
        own_seaweedfs.stop()
        try:
            await wait_until(
                lambda: _blobs_is(base, "unreachable"), within_s=120, what="the bucket reported unreachable"
            )
            down = _blobs(base)
            assert down is not None and down[0] == 200 and down[1]["status"] == "ok"  # still in rotation
            text = str(down[1])
            assert BUCKET not in text and own_seaweedfs.endpoint not in text and KEY_ID not in text
        finally:
            own_seaweedfs.start()
        await wait_until(lambda: _blobs_is(base, "ok"), within_s=120, what="the bucket reported again once back")


async def test_a_bucket_refusing_the_credentials_is_refused_and_an_answering_one_ok(
    seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweedfs.env().items():
        monkeypatch.setenv(name, value)
    settings = BlobSettings(blob_url=f"s3://{BUCKET}/health-unit")
    assert settings.location is not None
    good = Bucket(settings.location, timeout_s=10)
    stores = Stores(contexts=None, uploads=None, runs=None, blob_fault=good.fault)  # type: ignore[arg-type]
    check = store_readiness(stores)
    await good.put_bytes("k", b"x")
    assert (await check()).blobs == "ok"

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong" + SECRET[5:])
    refused = Bucket(settings.location, timeout_s=10)
    with pytest.raises(BucketError):
        await refused.put_bytes("k", b"x")
    assert refused.fault() == "refused"
    readiness = await store_readiness(
        Stores(contexts=None, uploads=None, runs=None, blob_fault=refused.fault)  # type: ignore[arg-type]
    )()
    assert readiness.ready and readiness.blobs == "refused"  # a bucket fault never takes the replica out
    await good.delete("k")
    assert good.fault() is None
