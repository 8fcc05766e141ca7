"""Reading `RLM_MCP_PROMPT_PROFILE=file:PATH` safely.

The file is the system prompt of every run, read by the server with its own rights, so it is
checked like anything else that could be swapped: opened without blocking (a FIFO would hang
every run), it must be a regular file of at most `MAX_PROMPT_BYTES` (`/dev/zero` would fill the
memory) whose bytes read are exactly its size (`/proc/self/environ`, size 0 on stat, would send
the API key to the endpoint), and UTF-8. The settings check this at start; the run reads it again
through the same door.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["MAX_PROMPT_BYTES", "PromptFileError", "prompt_file_path", "read_prompt_file"]

MAX_PROMPT_BYTES = 256 * 1024


class PromptFileError(ValueError):
    """The prompt file cannot be used; the message says why (the caller names the setting)."""


def read_prompt_file(path: Path) -> str:
    """The text of a prompt file, or `PromptFileError` saying what is wrong with it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise PromptFileError(f"prompt file {path} does not exist") from None
    except OSError as exc:
        raise PromptFileError(f"prompt file {path} cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PromptFileError(f"prompt file {path} is not a regular file (a device, pipe or socket)")
        if info.st_size > MAX_PROMPT_BYTES:
            raise PromptFileError(f"prompt file {path} holds {info.st_size} bytes, over {MAX_PROMPT_BYTES}")
        data = b""
        while len(data) <= info.st_size:
            chunk = os.read(fd, info.st_size + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) != info.st_size or not data:
        raise PromptFileError(
            f"prompt file {path} is empty or not a plain file (its size on disk is {info.st_size} bytes)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PromptFileError(f"prompt file {path} is not UTF-8 text") from None
    if not text.strip():
        raise PromptFileError(f"prompt file {path} is empty")
    return text


def prompt_file_path(profile: str) -> Path | None:
    """The path of a `file:PATH` profile, else None."""
    name = (profile or "").strip()
    return Path(name[len("file:") :].strip()).expanduser() if name.startswith("file:") else None
