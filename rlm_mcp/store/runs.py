"""Run records: `data_dir/runs/<run_id>/events.jsonl` (append-only) and `summary.json`.

Events are typed (`rlm_mcp.events`); each is stamped with its `ts` (Unix time) as it is
written, as the one JSON object per line that `rlm_mcp.events.to_json` makes of it. Both the size of one line
and of the whole log are bounded, because a run's cells can print without limit and the log
must never fill the disk: long strings in an oversize event are cut with a marker, and once
the log reaches its cap a single `{"type": "log_truncated"}` event is written and later
events are dropped (counted in the summary by the caller if it wishes).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import IO, Any

import anyio

from rlm_mcp.call_lines import CallLine
from rlm_mcp.config import StoreSettings
from rlm_mcp.errors import BadArgumentError, UnknownIdError
from rlm_mcp.events import EventKey, LoggedEvent, LogTruncated, RunEvent, loads, to_json
from rlm_mcp.file_work import INLINE_FILE_BYTES, small_here
from rlm_mcp.owners import OwnerScope, sees
from rlm_mcp.ports.runs import RunRecord
from rlm_mcp.store._db import in_thread
from rlm_mcp.store.event_lines import call_event_line, encode_event, event_line
from rlm_mcp.store.owner_caps import beyond_newest_per_owner
from rlm_mcp.store.private import PRIVATE_FILE, private_dir

log = logging.getLogger("rlm_mcp.store")

MAX_EVENT_BYTES = 256 << 10
MAX_LOG_BYTES = 64 << 20
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise BadArgumentError(
            f"'{run_id}' is not a valid run id.",
            "Run ids hold only letters, digits, '_' and '-'; use the run_id a run returned (rlm_start or rlm_complete).",
        )
    return run_id


def unknown_run(run_id: str) -> UnknownIdError:
    return UnknownIdError("run", run_id)


def _encode_summary(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False, default=str).encode("utf-8")


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: readers see the old file or the new one, never a part.

    The temporary file is named for this process and thread (a run's record has one writer at a
    time), not drawn at random: plain `os` calls, no file object and no unlink once renamed. The
    run's start and its answer each wait for one of these writes (0.2 ms less each on the 2-core
    VM under load than `mkstemp` and a file object)."""
    tmp = path.parent / f".summary-{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _open_events(run_dir: Path) -> IO[bytes]:
    fd = os.open(run_dir / "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_FILE)
    return os.fdopen(fd, "ab")


class RunLog:
    """The log of one run. Its file is opened by `open` (when the run starts; the first append
    opens it too), so a queued run holds no descriptor. Appends are
    serialised; each line is flushed, so readers see whole lines (a torn last line, after a
    crash, is skipped by `read_events`)."""

    def __init__(
        self,
        run_dir: Path,
        fh: IO[bytes] | None = None,
        *,
        created_at: float,
        max_event_bytes: int,
        max_log_bytes: int,
    ) -> None:
        self._dir = run_dir
        self._created_at = created_at
        self._fh: IO[bytes] | None = fh
        self._closed = False
        self._written = fh.tell() if fh is not None else 0
        self._max_event = max_event_bytes
        self._max_log = max_log_bytes
        self._truncated = False
        self._lock = anyio.Lock(fast_acquire=True)

    @property
    def run_id(self) -> str:
        return self._dir.name

    async def open(self) -> None:
        """Open the log's file (the run starts); a second call, or one after aclose, does nothing.
        Opened here, not in a worker thread: creating one file in a folder this run just made
        costs microseconds, the hop milliseconds on a loaded machine (the run waits for it)."""
        async with self._lock:
            if self._fh is None and not self._closed:
                fh = _open_events(self._dir)
                self._fh, self._written = fh, fh.tell()

    async def append(self, event: RunEvent) -> None:
        await self._append_line(event_line(event, self._max_event))

    async def append_call(self, call: CallLine) -> None:
        """`append(call.event())`: the same line, encoded without building the event's model."""
        await self._append_line(call_event_line(call, self._max_event))

    async def _append_line(self, line: bytes) -> None:
        if self._fh is None and not self._closed:
            await self.open()
        if len(line) <= INLINE_FILE_BYTES and not self._lock.locked():
            # A small append lands in the page cache in microseconds: written here, with no
            # await (a lock round or a worker-thread hop costs more than the write, and a turn
            # has several events). The lock only orders appends behind a large write in flight.
            self._write(line)
            return
        async with self._lock:
            if len(line) <= INLINE_FILE_BYTES:
                self._write(line)
            else:
                await in_thread(lambda: self._write(line))

    def _write(self, line: bytes) -> None:
        fh = self._fh
        if fh is None or self._truncated:
            return
        if self._written + len(line) > self._max_log:
            self._truncated = True
            line = encode_event(to_json(LogTruncated(ts=time.time(), max_bytes=self._max_log)), 1024)
        fh.write(line)
        fh.flush()
        self._written += len(line)

    async def write_summary(self, record: RunRecord) -> None:
        data = _encode_summary(record.to_stored())
        path = self._dir / "summary.json"
        await small_here(len(data), lambda: _write_atomic(path, data))

    async def aclose(self) -> None:
        """Close the log's file. Every line was flushed as it was written, so closing writes
        nothing: done here, with no await (no worker-thread hop on the run's last step, and
        nothing a cancellation could interrupt)."""
        self._closed = True
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()


def read_record(path: Path) -> RunRecord | None:
    """The record a summary.json holds; None when it is unreadable or no run record (logged)."""
    try:
        return RunRecord.from_stored(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:  # torn by hand, not JSON, not a record
        log.warning("skipping the unreadable run record %s: %s", path, exc)
        return None


class RunStore:
    def __init__(
        self, settings: StoreSettings, *, max_event_bytes: int = MAX_EVENT_BYTES, max_log_bytes: int = MAX_LOG_BYTES
    ) -> None:
        self._dir = Path(settings.data_dir) / "runs"
        self._max_event = max_event_bytes
        self._max_log = max_log_bytes

    def _run_dir(self, run_id: str) -> Path:
        return self._dir / check_run_id(run_id)

    async def create(self, record: RunRecord) -> RunLog:
        run_id = record.run_id
        run_dir = self._run_dir(run_id)
        created_at = record.created_at
        data = _encode_summary(record.to_stored())

        def work() -> None:
            private_dir(self._dir.parent)  # the data dir: 0700 (run logs say what users asked)
            self._dir.mkdir(parents=True, exist_ok=True)
            try:
                run_dir.mkdir()
            except FileExistsError:
                raise BadArgumentError(f"Run id '{run_id}' already exists.", "Use a new, unique run id.") from None
            _write_atomic(run_dir / "summary.json", data)

        await small_here(len(data), work)  # the events file waits for RunLog.open: a queued run holds no descriptor
        return RunLog(run_dir, created_at=created_at, max_event_bytes=self._max_event, max_log_bytes=self._max_log)

    async def read_summary(self, run_id: str, *, owner: OwnerScope) -> RunRecord:
        """The run's record; a run of another owner is unknown (EVERY_OWNER: the operator's
        view, every run). Records from before owners are the local user's."""
        path = self._run_dir(run_id) / "summary.json"

        def work() -> RunRecord:
            return self._summary_of(run_id, path, owner)

        return await in_thread(work)

    @staticmethod
    def _summary_of(run_id: str, path: Path, owner: OwnerScope) -> RunRecord:
        try:
            record = read_record(path)
        except FileNotFoundError:
            raise unknown_run(run_id) from None
        if record is None or not sees(owner, record.request.owner):
            raise unknown_run(run_id)
        return record

    async def read_events(self, run_id: str, *, owner: OwnerScope, limit_bytes: int | None = None) -> list[LoggedEvent]:
        """Events from the start of the log; with limit_bytes, only the whole lines that fit;
        `owner` as for read_summary. Lines of another version or torn by hand come back as
        `events.UnreadableEvent` (see `events.from_json`), never as an error."""
        path = self._run_dir(run_id) / "events.jsonl"
        summary_path = self._run_dir(run_id) / "summary.json"

        def work() -> list[LoggedEvent]:
            self._summary_of(run_id, summary_path, owner)
            events: list[LoggedEvent] = []
            used = 0
            try:
                with open(path, "rb") as fh:
                    for raw in fh:
                        if limit_bytes is not None and used + len(raw) > limit_bytes:
                            break
                        used += len(raw)
                        if not raw.endswith(b"\n"):
                            break  # a line still being written, or torn by a crash
                        try:
                            events.append(loads(raw))
                        except ValueError:  # not JSON, or not UTF-8
                            log.warning("skipping a malformed line in %s", path)
            except FileNotFoundError:  # only open() can raise it: the run has not started yet
                pass
            return events

        return await in_thread(work)

    async def events_after(
        self, run_id: str, *, owner: OwnerScope, after: EventKey | None, limit: int
    ) -> list[tuple[EventKey, LoggedEvent]]:
        """Events after `after` with their keys: attempt 0, the sequence is the line's index
        (a malformed line keeps its index, so keys never shift); `owner` as for read_summary."""
        path = self._run_dir(run_id) / "events.jsonl"
        summary_path = self._run_dir(run_id) / "summary.json"
        first = 0 if after is None or after.attempt < 0 else (after.seq + 1 if after.attempt == 0 else 1 << 62)

        def work() -> list[tuple[EventKey, LoggedEvent]]:
            self._summary_of(run_id, summary_path, owner)
            found: list[tuple[EventKey, LoggedEvent]] = []
            try:
                with open(path, "rb") as fh:
                    for seq, raw in enumerate(fh):
                        if not raw.endswith(b"\n") or len(found) >= limit:
                            break  # a line still being written (or torn by a crash), or enough
                        if seq < first:
                            continue
                        try:
                            found.append((EventKey(0, seq), loads(raw)))
                        except ValueError:  # not JSON, or not UTF-8
                            log.warning("skipping a malformed line in %s", path)
            except FileNotFoundError:  # the run has not started yet
                pass
            return found

        return await in_thread(work)

    async def version(self, run_id: str) -> str:
        """Changes whenever the run's log grows or its summary is rewritten (live viewers poll it)."""
        run_dir = self._run_dir(run_id)

        def work() -> str:
            try:
                summary = (run_dir / "summary.json").stat()
            except FileNotFoundError:
                raise unknown_run(run_id) from None
            try:
                size = (run_dir / "events.jsonl").stat().st_size
            except FileNotFoundError:
                size = 0
            return f"{size}-{summary.st_mtime_ns}"

        return await in_thread(work)

    async def prune(self, *, max_records: int, max_age_days: float) -> list[str]:
        """Remove the records of finished runs beyond each owner's newest `max_records` (one
        owner's many runs never remove another's), and every record untouched for
        `max_age_days` (0 turns the age cap off). Returns the run ids removed."""

        def work() -> list[str]:
            try:
                entries = [
                    e for e in os.scandir(self._dir) if e.is_dir(follow_symlinks=False) and _RUN_ID.match(e.name)
                ]
            except FileNotFoundError:
                return []
            now = time.time()
            finished: list[tuple[str, float, str]] = []
            doomed: list[str] = []
            for entry in entries:
                summary = Path(entry.path, "summary.json")
                try:
                    touched = summary.stat().st_mtime
                    record = read_record(summary)
                except OSError:
                    continue
                if record is None:
                    continue
                if max_age_days > 0 and now - touched > max_age_days * 86400:
                    doomed.append(entry.name)  # finished long ago, or its server died mid-run
                elif record.done:
                    finished.append((record.request.owner, touched, entry.name))
            doomed += beyond_newest_per_owner(finished, max_records)
            for name in doomed:
                shutil.rmtree(self._dir / name, ignore_errors=True)
            if doomed:
                log.info("pruned %d old run record(s)", len(doomed))
            return doomed

        return await in_thread(work)

    async def list(self, limit: int = 50, *, owner: OwnerScope) -> list[RunRecord]:
        """Records of `owner`'s runs, the most recently created first."""

        def work() -> list[RunRecord]:
            summaries: list[RunRecord] = []
            try:
                entries = list(os.scandir(self._dir))
            except FileNotFoundError:
                return []
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False) or not _RUN_ID.match(entry.name):
                    continue
                try:
                    record = read_record(Path(entry.path, "summary.json"))
                except OSError:
                    continue
                if record is not None and sees(owner, record.request.owner):
                    summaries.append(record)
            summaries.sort(key=lambda r: r.created_at, reverse=True)
            return summaries[: max(0, limit)]

        return await in_thread(work)
