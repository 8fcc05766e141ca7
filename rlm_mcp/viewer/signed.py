"""Viewer login codes and sessions that every replica accepts (team mode).

With one process, codes and sessions are random ids kept in memory (`auth.ViewerAuth`). Behind a
load balancer the browser's next request may reach another replica, so in team mode they are
signed instead: `<payload>.<HMAC-SHA256>` with a key all replicas share (generated once and kept
in the database), carrying the kind (code or session), the owner and the expiry. Nothing secret
is in the payload (the owner id is a hash of a token, never the token). A code is spent once in
its minute of life, on whichever replica opens it first (`rlm_mcp.store.pg.spent_codes`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Literal

Kind = Literal["code", "session"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(key: bytes, kind: Kind, owner: str, ttl_s: float) -> str:
    payload = _b64(json.dumps({"k": kind, "o": owner, "e": time.time() + ttl_s, "n": secrets.token_hex(8)}).encode())
    mac = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{_b64(mac)}"


def verify(key: bytes, kind: Kind, token: str | None) -> tuple[str, float] | None:
    """(owner, expiry) of a valid, unexpired token of this kind; None otherwise."""
    if not token or token.count(".") != 1:
        return None
    payload, mac = token.split(".")
    try:
        # The MAC's one encoding, compared as text: decoding the given one instead would accept
        # others (the last character's two unused bits, characters outside the alphabet, which
        # the decoder drops), so one session would have several cookies that all open it.
        expected = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected.encode(), mac.encode()):
            return None
        data = json.loads(_unb64(payload))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("k") != kind or not isinstance(data.get("o"), str):
        return None
    expiry = data.get("e")
    if not isinstance(expiry, (int, float)) or expiry <= time.time():
        return None
    return data["o"], float(expiry)
