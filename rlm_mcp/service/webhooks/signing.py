"""Standard Webhooks' signature: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, one per
secret, space-separated (a receiver that knows any of them verifies: a rotation)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence


def signature(secrets: Sequence[bytes], webhook_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for this message, signed with every secret."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode() for key in secrets
    )


def headers(secrets: Sequence[bytes], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers (and the JSON content type)."""
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secrets, webhook_id, timestamp, body),
    }
