"""NUL characters and lone surrogates in what a caller names or asks (queries, names, ids, paths,
globs, URLs, patterns) are refused by the service, naming the argument, over both stores and
through the MCP surface (team mode used to answer "Internal error (DataError)")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from rlm_mcp.errors import BadArgumentError
from rlm_mcp.server.app import build_server
from rlm_mcp.service.arguments import check_text, check_texts
from tests.fixtures_surface import call, call_error, make_settings

pytestmark = pytest.mark.anyio

NUL = "\x00"
LONE = "\ud800"


def test_the_check_names_the_argument_the_character_and_where() -> None:
    with pytest.raises(BadArgumentError, match=r"`name` contains a NUL character \(U\+0000\) at position 3"):
        check_text("name", "abc\x00def")
    with pytest.raises(BadArgumentError, match=r"`query` contains a lone UTF-16 surrogate \(U\+DC00\) at position 1"):
        check_text("query", "a\udc00")
    with pytest.raises(BadArgumentError, match=r"`exclude\[1\]`"):
        check_texts("exclude", ["ok", "bad\x00"])
    check_text("text", "a body may hold a NUL \x00", nul_ok=True)  # positive controls
    check_text("name", "an emoji 😀 is a pair, not a lone half")
    check_text("name", None)
    with pytest.raises(BadArgumentError, match="lone UTF-16 surrogate"):
        check_text("text", "but never a lone half \ud800", nul_ok=True)


async def _refusal(client: Client, tool: str, argument: str, **args: Any) -> None:
    message = await call_error(client, tool, **args)
    assert f"`{argument}` contains a" in message, message
    assert "Internal error" not in message


async def test_nul_and_lone_surrogates_are_refused_through_the_tools(tmp_path: Path, database_url: str | None) -> None:
    settings = make_settings(tmp_path, "http://127.0.0.1:9/v1", database_url=database_url)
    async with Client(build_server(settings)) as client:
        ctx = await call(client, "rlm_load_context", text=f"a body with a NUL{NUL} is stored as it is")
        cid = ctx["context_id"]
        assert ctx["chars"] == len(f"a body with a NUL{NUL} is stored as it is")

        await _refusal(client, "rlm_load_context", "name", text="body", name=f"a{NUL}b")
        await _refusal(client, "rlm_load_context", "name", text="body", name=f"a{LONE}b")
        await _refusal(client, "rlm_load_context", "path", path=f"{tmp_path}/root/x{NUL}y")
        await _refusal(client, "rlm_load_context", "glob", glob=f"{tmp_path}/root/*{LONE}")
        await _refusal(client, "rlm_load_context", "url", url=f"https://example.com/{NUL}")
        await _refusal(client, "rlm_load_context", "include[0]", path=f"{tmp_path}/root", include=[f"*.md{NUL}"])
        await _refusal(client, "rlm_load_context", "text", text=f"half a pair {LONE}")
        await _refusal(client, "rlm_upload_context", "upload_id", data="x", index=1, upload_id=f"up{NUL}")
        await _refusal(client, "rlm_upload_context", "name", data="x", index=0, name=f"n{NUL}")
        await _refusal(client, "rlm_start", "query", query=f"what{NUL}?", context_id=cid)
        await _refusal(client, "rlm_start", "query", query=f"what{LONE}?", context_id=cid)
        await _refusal(client, "rlm_start", "context_id", query="q", context_id=f"{cid}{NUL}")
        await _refusal(client, "rlm_start", "context_id[1]", query="q", context_id=[cid, f"x{LONE}"])
        await _refusal(client, "rlm_complete", "query", query=f"what{NUL}?", context_id=cid)
        for tool in ("rlm_status", "rlm_result", "rlm_cancel"):
            await _refusal(client, tool, "run_id", run_id=f"run_{NUL}")
            await _refusal(client, tool, "run_id", run_id=f"run_{LONE}")
        await _refusal(client, "rlm_delete_context", "context_id", context_id=f"{cid}{NUL}")

        # Positive control: the same calls with clean arguments get past the check.
        unknown = await call_error(client, "rlm_status", run_id="run_0123456789abcdef0123")
        assert "Unknown run id" in unknown
        assert (await call(client, "rlm_delete_context", context_id=cid))["deleted"] is True
