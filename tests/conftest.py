"""Shared pytest set-up. Layer-specific fixtures live in tests/fixtures_<layer>.py."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # The server runs on asyncio (uvicorn, the MCP SDK's stdio loop); test on the same backend.
    return "asyncio"
