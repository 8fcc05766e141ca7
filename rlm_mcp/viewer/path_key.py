"""The random part of the viewer's cookie path.

Cookies are not bound to a port: a session cookie with `Path=/runs/` is also sent to any other
listener on the same host under `/runs/`, which could replay it. The viewer therefore also serves
its pages under `/runs/s/<key>/` and scopes the cookie to that path; another listener never
learns `<key>`, so the browser never sends it the cookie. The key is fixed per deployment: the
embedded server keeps it in the data dir (`viewer.key`, 0600), so servers sharing the data dir
share it and sessions survive nothing but the process, as before; in team mode every replica
derives it from the viewer key shared in the database (`path_key_from`, server/http.py).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

__all__ = ["KEY_FILE", "deployment_key", "random_key"]

KEY_FILE = "viewer.key"


def random_key() -> str:
    return secrets.token_hex(12)


def deployment_key(data_dir: Path) -> str:
    """The deployment's key: read from the data dir, or made there once."""
    path = Path(data_dir) / KEY_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
        if len(text) >= 16 and text.isalnum():
            return text
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    key = random_key()
    tmp = path.with_name(f".{KEY_FILE}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(key)
    try:
        os.link(tmp, path)  # first writer wins; a concurrent replica reads the winner's key
    except FileExistsError:
        return deployment_key(data_dir)
    finally:
        tmp.unlink(missing_ok=True)
    return key


def path_key_from(shared: bytes) -> str:
    """The cookie path's key derived from a key every replica shares (team mode), so a cookie set
    by one replica is sent to all of them; never the shared key itself."""
    return hashlib.sha256(b"rlm-mcp viewer cookie path\0" + shared).hexdigest()[:32]
