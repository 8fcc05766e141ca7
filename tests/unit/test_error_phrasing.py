"""Store errors carry data; the layer that talks to the user phrases the fix in its terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm_mcp.cli import CLI_FIXES
from rlm_mcp.errors import NotFoundError, UnknownIdError
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER
from rlm_mcp.server.tool_calls import for_mcp
from rlm_mcp.store import ContextStore, RunStore
from rlm_mcp.testing.settings import make_settings
from tests.fixtures_store import sections

pytestmark = pytest.mark.anyio


async def test_the_store_names_the_unknown_id_and_no_tool(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with pytest.raises(UnknownIdError) as ctx_err:
        await ContextStore(settings.store).get("ctx_nope", owner=LOCAL_OWNER)
    with pytest.raises(UnknownIdError) as run_err:
        await RunStore(settings.store).read_summary("run_nope", owner=EVERY_OWNER)
    assert (ctx_err.value.kind, ctx_err.value.key) == ("context", "ctx_nope")
    assert (run_err.value.kind, run_err.value.key) == ("run", "run_nope")
    for err in (ctx_err.value, run_err.value):
        assert isinstance(err, NotFoundError)
        assert "rlm_" not in str(err) and "rlm-mcp" not in str(err)


def test_each_audience_gets_its_own_fix() -> None:
    err = UnknownIdError("run", "run_x")
    assert for_mcp(err) == "Unknown run id 'run_x'. Use a run_id returned by rlm_start or rlm_complete."
    assert str(err.phrased(CLI_FIXES)) == "Unknown run id 'run_x'. List run records with `rlm-mcp runs list`."
    assert "rlm_list_contexts" in for_mcp(UnknownIdError("context", "c"))
    assert "chunk index 0" in for_mcp(UnknownIdError("upload", "u", detail=" (expired)"))


async def test_every_loader_over_the_context_cap_names_the_same_setting(tmp_path: Path) -> None:
    # One rule, one phrasing: a stored value and a loaded file over RLM_MCP_MAX_CONTEXT_BYTES say so alike.
    from rlm_mcp.errors import TooLargeError
    from rlm_mcp.service.loaders.paths import load_path

    settings = make_settings(tmp_path, max_context_bytes=10, allowed_roots=[tmp_path])
    big = tmp_path / "big.txt"
    big.write_text("x" * 11)
    with pytest.raises(TooLargeError) as stored:
        await ContextStore(settings.store).put_bytes(b"x" * 11, name="big", format="text", source={}, owner=LOCAL_OWNER)
    with pytest.raises(TooLargeError) as loaded:
        await load_path(str(big), **sections(settings))
    for err in (stored.value, loaded.value):
        assert err.cause.endswith("is larger than RLM_MCP_MAX_CONTEXT_BYTES (10 bytes).")
        assert err.fix is not None and err.fix.endswith("or raise RLM_MCP_MAX_CONTEXT_BYTES.")
    assert f"'{big}'" in loaded.value.cause
