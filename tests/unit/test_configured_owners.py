"""A team worker's owner share counts the tokens without reading the tokens file at every claim
(issue 37 item 5): the file is read again only when it changes, and a token added to it counts
from the next claim on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm_mcp import access
from rlm_mcp.config import ServerSettings, Settings
from rlm_mcp.service.queue.rules import queue_rules


def test_the_share_is_read_once_and_again_when_the_tokens_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alpha-token-0000000000000000\n")
    reads: list[Path] = []
    real = access.load_tokens

    def counted(settings: ServerSettings) -> list[str]:
        reads.append(tokens)
        return real(settings)

    monkeypatch.setattr("rlm_mcp.service.run_queue.load_tokens", counted)
    rules = queue_rules(Settings(auth_tokens_file=tokens, data_dir=tmp_path / "data").queue)

    assert [rules.share(4) for _ in range(5)] == [4] * 5  # one owner: every slot
    assert len(reads) == 1

    tokens.write_text("alpha-token-0000000000000000\nbeta-token-00000000000000000\n")
    stat = tokens.stat()
    os.utime(tokens, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new mtime whatever the clock
    assert rules.share(4) == 2  # two owners: half each
    assert rules.share(4) == 2
    assert len(reads) == 2
