"""Issue 20 item 19: the child interpreter that reads the reference's texts gets a minimal
environment (no API key, no tokens) and reads a private copy of a wheel source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlm_mcp.reference import ReferenceUnavailable, load_reference_texts


def test_the_reference_child_sees_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_MCP_API_KEY", "sk-secret")
    monkeypatch.setenv("RLM_MCP_AUTH_TOKENS", "alice-token")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    dump = tmp_path / "env.json"
    source = tmp_path / "source"
    for part in ("rlm", "rlm/utils", "rlm/core", "rlm/environments"):
        (source / part).mkdir(parents=True)
    # A stand-in for the reference's prompts module that records what the child can see.
    (source / "rlm/utils/prompts.py").write_text(
        f"import json, os\njson.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n"
    )
    with pytest.raises(ReferenceUnavailable):
        load_reference_texts(source)
    seen = json.loads(dump.read_text())
    assert not {k for k in seen if "KEY" in k or "TOKEN" in k or k.startswith("RLM_MCP_")}, seen
    assert "sk-secret" not in json.dumps(seen)
