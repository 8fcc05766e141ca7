"""Loading a file, a folder or a glob from the local filesystem (under the allowed roots)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio

from rlm_mcp.config import LoadSettings, StoreSettings
from rlm_mcp.errors import BadArgumentError, TooLargeError, context_too_large
from rlm_mcp.service.loaders.common import Loaded, absolute, resolve_allowed, temp_file
from rlm_mcp.service.loaders.folders import folder_source, no_files, pack, walk
from rlm_mcp.service.loaders.patterns import check_patterns, compile_glob, has_magic
from rlm_mcp.service.loaders.safe_open import ChangedError, FileOpener, Identity, identity

CHUNK = 1 << 20


async def load_path(
    path: str,
    *,
    loads: LoadSettings,
    store: StoreSettings,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
) -> Loaded:
    """A file (its bytes, as they are) or a folder (its text files, see `folders`). `loads`:
    what may be read; `store`: where the temp file goes and the largest context."""
    return await anyio.to_thread.run_sync(lambda: _load_path(path, loads, store, include, exclude))


def _load_path(
    path: str, loads: LoadSettings, store: StoreSettings, include: list[str] | None, exclude: list[str] | None
) -> Loaded:
    check_patterns(include, "include")
    check_patterns(exclude, "exclude")
    resolved, _root = resolve_allowed(path, loads)
    if resolved.is_dir():
        walked = walk(resolved, loads, shown=path, include=include, exclude=exclude)
        if not walked.files:
            raise no_files(path, walked)
        tmp, taken, size = pack(walked, store, shown=path)
        if taken == 0:
            tmp.unlink(missing_ok=True)
            raise no_files(path, walked)
        source = folder_source("folder", str(resolved), walked, taken, size, include=include, exclude=exclude)
        return Loaded(name=resolved.name or str(resolved), source=source, path=tmp)
    checked = resolved.stat()
    if not stat.S_ISREG(checked.st_mode):
        raise _not_regular(path)
    tmp, size = _copy_file(resolved, identity(checked), store)
    source = {"type": "path", "path": str(resolved), "bytes": size, "summary": f"1 file ({size} bytes)."}
    return Loaded(name=resolved.name, source=source, path=tmp)


def _not_regular(path: str | Path) -> BadArgumentError:
    return BadArgumentError(
        f"'{path}' is not a regular file or folder.", "Load a file or a folder (not a device, pipe or socket)."
    )


def _copy_file(src: Path, expected: Identity, store: StoreSettings) -> tuple[Path, int]:
    """Copy to a temp file the caller owns, so the store never renames or deletes a user's file
    and the bytes stored are the bytes checked (the original may change meanwhile). `src` is
    opened without following links or blocking, and must still be the inode `expected`."""
    limit = store.max_context_bytes
    try:
        with FileOpener() as opener:
            src_fd = opener.open(src, expected)
    except ChangedError as changed:
        if changed.reason == "not a regular file":
            raise _not_regular(src) from None
        raise BadArgumentError(
            f"'{src}' was replaced while it was being loaded.", "Load it again once it stops changing."
        ) from None
    except PermissionError:
        raise BadArgumentError(
            f"'{src}' cannot be read: permission denied.", "Make it readable by the server's user."
        ) from None
    with os.fdopen(src_fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise _file_too_large(src, limit)
        fd, tmp = temp_file(store)
        try:
            with os.fdopen(fd, "wb") as out:
                while block := fh.read(CHUNK):
                    if out.tell() + len(block) > limit:
                        raise _file_too_large(src, limit)
                    out.write(block)
                size = out.tell()
        except PermissionError:
            tmp.unlink(missing_ok=True)
            raise BadArgumentError(
                f"'{src}' cannot be read: permission denied.", "Make it readable by the server's user."
            ) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return tmp, size


def _file_too_large(src: Path, limit: int) -> TooLargeError:
    return context_too_large(limit, str(src), narrow="Load a part of it")


async def load_glob(
    pattern: str,
    *,
    loads: LoadSettings,
    store: StoreSettings,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
) -> Loaded:
    """Files matching an absolute glob (`~/src/**/*.py`), as one text context like a folder.

    The part before the first component with a glob character is the base folder (checked
    against the allowed roots); the rest is matched against paths relative to it, with `**`
    spanning folders. Headers show paths relative to the base folder."""
    return await anyio.to_thread.run_sync(lambda: _load_glob(pattern, loads, store, include, exclude))


def _load_glob(
    pattern: str, loads: LoadSettings, store: StoreSettings, include: list[str] | None, exclude: list[str] | None
) -> Loaded:
    check_patterns(include, "include")
    check_patterns(exclude, "exclude")
    expanded = absolute(pattern)
    parts = expanded.parts
    fixed = 0
    while fixed < len(parts) and not has_magic(parts[fixed]):
        fixed += 1
    if fixed == len(parts):
        return _load_path(pattern, loads, store, include, exclude)  # nothing to expand
    base = Path(*parts[:fixed])
    rest = "/".join(parts[fixed:])
    resolved, _root = resolve_allowed(str(base), loads)
    if not resolved.is_dir():
        raise BadArgumentError(f"'{base}' (the folder of the glob) is not a folder.", "Check the pattern.")
    selected = compile_glob(rest)
    max_depth = None if "**" in rest else rest.count("/") + 1
    walked = walk(
        resolved,
        loads,
        shown=pattern,
        select=selected.match,
        include=include,
        exclude=exclude,
        max_depth=max_depth,
    )
    if not walked.files:
        raise BadArgumentError(
            f"No file matches '{pattern}'"
            + (
                f" (skipped: {', '.join(f'{n} {r}' for r, n in sorted(walked.skipped.items()))})."
                if walked.skipped
                else "."
            ),
            "Check the pattern (absolute; `**` spans folders; hidden and binary files are never loaded).",
        )
    tmp, taken, size = pack(walked, store, shown=pattern)
    if taken == 0:
        tmp.unlink(missing_ok=True)
        raise no_files(pattern, walked)
    source = folder_source(
        "glob", str(resolved), walked, taken, size, pattern=pattern, include=include, exclude=exclude
    )
    return Loaded(name=pattern, source=source, path=tmp)
