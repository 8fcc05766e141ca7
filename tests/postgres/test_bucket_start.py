"""`serve` in team mode checks its bucket before anything starts (a write, a read and a delete,
as `doctor`'s bucket row): a bucket that refuses this server's credentials stops it with one line
naming the bucket and the fix, never the credentials. Real SeaweedFS and PostgreSQL."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from rlm_mcp.cli.serve import _bucket_ready
from rlm_mcp.config.blobs import BlobSettings
from rlm_mcp.testing.servers import free_port
from tests.fixtures_bucket import KEY_ID, SECRET, SeaweedFS
from tests.fixtures_e2e import cli_env

pytestmark = pytest.mark.anyio


async def test_serve_refuses_to_start_on_a_bucket_that_refuses_it(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str, seaweedfs: SeaweedFS
) -> None:
    wrong = "sk-wrong-7f3a9c" + SECRET[-6:]
    env = cli_env(
        tmp_path,
        RLM_MCP_BASE_URL="http://127.0.0.1:9/v1",
        RLM_MCP_DATABASE_URL=pg_migrated_url,
        RLM_MCP_BLOB_URL=bucket_url,
        **{**seaweedfs.env(), "AWS_SECRET_ACCESS_KEY": wrong},
    )
    argv = ["serve", "--role", "front", "--transport", "http", "--port", str(free_port())]
    with anyio.fail_after(120):  # without the check it would serve on: a hang becomes a failure
        done = await anyio.run_process([sys.executable, "-m", "rlm_mcp", *argv], env=env, check=False)
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 1, out
    assert "Traceback" not in out, out
    assert f"The bucket {bucket_url} refused this server" in out, out
    assert "AWS_SECRET_ACCESS_KEY" in out, out  # the fix names the variable ...
    assert wrong not in out and "7f3a9c" not in out and SECRET not in out and KEY_ID not in out, (
        out
    )  # ... not its value


async def test_positive_control_the_start_check_passes_on_a_bucket_that_answers(bucket_url: str) -> None:
    await _bucket_ready(BlobSettings(blob_url=bucket_url))
