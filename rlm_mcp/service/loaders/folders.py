"""A folder (or a glob's matches) becomes ONE text context.

Format: files in sorted order of their relative POSIX path, each as

    ==> relative/path.py <==
    <the file's text, with a final newline added if it had none>
    <one empty line>

(the header is the one `head`/`tail` print for several files, which models know well).

Walking: hidden entries (names starting with '.') are skipped; symlinked folders are not
followed (loops, escapes); a symlinked file is taken only when its resolved target is inside
an allowed root and not hidden; binary files (a NUL byte in the first 8 KiB, or invalid UTF-8
anywhere) are skipped. Files are read through `safe_open`: one replaced after the walk (by a
link, a FIFO, another file) is skipped as "changed during load", never followed or waited on. Limits are errors, not silent partial contexts, because an answer
computed over part of a folder would look complete: more than `max_files` matching files, or
more than `max_context_bytes` of output, raise TooLargeError with the fix.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm_mcp.config import LoadSettings, StoreSettings
from rlm_mcp.errors import AccessDeniedError, BadArgumentError, context_too_large, too_many_files
from rlm_mcp.service.loaders.common import check_allowed, resolved_roots, temp_file
from rlm_mcp.service.loaders.patterns import any_match, prunes_folder
from rlm_mcp.service.loaders.safe_open import ChangedError, FileOpener, Identity, identity, open_dir

SNIFF_BYTES = 8192
CHUNK = 1 << 20
EXAMPLES = 3


@dataclass(frozen=True)
class Found:
    rel: str  # relative path, as shown in the header
    real: Path  # where to read it (a symlink's resolved target)
    ident: Identity  # the inode seen by the walk: the one read, or the file is skipped


@dataclass
class Walk:
    files: list[Found] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, rel: str) -> None:
        self.skipped[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES:
            shown.append(rel)


def walk(
    base: Path,
    loads: LoadSettings,
    *,
    shown: str,
    select: Callable[[str], bool] | None = None,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    max_depth: int | None = None,
) -> Walk:
    """Collect the files under `base` (already resolved and allowed). `select` is a glob's own
    test: files it rejects are simply not part of the load, so they are not counted."""
    roots = resolved_roots(loads)
    result = Walk()
    max_files = loads.max_files
    stack: list[tuple[Path, str, int]] = [(base, "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            entries = _list_folder(folder)
        except ChangedError as changed:
            result.skip(changed.reason, prefix or ".")
            continue
        except OSError:
            result.skip("unreadable", prefix or ".")
            continue
        for name, lstat in entries:
            rel = f"{prefix}{name}"
            if name.startswith("."):
                result.skip("hidden", rel)
                continue
            try:
                real, is_dir, ident = _classify(folder / name, lstat, roots)
            except _Skip as skip:
                result.skip(skip.reason, rel)
                continue
            if is_dir:
                if prunes_folder(exclude, rel):
                    result.skip("excluded folder", rel)
                elif max_depth is None or depth + 1 < max_depth:
                    stack.append((real, rel + "/", depth + 1))
                continue
            if select is not None and not select(rel):
                continue
            if (include and not any_match(include, rel)) or any_match(exclude, rel):
                result.skip("excluded", rel)
                continue
            result.files.append(Found(rel, real, ident))
            if len(result.files) > max_files:
                raise too_many_files(shown, max_files)
    result.files.sort(key=lambda f: f.rel)
    return result


def _list_folder(folder: Path) -> list[tuple[str, os.stat_result | None]]:
    """(name, lstat or None when it vanished) of each entry of `folder`, listed through a
    descriptor opened without following links (a folder swapped for a symlink after its
    parent was listed is not entered). Stats are taken while the descriptor is open."""
    fd = open_dir(folder)
    try:
        out: list[tuple[str, os.stat_result | None]] = []
        for name in os.listdir(fd):
            try:
                out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            except OSError:
                out.append((name, None))
        return out
    finally:
        os.close(fd)


class _Skip(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _classify(path: Path, lstat: os.stat_result | None, roots: list[Path]) -> tuple[Path, bool, Identity]:
    """(path to read, is a folder, inode) or _Skip."""
    if lstat is None:
        raise _Skip("unreadable")
    if stat.S_ISLNK(lstat.st_mode):
        try:
            target = path.resolve(strict=True)
            st = target.stat()
        except (OSError, RuntimeError):
            raise _Skip("broken symlink") from None
        if stat.S_ISDIR(st.st_mode):
            raise _Skip("symlinked folder")
        try:
            check_allowed(target, roots)
        except AccessDeniedError:
            raise _Skip("symlink outside allowed roots") from None
        if not stat.S_ISREG(st.st_mode):
            raise _Skip("not a regular file")
        return target, False, identity(st)
    if stat.S_ISDIR(lstat.st_mode):
        return path, True, identity(lstat)
    if stat.S_ISREG(lstat.st_mode):
        return path, False, identity(lstat)
    raise _Skip("not a regular file")


def pack(walked: Walk, store: StoreSettings, *, shown: str) -> tuple[Path, int, int]:
    """Write the files into one temp file in the format above: (temp path, files taken, bytes)."""
    fd, tmp = temp_file(store)
    limit = store.max_context_bytes
    taken = 0
    try:
        with os.fdopen(fd, "wb") as out, FileOpener() as opener:
            for found in walked.files:
                start = out.tell()
                reason = _append_file(out, found, opener, limit, shown)
                if reason is None:
                    taken += 1
                else:
                    out.seek(start)
                    out.truncate()
                    walked.skip(reason, found.rel)
            size = out.tell()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, taken, size


def _append_file(out: Any, found: Found, opener: FileOpener, limit: int, shown: str) -> str | None:
    """Append one file; return a skip reason instead when it is not text, or not the file walked."""
    rel = found.rel
    try:
        fd = opener.open(found.real, found.ident)
    except ChangedError as changed:
        return changed.reason
    except OSError:
        return "unreadable"
    with os.fdopen(fd, "rb") as fh:
        block = fh.read(SNIFF_BYTES)
        if b"\0" in block:
            return "binary"
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        out.write(f"==> {rel} <==\n".encode())
        last = b""
        while block:
            try:
                decoder.decode(block)
            except UnicodeDecodeError:
                return "binary"
            if out.tell() + len(block) + 2 > limit:
                raise context_too_large(
                    limit, shown, reached_at=rel, narrow="Narrow it with include/exclude patterns or a subfolder"
                )
            out.write(block)
            last = block[-1:]
            block = fh.read(CHUNK)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return "binary"
    if last and last != b"\n":
        out.write(b"\n")
    out.write(b"\n")
    return None


def folder_source(kind: str, shown: str, walked: Walk, taken: int, size: int, **extra: Any) -> dict[str, Any]:
    skipped = dict(sorted(walked.skipped.items()))
    parts = [f"{taken} file{'s' if taken != 1 else ''} taken ({size} bytes)"]
    if skipped:
        parts.append("skipped: " + ", ".join(f"{n} {reason}" for reason, n in skipped.items()))
    return {
        "type": kind,
        "path": shown,
        **extra,
        "files": taken,
        "bytes": size,
        "skipped": skipped,
        "skipped_examples": {k: v for k, v in sorted(walked.examples.items())},
        "file_header": "==> relative/path <==",
        "summary": "; ".join(parts) + ".",
    }


def no_files(shown: str, walked: Walk) -> BadArgumentError:
    skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(walked.skipped.items()))
    return BadArgumentError(
        f"No text file to load in '{shown}'" + (f" (skipped: {skipped})." if skipped else "."),
        "Check the path and the include/exclude patterns; hidden and binary files are never loaded.",
    )
