"""The sweep aborts the multipart uploads a killed front abandoned under the deployment's prefix,
once older than RLM_MCP_BLOB_GRACE_S by the bucket's clock; an upload within the grace period, and
one outside rlm-mcp's keys, are left alone; a failure to list them is logged (never a credential)
and the rows are swept all the same. Real SeaweedFS and PostgreSQL; the uploads begun with
aiobotocore, as a front killed after its first part leaves them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.assembly import make_stores
from rlm_mcp.config.blobs import bucket_location
from rlm_mcp.store.bucket_uploads import _client_kwargs
from rlm_mcp.store.pg import bucket_of
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_bucket import SECRET, aged_past, bucket_settings, object_rows

pytestmark = pytest.mark.anyio


async def _begin(bucket: str, key: str) -> None:
    """Begin a multipart upload and send its first part, then walk away (a SIGKILLed front)."""
    from aiobotocore.session import get_session

    async with get_session().create_client("s3", **_client_kwargs(30.0)) as client:
        up = await client.create_multipart_upload(Bucket=bucket, Key=key)
        await client.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"p" * (5 << 20))


async def _pending(bucket: str, prefix: str) -> list[str]:
    """Keys of the multipart uploads under `prefix` the bucket lists."""
    from aiobotocore.session import get_session

    async with get_session().create_client("s3", **_client_kwargs(30.0)) as client:
        page: dict[str, Any] = await client.list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        return sorted(u["Key"] for u in page.get("Uploads", []))


async def test_the_sweep_aborts_abandoned_uploads_and_leaves_fresh_and_foreign_ones(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str
) -> None:
    where = bucket_location(bucket_url)
    mine, foreign = f"{where.prefix}/c/ab/{'ab' * 32}.left", f"{where.prefix}/other/upload"
    await _begin(where.bucket, mine)
    await _begin(where.bucket, foreign)
    assert await _pending(where.bucket, where.prefix + "/") == sorted([mine, foreign])

    async with make_stores(bucket_settings(tmp_path, pg_migrated_url, bucket_url, blob_grace_s=3600)) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None
        await bucket.sweep()
        assert await _pending(where.bucket, where.prefix + "/") == sorted([mine, foreign])  # within the grace

    settings = bucket_settings(tmp_path, pg_migrated_url, bucket_url, "late", blob_grace_s=0.001)
    async with make_stores(settings) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None

        async def aborted() -> bool:
            # The bucket's Date header has whole seconds: the upload is past the grace within one.
            await bucket.sweep()
            return await _pending(where.bucket, where.prefix + "/c/") == []

        await wait_until(aborted, within_s=30, what="the sweep's abort of the abandoned upload")
    assert await _pending(where.bucket, where.prefix + "/") == [foreign]  # not rlm-mcp's key: left alone


async def test_a_failed_listing_is_logged_without_credentials_and_the_rows_are_swept(
    tmp_path: Path, pg_migrated_url: str, bucket_url: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    grace_s = 0.001
    settings = bucket_settings(tmp_path, pg_migrated_url, bucket_url, blob_grace_s=grace_s)
    async with make_stores(settings) as stores:
        bucket = bucket_of(stores)
        assert bucket is not None
        key = await bucket.intend(owner="alice", sha256="cd" * 32, size=4)
        await bucket.bucket.put_bytes(key, b"left")
        await bucket.intend(owner="alice", sha256="ef" * 32, size=4)  # the rows' own sweep must still happen
        # The sweep takes only intents older than the grace period by the database's clock: the
        # second was written a fraction of a millisecond ago, so wait until both are past it
        # (without this the sweep rightly left the younger one, once in a few runs).
        await wait_until(
            lambda: aged_past(stores.lifecycle, grace_s), within_s=30, what="the intents to age past the grace period"
        )
        # The janitor's client is made at each sweep, from the environment: a wrong secret now
        # makes its listing fail while the store's client (made at start) still works.
        wrong = "sk-wrong-" + SECRET[-8:]
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
        with caplog.at_level(logging.WARNING, logger="rlm_mcp.store"):
            await bucket.sweep()
        assert await object_rows(stores.lifecycle) == [] and await bucket.bucket.keys("c") == []
    warned = [r.getMessage() for r in caplog.records if "abandoned multipart" in r.getMessage()]
    assert warned and bucket_url in warned[0], caplog.text
    assert wrong not in caplog.text and SECRET not in caplog.text
