"""Importing the engine loads no HTTP client: it talks to the LM through the chat contract
(rlm_mcp.ports.chat), which the LM layer implements."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_engine_loads_no_http_client() -> None:
    code = "import rlm_mcp.engine, sys; print(sorted({'aiohttp', 'httpx'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_lm_layer_still_loads_its_client_as_a_positive_control() -> None:
    # The LM layer imports aiohttp with its first pool (tests/unit/test_startup_imports.py), so
    # the control makes one.
    code = (
        "import asyncio, sys\n"
        "from rlm_mcp.lm.http import HttpPool\n"
        "async def pool():\n"
        "    await HttpPool(headers={}, timeout_s=1.0, connect_s=1.0, trust_env=False).aclose()\n"
        "asyncio.run(pool())\n"
        "print(sorted({'aiohttp'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['aiohttp']", out.stdout + out.stderr
