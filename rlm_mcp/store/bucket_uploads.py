"""Abandoned multipart uploads under this deployment's prefix, aborted by the sweep.

A front killed in the middle of a streamed put leaves an incomplete multipart upload: its parts
are billed, yet no object listing shows them and obstore (the client of `bucket.py`) can neither
list nor abort another process's uploads. aiobotocore does both (ListMultipartUploads,
AbortMultipartUpload), async, with the same standard `AWS_*` variables obstore reads, so rlm-mcp
still holds no credential of its own.

Only keys rlm-mcp writes are looked at (`<prefix>/c/` and `<prefix>/s/`): another tool's uploads
in the same bucket are left alone. An upload is abandoned once it was initiated more than the
grace period ago, both times by the bucket's own clock: `Initiated` is the bucket's, and "now" is
the `Date` header of the listing's response, so the skew between this host (or the database,
whose clock ages the intent rows) and the bucket plays no part. A response without a `Date`
falls back to this host's clock.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from rlm_mcp.config.blobs import BucketLocation

__all__ = ["abort_abandoned_uploads"]

log = logging.getLogger("rlm_mcp.store")

MAX_RETRIES = 2


def _bucket_now(response: dict[str, Any]) -> datetime:
    """The bucket's time from the response's Date header (whole seconds); this host's without one."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if date:
        try:
            return parsedate_to_datetime(str(date))
        except (TypeError, ValueError):
            pass
    return datetime.now(UTC)


def _client_kwargs(timeout_s: float) -> dict[str, Any]:
    """Endpoint, region and addressing as obstore reads them from the same `AWS_*` variables."""
    from botocore.config import Config

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    virtual = os.environ.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() in ("1", "true")
    config = Config(
        connect_timeout=min(timeout_s, 5.0),
        read_timeout=timeout_s,
        retries={"max_attempts": MAX_RETRIES, "mode": "standard"},
        # obstore addresses path-style unless told otherwise: the same here, so a server that
        # accepts one accepts the other (SeaweedFS, MinIO on loopback).
        s3={"addressing_style": "virtual" if virtual else "path"},
    )
    return {"endpoint_url": endpoint, "region_name": region, "config": config}


async def abort_abandoned_uploads(location: BucketLocation, *, older_than_s: float, timeout_s: float) -> int:
    """Abort the multipart uploads of rlm-mcp's keys initiated more than `older_than_s` ago (by
    the bucket's clock); how many. Raises what the client raises: the caller logs it."""
    from aiobotocore.session import get_session

    base = f"{location.prefix}/" if location.prefix else ""
    aborted = 0
    async with get_session().create_client("s3", **_client_kwargs(timeout_s)) as client:
        for kind in ("c/", "s/"):
            pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=location.bucket, Prefix=base + kind)
            async for page in pages:
                now = _bucket_now(page)
                for upload in page.get("Uploads", []):
                    initiated = upload.get("Initiated")
                    if not isinstance(initiated, datetime):
                        continue
                    if initiated.tzinfo is None:
                        initiated = initiated.replace(tzinfo=UTC)
                    if (now - initiated).total_seconds() <= older_than_s:
                        continue  # may still be under way (another replica's load)
                    try:
                        await client.abort_multipart_upload(
                            Bucket=location.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    except client.exceptions.NoSuchUpload:
                        continue  # another replica's sweep aborted it first
                    aborted += 1
    if aborted:
        log.info("aborted %d abandoned multipart upload(s) in the bucket %s", aborted, location.url)
    return aborted
