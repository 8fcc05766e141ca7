"""The blobs section: where team mode keeps context bytes, in the database's rows (the default)
or in an S3 bucket (docs/object-storage.md).

The URL names the bucket and a prefix only. Credentials and the endpoint come from the standard
`AWS_*` variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
AWS_ENDPOINT_URL, ...), read by the S3 client itself: a URL carrying credentials is refused, so
a secret never sits in a setting that logs, `doctor` and error texts may show.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator

from rlm_mcp.config.values import SECTION_CONFIG

__all__ = ["BlobSettings", "BucketLocation", "bucket_location"]


@dataclass(frozen=True)
class BucketLocation:
    """A checked RLM_MCP_BLOB_URL: the bucket and the prefix every key starts with ('' for none)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """s3://bucket/prefix: safe to show (it never holds a credential)."""
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def bucket_location(url: str) -> BucketLocation:
    """Parse and check s3://bucket[/prefix]; ValueError naming what is wrong (never echoing a secret)."""
    parts = urlsplit(url.strip())
    if parts.scheme != "s3":
        raise ValueError("must be s3://bucket/prefix (the S3 API: AWS, GCS's XML API, R2, MinIO, Ceph, SeaweedFS)")
    if "@" in parts.netloc or parts.password is not None or parts.username is not None:
        raise ValueError(
            "must not carry credentials: give them in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(and the endpoint in AWS_ENDPOINT_URL), never in the URL"
        )
    if parts.query or parts.fragment:
        raise ValueError(
            "takes no query or fragment: the endpoint and region come from AWS_ENDPOINT_URL and AWS_REGION"
        )
    bucket = parts.netloc
    if not bucket or parts.port is not None:
        raise ValueError("must name a bucket: s3://bucket/prefix")
    prefix = parts.path.strip("/")
    return BucketLocation(bucket=bucket, prefix=prefix)


class BlobSettings(BaseModel):
    """RLM_MCP_ settings of team mode's blob storage (`settings.blobs`)."""

    model_config = SECTION_CONFIG

    # SecretStr only so that a refused value is never echoed (a URL that wrongly carries a key).
    blob_url: SecretStr | None = Field(
        None,
        description="Team mode: s3://bucket/prefix keeps context bytes and session snapshots in that bucket "
        "(the database keeps the index); credentials and endpoint from the standard AWS_* variables, never in "
        "the URL. Unset: the bytes are rows of the database.",
    )
    blob_grace_s: float = Field(
        3600.0,
        gt=0,
        description="An object the database has no live row for (a front killed mid-upload) is removed this many "
        "seconds after its intent row was written, and a multipart upload left unfinished this long after it began "
        "(by the bucket's clock) is aborted; longer than the slowest upload.",
    )
    blob_sweep_interval_s: float = Field(
        300.0, gt=0, description="How often a replica sweeps the bucket's orphans and released objects."
    )
    blob_timeout_s: float = Field(
        120.0,
        gt=0,
        description="The longest one request to the bucket may take (a part of an upload, a ranged read) before "
        "it fails with an error naming the bucket.",
    )

    cache_max_bytes: int | None = Field(
        None,
        gt=0,
        description="Team mode: the most bytes a replica keeps in its local cache of context bytes (data_dir/cache); "
        "past it, the least recently used files no run of this replica pins are removed at the heartbeat "
        "(fetched again when needed). Unset: no bound.",
    )

    @field_validator("blob_url")
    @classmethod
    def _check_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        return SecretStr(bucket_location(value.get_secret_value()).url)

    @property
    def location(self) -> BucketLocation | None:
        return bucket_location(self.blob_url.get_secret_value()) if self.blob_url else None
