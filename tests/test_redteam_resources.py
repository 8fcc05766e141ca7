"""Issue 20 item 13: out of disk, quota or descriptors is said with its cause and fix, not as
"Internal error in rlm-mcp (OSError)"."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import pytest
from mcp import Client

from rlm_mcp.resource_errors import exhausted
from rlm_mcp.server.app import build_server
from tests.test_server_surface import call, call_error, make_settings

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
