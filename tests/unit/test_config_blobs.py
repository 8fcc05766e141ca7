"""RLM_MCP_BLOB_URL: a bucket and a prefix, never credentials (they come from AWS_*); a bucket's
refusals phrased as what they are (full or over quota, refused, unreachable) without a secret."""

from __future__ import annotations

import pytest

from rlm_mcp.config import load_settings
from rlm_mcp.config.blobs import bucket_location
from rlm_mcp.config_check import SettingsError


def test_a_bucket_url_gives_the_bucket_and_its_prefix() -> None:
    assert bucket_location("s3://team-bytes/rlm/prod/").bucket == "team-bytes"
    assert bucket_location("s3://team-bytes/rlm/prod/").prefix == "rlm/prod"
    assert bucket_location("s3://team-bytes").url == "s3://team-bytes"
    assert load_settings(blob_url=" ").blobs.blob_url is None  # unset: the rows


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@team-bytes/rlm", "must not carry credentials"),
        ("s3://AKIAEXAMPLE@team-bytes/rlm", "must not carry credentials"),
        ("https://team-bytes.s3.amazonaws.com/rlm", "must be s3://bucket/prefix"),
        ("s3://team-bytes/rlm?endpoint=http://x", "takes no query"),
        ("s3:///rlm", "must name a bucket"),
    ],
)
def test_a_bucket_url_with_credentials_or_another_shape_is_refused_without_echoing_it(url: str, says: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(blob_url=url)
    text = str(caught.value)
    assert "RLM_MCP_BLOB_URL" in text and says in text
    assert "wJalrXUtnFEMI" not in text and "AKIAEXAMPLE" not in text


def test_a_full_bucket_is_named_as_such_and_its_secret_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("obstore")  # the team extra; the test group has it
    from rlm_mcp.config.blobs import BucketLocation
    from rlm_mcp.store.bucket import Bucket, BucketFullError

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "topsecret-value")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    bucket = Bucket(BucketLocation("team-bytes", "rlm"), timeout_s=5.0)
    full = bucket.error(RuntimeError("QuotaExceeded: key AKIAEXAMPLE secret topsecret-value"), "write to")
    assert isinstance(full, BucketFullError)
    assert "The bucket s3://team-bytes/rlm is full or over its quota" in str(full)
    assert "topsecret-value" not in str(full) and "AKIAEXAMPLE" not in str(full)
    refused = bucket.error(RuntimeError("403 Forbidden: SignatureDoesNotMatch"), "read from")
    assert "refused this server" in str(refused) and not isinstance(refused, BucketFullError)


def test_without_the_s3_client_a_bucket_url_is_one_line_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from rlm_mcp.config.blobs import BucketLocation
    from rlm_mcp.errors import RlmMcpError
    from rlm_mcp.store.bucket import Bucket

    monkeypatch.setitem(sys.modules, "obstore.store", None)  # as if obstore were not installed
    with pytest.raises(RlmMcpError) as caught:
        Bucket(BucketLocation("team-bytes", "rlm"), timeout_s=5.0)
    assert "the S3 client is not installed (obstore.store)" in caught.value.cause
    assert "team extra" in (caught.value.fix or "") and "RLM_MCP_BLOB_URL" in (caught.value.fix or "")
