"""One S3 bucket, as team mode's blob store uses it: streamed puts from files, streamed gets,
deletes, and the failures phrased once.

Why obstore (Rust's `object_store`): async without a thread per request, a put from a file or
an async iterator that becomes a multipart upload by itself (parts of `PART_BYTES`, at least
S3's 5 MiB), gets that stream in pieces, bounded timeouts and retries, and one API that also
speaks GCS, Azure and a local folder; it reads the standard `AWS_*` variables itself, so
rlm-mcp never holds a credential in a setting of its own.

Every failure is a `BucketError` naming the bucket (s3://bucket/prefix, never a credential):
unreachable or slow, refused (credentials, policy), or full (a quota); a missing object is
`BucketObjectMissing`. Texts the client returns are cut to their first line and cleared of the
access key id and secret before they are shown.

`fault()` is what the health route reports: the kind of the last failure ("unreachable",
"refused", "full") while no request has succeeded since and it is under `FAULT_HOLD_S` old. It is
learnt from the traffic (and each replica's periodic sweep), never by a probe of its own: a
health check polled every second must not become a stream of paid requests.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from rlm_mcp.config.blobs import BucketLocation
from rlm_mcp.errors import TEAM_EXTRA_FIX, RlmMcpError

__all__ = ["PART_BYTES", "Bucket", "BucketError", "BucketFullError", "BucketObjectMissing"]

PART_BYTES = 8 << 20  # a multipart upload's part (S3: at least 5 MiB, except the last; 10,000 parts: 78 GiB)
# Parts in flight per upload: 2 kept a 256 MiB put at 89 MiB peak RSS against 106 MiB with 4, as fast
# (SeaweedFS on loopback, 2 vCPUs); memory stays bounded whatever the object's size.
PUT_CONCURRENCY = 2
READ_PIECE = 1 << 20  # what a streamed get hands over at a time: memory stays at about this
CONNECT_TIMEOUT_S = 5.0
FAULT_HOLD_S = 30.0  # as the database's fault (store/pg/db.py): a failure this old is no news
_FULL = re.compile(r"quota|storage ?full|insufficient ?storage|no ?space|\b507\b|XMinioStorageFull", re.I)
_DENIED = re.compile(r"\b403\b|access ?denied|forbidden|signature|invalidaccesskeyid", re.I)


class BucketError(RlmMcpError):
    """The bucket failed a request (unreachable, slow, refused)."""


class BucketFullError(BucketError):
    """The bucket refused a write for lack of space or quota."""


class BucketObjectMissing(BucketError):
    """An object the index names is not in the bucket."""


class Bucket:
    """The bucket of RLM_MCP_BLOB_URL; keys are relative to its prefix."""

    def __init__(self, location: BucketLocation, *, timeout_s: float) -> None:
        try:
            from obstore.store import S3Store
        except ImportError as exc:
            raise RlmMcpError(
                f"RLM_MCP_BLOB_URL is set but the S3 client is not installed ({exc.name}).",
                f"Install the team extra, which includes obstore. {TEAM_EXTRA_FIX} Or unset RLM_MCP_BLOB_URL.",
            ) from None

        self.location = location
        self.url = location.url
        self._timeout_s = timeout_s
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT") or ""
        self._store = S3Store(
            location.bucket,
            prefix=location.prefix or None,
            client_options={
                "timeout": timedelta(seconds=timeout_s),
                "connect_timeout": timedelta(seconds=CONNECT_TIMEOUT_S),
                # A plain-HTTP endpoint is a local server (SeaweedFS, MinIO on loopback).
                "allow_http": endpoint.startswith("http://"),
            },
            retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=timeout_s)},
        )
        self._fault: tuple[str, float] | None = None  # (kind, monotonic time) of the last failure

    def fault(self) -> str | None:
        """ "unreachable", "refused" or "full" while the last failure is recent and nothing has
        succeeded since; None otherwise (the health route)."""
        if self._fault is None or time.monotonic() - self._fault[1] > FAULT_HOLD_S:
            return None
        return self._fault[0]

    def _answered(self, *, wrote: bool) -> None:
        """A request succeeded: the bucket answers. A read does not clear "full" (a full bucket
        still serves reads); a write clears everything."""
        if self._fault is not None and (wrote or self._fault[0] != "full"):
            self._fault = None

    async def put_file(self, key: str, path: Path) -> None:
        """Upload a file, streamed (multipart above one part)."""
        import obstore

        try:
            await obstore.put_async(self._store, key, path, chunk_size=PART_BYTES, max_concurrency=PUT_CONCURRENCY)
        except Exception as exc:
            raise self.error(exc, "write to") from None
        self._answered(wrote=True)

    async def put_stream(self, key: str, pieces: AsyncIterator[bytes]) -> None:
        """Upload what `pieces` yields, streamed (parts of `PART_BYTES`, multipart above one)."""
        import obstore

        try:
            await obstore.put_async(self._store, key, pieces, chunk_size=PART_BYTES, max_concurrency=PUT_CONCURRENCY)
        except BucketError:
            raise
        except RlmMcpError:
            raise  # the source failed (the database), not the bucket
        except Exception as exc:
            raise self.error(exc, "write to") from None
        self._answered(wrote=True)

    async def put_bytes(self, key: str, data: bytes) -> None:
        import obstore

        try:
            await obstore.put_async(self._store, key, data, use_multipart=False)
        except Exception as exc:
            raise self.error(exc, "write to") from None
        self._answered(wrote=True)

    async def read(self, key: str) -> AsyncIterator[bytes]:
        """The object's bytes in pieces of about `READ_PIECE`."""
        import obstore

        try:
            resp = await obstore.get_async(self._store, key)
            async for piece in resp.stream(min_chunk_size=READ_PIECE):
                yield bytes(piece)
        except Exception as exc:
            raise self.error(exc, "read from") from None
        self._answered(wrote=False)

    async def delete(self, key: str) -> None:
        """Remove an object; one already gone is not an error."""
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            await obstore.delete_async(self._store, key)
        except NotFoundError:
            pass
        except Exception as exc:
            raise self.error(exc, "delete from") from None
        self._answered(wrote=True)

    async def head(self, key: str) -> dict[str, Any]:
        import obstore

        try:
            meta = dict(await obstore.head_async(self._store, key))
        except Exception as exc:
            raise self.error(exc, "read from") from None
        self._answered(wrote=False)
        return meta

    async def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix` (tests and the sweep's checks; the index is the authority)."""
        import obstore

        found: list[str] = []
        try:
            async for batch in obstore.list(self._store, prefix):
                found += [str(o["path"]) for o in batch]
        except Exception as exc:
            raise self.error(exc, "list") from None
        self._answered(wrote=False)
        return found

    async def round_trip(self) -> float | None:
        """Write, read back and delete a small object (`doctor`); this host's clock minus the
        bucket's (from the object's Last-Modified; None when it has none). `BucketError` on any
        failure, or when the bytes read back differ."""
        import secrets
        import time

        key = f"doctor/{secrets.token_hex(8)}"
        body = secrets.token_bytes(64)
        before = time.time()
        await self.put_bytes(key, body)
        try:
            back = b"".join([piece async for piece in self.read(key)])
            if back != body:
                raise BucketError(
                    f"The bucket {self.url} returned other bytes than were written.",
                    "Check the S3 endpoint (AWS_ENDPOINT_URL): it is not a faithful S3 server.",
                )
            meta = await self.head(key)
        finally:
            await self.delete(key)
        modified = meta.get("last_modified")
        if modified is None:
            return None
        # Last-Modified has whole seconds: the skew is known to about a second.
        return float(before - modified.timestamp())

    async def abort_abandoned_uploads(self, older_than_s: float) -> int:
        """Abort rlm-mcp's multipart uploads initiated more than `older_than_s` ago, by the
        bucket's clock (`bucket_uploads.py`); how many. `BucketError` on any failure."""
        from rlm_mcp.store.bucket_uploads import abort_abandoned_uploads

        try:
            aborted = await abort_abandoned_uploads(self.location, older_than_s=older_than_s, timeout_s=self._timeout_s)
        except ImportError as exc:
            raise RlmMcpError(
                f"The sweep of the bucket {self.url} cannot abort abandoned uploads: {exc.name} is not installed.",
                f"Install the team extra, which includes aiobotocore. {TEAM_EXTRA_FIX}",
            ) from None
        except Exception as exc:
            raise self.error(exc, "list the multipart uploads of") from None
        self._answered(wrote=False)
        return aborted

    def error(self, exc: BaseException, doing: str) -> BucketError:
        """The one phrasing of a bucket failure."""
        from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

        detail = self._clean(exc)
        if isinstance(exc, NotFoundError):  # the bucket answered: no fault of the bucket's
            return BucketObjectMissing(
                f"An object the database names is missing from the bucket {self.url} ({detail}).",
                "Something removed it outside rlm-mcp (a lifecycle rule expiring objects?): load the context again.",
            )
        if _FULL.search(detail):
            self._fault = ("full", time.monotonic())
            return BucketFullError(
                f"The bucket {self.url} is full or over its quota: could not {doing} it ({detail}).",
                "Raise the bucket's quota or free space in it, or lower RLM_MCP_STORE_MAX_BYTES so eviction keeps "
                "the store smaller.",
            )
        if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or _DENIED.search(detail):
            self._fault = ("refused", time.monotonic())
            return BucketError(
                f"The bucket {self.url} refused this server: could not {doing} it ({detail}).",
                "Check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket's policy (docs/object-storage.md "
                "lists the actions rlm-mcp needs).",
            )
        self._fault = ("unreachable", time.monotonic())
        return BucketError(
            f"The bucket {self.url} is unreachable or too slow: could not {doing} it ({detail}).",
            "Check that the S3 endpoint (AWS_ENDPOINT_URL) is up and reachable from this server; "
            "`rlm-mcp doctor` checks it. Runs whose contexts are already cached on a worker still run.",
        )

    @staticmethod
    def _clean(exc: BaseException) -> str:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        for name in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"):
            secret = os.environ.get(name)
            if secret:
                text = text.replace(secret, "[redacted]")
        return text[:300]
