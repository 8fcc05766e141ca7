"""One streaming pass over incoming bytes: hash, size cap, UTF-8 check, character count.

Runs in a worker thread. Memory stays at one chunk whatever the context size, except for
the JSON check, which must parse the document (see `JSON_FULL_PARSE_BYTES`).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlm_mcp.errors import BadArgumentError, context_too_large
from rlm_mcp.ports import ContextFormat, ContextKind

CHUNK = 1 << 20

# Parsing a JSON document costs several times its size in memory. Up to this size the
# document is parsed in full (exact validation and kind); above it only its first and last
# non-blank characters are checked ('[' ... ']' or '{' ... '}'), and a malformed document
# surfaces when the sandbox loads it. 256 MiB keeps the parse's peak memory near 2-3 GB.
JSON_FULL_PARSE_BYTES = 256 << 20


@dataclass
class Ingested:
    tmp_path: Path
    sha256: str
    bytes: int
    chars: int
    kind: ContextKind


def not_text(offset: int) -> BadArgumentError:
    return BadArgumentError(
        f"The data is not UTF-8 text (invalid byte at offset {offset}): binary data cannot be a context.",
        "Convert it to UTF-8 text first (PDFs, images and archives are not text); "
        "when uploading text bytes that are not safe in a JSON string, send them with encoding='base64'.",
    )


def read_file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            yield block


def ingest(
    chunks: Iterable[bytes],
    *,
    tmp_dir: Path,
    format: ContextFormat,
    max_bytes: int,
    expected_sha256: str | None = None,
    write: bool = True,
    existing: Path | None = None,
) -> Ingested:
    """Copy `chunks` to a new temp file in `tmp_dir` (or, with write=False, only scan them:
    `existing` is then the file that becomes the blob). The caller renames or deletes the
    returned temp file."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    total = 0
    chars = 0
    if write:
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="ingest-", suffix=".tmp")
        tmp_path = Path(name)
        out = os.fdopen(fd, "wb")
    else:
        assert existing is not None
        tmp_path = existing
        out = None
    try:
        for block in chunks:
            if total + len(block) > max_bytes:
                raise context_too_large(max_bytes)
            try:
                chars += len(decoder.decode(block))
            except UnicodeDecodeError as exc:
                raise not_text(total + exc.start) from None
            digest.update(block)
            if out is not None:
                out.write(block)
            total += len(block)
        try:
            chars += len(decoder.decode(b"", final=True))
        except UnicodeDecodeError as exc:
            raise not_text(total - (exc.end - exc.start)) from None
        if out is not None:
            out.close()
            out = None
        sha = digest.hexdigest()
        if expected_sha256 is not None and sha != expected_sha256.strip().lower():
            raise BadArgumentError(
                f"The data's sha256 is {sha}, not the {expected_sha256} that was given.",
                "Check the chunks: resend the final chunk with the right sha256 (or none), "
                "or start the upload again if a chunk was corrupted.",
            )
        kind: ContextKind = "str"
        if format == "json":
            kind = _json_kind(tmp_path, total)
        return Ingested(tmp_path=tmp_path, sha256=sha, bytes=total, chars=chars, kind=kind)
    except BaseException:
        if out is not None:
            out.close()
        if write:
            tmp_path.unlink(missing_ok=True)
        raise


def _json_kind(path: Path, size: int) -> Literal["list", "dict"]:
    fix = "Fix the document, or load it with format='text'."
    if size <= JSON_FULL_PARSE_BYTES:
        try:
            doc = json.loads(path.read_bytes())
        except json.JSONDecodeError as exc:
            raise BadArgumentError(
                f"The context is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.", fix
            ) from None
        if isinstance(doc, list):
            return "list"
        if isinstance(doc, dict):
            return "dict"
        raise BadArgumentError(
            f"A JSON context must be a list or an object, not a {type(doc).__name__}.",
            "Wrap the value in a list or an object, or load it with format='text'.",
        )
    first, last = _edge_chars(path)
    if (first, last) == ("[", "]"):
        return "list"
    if (first, last) == ("{", "}"):
        return "dict"
    raise BadArgumentError("The context is not a JSON list or object (it must start with '[' or '{').", fix)


def _edge_chars(path: Path) -> tuple[str, str]:
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip()
        fh.seek(max(0, path.stat().st_size - 4096))
        tail = fh.read().rstrip()
    return (chr(head[0]) if head else "", chr(tail[-1]) if tail else "")
