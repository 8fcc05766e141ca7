"""Issue 20 item 13: out of disk, quota or descriptors is said with its cause and fix, not as
"Internal error in rlm-mcp (OSError)" — in a tool call's error and in a background run's final
status alike."""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from rlm_mcp.assembly import make_stores
from rlm_mcp.config import Settings
from rlm_mcp.engine import RLMEngine, RunResult
from rlm_mcp.owners import LOCAL_OWNER
from rlm_mcp.ports.runs import RunRequest
from rlm_mcp.resource_errors import exhausted
from rlm_mcp.server.app import build_server
from rlm_mcp.service.run_queue import configured_owners
from rlm_mcp.service.runs import RunManager
from tests.fixtures_engine import FakeChatModel, FakeSandboxFactory, make_limits
from tests.fixtures_engine import make_settings as make_engine_settings
from tests.fixtures_surface import call, call_error, make_settings

pytestmark = pytest.mark.anyio


async def test_out_of_descriptors_is_said_with_the_fix(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, "http://127.0.0.1:9/v1")
    async with Client(build_server(settings)) as client:
        await call(client, "rlm_load_context", text="warm up: the store's folders and index exist")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        in_use = max(int(name) for name in os.listdir("/proc/self/fd")) + 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use, hard))
        holes = []  # fill the free numbers below the limit, so every new open fails: EMFILE
        try:
            while True:
                try:
                    holes.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    break
            message = await call_error(client, "rlm_load_context", text="one more context " * 100)
        finally:
            for fd in holes:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "Internal error" not in message
    assert "Too many open files" in message and "EMFILE" in message
    assert "ulimit" in message


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_or_quota_names_the_data_dir_and_the_fix(code: int) -> None:
    phrased = exhausted(OSError(code, os.strerror(code), "/data/contexts/blob.tmp"))
    assert phrased is not None
    assert "RLM_MCP_DATA_DIR" in str(phrased) and "/data/contexts/blob.tmp" in str(phrased)
    assert errno.errorcode[code] in str(phrased)
    assert exhausted(OSError(errno.EACCES, "denied")) is None


# --- a background run's final status (rlm_start): the same phrasing as a tool call's ------------


class _FailsOutsideTheLoop(RLMEngine):
    """An engine that fails before its loop's own handling (as the service's pins or a store's
    local cache write can): the service's last line of defence states the run's end."""

    def __init__(self, settings: Settings, error: OSError) -> None:
        super().__init__(settings.engine, FakeChatModel(), FakeSandboxFactory())
        self._error = error

    async def run(self, **kwargs: Any) -> RunResult:
        raise self._error


async def _background_run(tmp_path: Path, engine: Callable[[Settings], RLMEngine]) -> RunResult:
    settings = make_engine_settings(tmp_path)
    async with (
        make_stores(settings) as stores,
        RunManager(settings.runs, stores.contexts, stores.runs, owners=configured_owners(settings.server)) as runs,
    ):
        info = await stores.contexts.put_bytes(
            b"The magic number is 42.", name="ctx", format="text", source={"kind": "text"}, owner=LOCAL_OWNER
        )
        request = RunRequest(query="q", context_ids=[info.context_id], limits=make_limits(settings), owner=LOCAL_OWNER)
        run = await runs.start(request, engine(settings))
        await run.done.wait()
        assert run.result is not None
        return run.result


def _disk_full(settings: Settings) -> OSError:
    return OSError(
        errno.ENOSPC, os.strerror(errno.ENOSPC), str(settings.store.data_dir / "runs" / "x" / "events.jsonl")
    )


@pytest.mark.parametrize("where", ["in the loop", "outside the loop"])
async def test_a_background_run_on_a_full_disk_ends_with_the_cause_and_fix(tmp_path: Path, where: str) -> None:
    def engine(settings: Settings) -> RLMEngine:
        if where == "outside the loop":
            return _FailsOutsideTheLoop(settings, _disk_full(settings))
        # The root model's call fails with the OSError: the loop's own catch states the run's end.
        return RLMEngine(settings.engine, FakeChatModel(root=[_disk_full(settings)]), FakeSandboxFactory())

    result = await _background_run(tmp_path, engine)
    assert result.status == "error"
    assert result.reason is not None
    assert "internal error" not in result.reason
    assert "The disk is full" in result.reason and "ENOSPC" in result.reason
    assert "RLM_MCP_DATA_DIR" in result.reason and "events.jsonl" in result.reason


async def test_a_background_run_with_another_oserror_is_still_an_internal_error(tmp_path: Path) -> None:
    def engine(settings: Settings) -> RLMEngine:
        return _FailsOutsideTheLoop(settings, OSError(errno.EIO, "Input/output error"))

    result = await _background_run(tmp_path, engine)
    assert result.reason == "internal error: OSError: [Errno 5] Input/output error"
