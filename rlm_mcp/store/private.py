"""The data dir is private to the server's user.

It holds users' documents (context blobs, uploads) and what runs did (run logs). A data dir made
beforehand (by `mkdir` under the usual umask, by a deployment script) may be 0755, which left
every blob and log readable by other local users. Whoever writes to the data dir first calls
`private_dir`: 0700, fixed in place when the server's user owns it, else a refusal naming the fix.
Files the stores create are 0600 as well (`PRIVATE_FILE`).
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from rlm_mcp.errors import AccessDeniedError

__all__ = ["PRIVATE_FILE", "private_dir"]

PRIVATE_FILE = 0o600
_checked: set[str] = set()
_lock = threading.Lock()


def private_dir(path: Path) -> None:
    """Make `path` (created when missing) a 0700 folder, or raise naming the fix. Checked once
    per path and process (a cheap no-op afterwards)."""
    key = str(path)
    if key in _checked:
        return
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        try:
            os.chmod(path, 0o700)
        except PermissionError:
            raise AccessDeniedError(
                f"The data dir {path} is open to other users (mode {mode:o}) and this user cannot change that.",
                f"Run `chmod 700 {path}` as its owner, or point RLM_MCP_DATA_DIR at a folder of the server's user.",
            ) from None
    with _lock:
        _checked.add(key)
