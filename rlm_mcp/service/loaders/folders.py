"""A folder (or a glob's matches) becomes ONE text context.

Format: files in sorted order of their relative POSIX path, each as

    ==> relative/path.py <==
    <the file's text, with a final newline added if it had none>
    <one empty line>

(the header is the one `head`/`tail` print for several files, which models know well).

Walking: hidden entries (names starting with '.') are skipped; symlinked folders are not
followed (loops, escapes); a symlinked file is taken only when its resolved target is inside
an allowed root and not hidden; binary files (a NUL byte in the first 8 KiB, or invalid UTF-8
anywhere) are skipped. Limits are errors, not silent partial contexts, because an answer
computed over part of a folder would look complete: more than `max_files` matching files, or
more than `max_context_bytes` of output, raise TooLargeError with the fix.
"""

from __future__ import annotations

import codecs
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm_mcp.config import Settings
from rlm_mcp.errors import AccessDeniedError, BadArgumentError, TooLargeError
from rlm_mcp.service.loaders.common import check_allowed, resolved_roots, temp_file
from rlm_mcp.service.loaders.patterns import any_match, prunes_folder

SNIFF_BYTES = 8192
CHUNK = 1 << 20
EXAMPLES = 3


@dataclass
class Walk:
    files: list[tuple[str, Path]] = field(default_factory=list)  # (relative path, real path)
    skipped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, rel: str) -> None:
        self.skipped[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES:
            shown.append(rel)


def walk(
    base: Path,
    settings: Settings,
    *,
    shown: str,
    select: Callable[[str], bool] | None = None,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    max_depth: int | None = None,
) -> Walk:
    """Collect the files under `base` (already resolved and allowed). `select` is a glob's own
    test: files it rejects are simply not part of the load, so they are not counted."""
    roots = resolved_roots(settings)
    result = Walk()
    max_files = settings.max_files
    stack: list[tuple[Path, str, int]] = [(base, "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            result.skip("unreadable", prefix or ".")
            continue
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            if entry.name.startswith("."):
                result.skip("hidden", rel)
                continue
            try:
                real, is_dir = _classify(entry, roots)
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
            result.files.append((rel, real))
            if len(result.files) > max_files:
                raise TooLargeError(
                    f"'{shown}' holds more than {max_files} files to load.",
                    "Narrow it with include/exclude patterns or a subfolder, or raise RLM_MCP_MAX_FILES.",
                )
    result.files.sort(key=lambda f: f[0])
    return result


class _Skip(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _classify(entry: os.DirEntry[str], roots: list[Path]) -> tuple[Path, bool]:
    """(path to read, is a folder) or _Skip."""
    if entry.is_symlink():
        try:
            target = Path(entry.path).resolve(strict=True)
        except (OSError, RuntimeError):
            raise _Skip("broken symlink") from None
        if target.is_dir():
            raise _Skip("symlinked folder")
        try:
            check_allowed(target, roots)
        except AccessDeniedError:
            raise _Skip("symlink outside allowed roots") from None
        if not target.is_file():
            raise _Skip("not a regular file")
        return target, False
    if entry.is_dir(follow_symlinks=False):
        return Path(entry.path), True
    if entry.is_file(follow_symlinks=False):
        return Path(entry.path), False
    raise _Skip("not a regular file")


def pack(walked: Walk, settings: Settings, *, shown: str) -> tuple[Path, int, int]:
    """Write the files into one temp file in the format above: (temp path, files taken, bytes)."""
    fd, tmp = temp_file(settings)
    limit = settings.max_context_bytes
    taken = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for rel, real in walked.files:
                start = out.tell()
                reason = _append_file(out, rel, real, limit, shown)
                if reason is None:
                    taken += 1
                else:
                    out.seek(start)
                    out.truncate()
                    walked.skip(reason, rel)
            size = out.tell()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, taken, size


def _append_file(out: Any, rel: str, real: Path, limit: int, shown: str) -> str | None:
    """Append one file; return a skip reason instead when it is not text."""
    try:
        fh = open(real, "rb")
    except OSError:
        return "unreadable"
    with fh:
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
                raise TooLargeError(
                    f"'{shown}' holds more than RLM_MCP_MAX_CONTEXT_BYTES ({limit} bytes) of text "
                    f"(reached while adding '{rel}').",
                    "Narrow it with include/exclude patterns or a subfolder, or raise RLM_MCP_MAX_CONTEXT_BYTES.",
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
