"""What every loader shares: the result type, the allowed-roots rule, temp files."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm_mcp.config import LoadSettings, StoreSettings
from rlm_mcp.errors import AccessDeniedError, BadArgumentError


@dataclass
class Loaded:
    """A loader's output. `path` is a temp file the caller owns (store it with
    `ContextStore.put_file(..., consume=True)`, then call `cleanup()`), or `data` holds the bytes.
    `source` describes where the bytes came from, with a human `summary` line."""

    name: str
    source: dict[str, Any]
    path: Path | None = None
    data: bytes | None = None

    def cleanup(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def temp_file(store: StoreSettings) -> tuple[int, Path]:
    """A temp file in the data dir (not /tmp): it may be large, /tmp is often RAM-backed, and
    on the store's filesystem `put_file(consume=True)` can rename it instead of copying."""
    tmp_dir = Path(store.data_dir) / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="load-", suffix=".tmp")
    return fd, Path(name)


def resolved_roots(loads: LoadSettings) -> list[Path]:
    roots = []
    for root in loads.allowed_roots:
        try:
            roots.append(Path(root).expanduser().resolve(strict=False))
        except (OSError, RuntimeError):
            continue
    return roots


def _roots_text(roots: list[Path]) -> str:
    return ", ".join(str(r) for r in roots) or "none"


def denied_outside(path: str | Path, roots: list[Path]) -> AccessDeniedError:
    if not roots:
        return AccessDeniedError(
            f"'{path}' cannot be loaded: no folder is open to path and glob loads (RLM_MCP_ALLOWED_ROOTS is "
            "empty; a server with several tokens opens none unless it is set, since every token could read it).",
            "Send the text or upload it instead, or have the operator set RLM_MCP_ALLOWED_ROOTS.",
        )
    return AccessDeniedError(
        f"'{path}' is outside the allowed roots ({_roots_text(roots)}).",
        f"Load something under one of those roots, or add its folder to RLM_MCP_ALLOWED_ROOTS "
        f"(several roots are separated by '{os.pathsep}').",
    )


def hidden_part(resolved: Path, root: Path) -> str | None:
    """The first hidden component of `resolved` below `root` (the root's own components, hidden
    or not, are allowed: a root that names a hidden folder opts it in)."""
    for part in resolved.relative_to(root).parts:
        if part.startswith("."):
            return part
    return None


def check_allowed(resolved: Path, roots: list[Path], shown: str | Path | None = None) -> Path:
    """Return the root that allows `resolved` (an already resolved path), else raise.
    Among nested roots any one that allows it is enough."""
    shown = shown if shown is not None else resolved
    inside = [root for root in roots if resolved == root or resolved.is_relative_to(root)]
    if not inside:
        raise denied_outside(shown, roots)
    for root in inside:
        if hidden_part(resolved, root) is None:
            return root
    part = hidden_part(resolved, inside[0])
    raise AccessDeniedError(
        f"'{shown}' is inside a hidden entry ('{part}'); hidden files and folders are refused.",
        f"To allow one, add the hidden folder itself to RLM_MCP_ALLOWED_ROOTS (allowed roots now: {_roots_text(roots)}).",
    )


def absolute(path: str) -> Path:
    """`~` expanded; relative paths are refused, since the server's working directory means
    nothing to a chat client."""
    if not isinstance(path, str) or not path.strip():
        raise BadArgumentError("The path is empty.", "Pass an absolute path to a file or folder.")
    if "\0" in path:
        raise BadArgumentError("The path contains a NUL byte, which no file name can contain.", "Remove it.")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        raise BadArgumentError(
            "The path is not valid Unicode (it holds a lone surrogate).", "Send the path as valid UTF-8 text."
        ) from None
    expanded = Path(path.strip()).expanduser()
    if not expanded.is_absolute():
        raise BadArgumentError(
            f"'{path}' is a relative path; the server cannot tell what it is relative to.",
            "Pass an absolute path (or one starting with ~).",
        )
    return expanded


def resolve_allowed(path: str, loads: LoadSettings) -> tuple[Path, Path]:
    """(resolved path, its allowed root). Symlinks are resolved before the roots check. A
    missing path outside the roots is reported as outside, so the error does not reveal
    which paths exist there."""
    given = absolute(path)
    roots = resolved_roots(loads)
    try:
        resolved = given.resolve(strict=True)
    except FileNotFoundError:
        check_allowed(given.resolve(strict=False), roots, shown=path)
        raise BadArgumentError(
            f"'{path}' does not exist.", "Check the path (absolute, ~ is expanded) and load it again."
        ) from None
    except PermissionError:
        raise AccessDeniedError(
            f"'{path}' cannot be read: permission denied.", "Make it readable by the user running the server."
        ) from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop on older Pythons
        raise BadArgumentError(f"'{path}' cannot be resolved: {exc}.", "Check the path and its symlinks.") from None
    root = check_allowed(resolved, roots, shown=path)
    return resolved, root
