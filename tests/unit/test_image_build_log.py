"""The slow step of the offline image build (debootstrap) runs with its output relayed as a few
progress lines, its pipe closed and the process reaped whether it succeeds or fails."""

from __future__ import annotations

import pytest

from rlm_mcp.errors import SandboxError
from rlm_mcp.sandbox.docker.image import _run_logged

SCRIPT = "echo 'I: Retrieving a'; echo 'I: Validating a'; echo 'I: Extracting base'; echo 'plain line'"


def test_progress_lines_are_relayed_without_the_noise() -> None:
    lines: list[str] = []
    _run_logged(["sh", "-c", SCRIPT], lines.append)
    # Retrieving/Validating lines only every 40th (the first is line 0); plain output never.
    assert lines == ["  Retrieving a", "  Extracting base"]


def test_a_failed_command_names_its_exit_and_last_lines() -> None:
    with pytest.raises(SandboxError) as caught:
        _run_logged(["sh", "-c", "echo 'E: mirror unreachable'; exit 3"], lambda line: None)
    assert "sh failed (exit 3): E: mirror unreachable" in caught.value.cause
    assert "mirror" in (caught.value.fix or "")
