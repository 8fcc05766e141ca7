"""The Claude Desktop bundle (`rlm-mcp.mcpb`, MCPB manifest 0.4), generated like `server.json`.

`server.type` is `uv`: the bundle carries a tiny `pyproject.toml` that depends on the released
`rlm-mcp` and the host installs it with uv. A `python` bundle would have to vendor every
dependency, including compiled ones (pydantic-core, aiohttp), once per platform and Python
version; `uv` keeps the bundle a few kilobytes and the same on every platform. The bundle still
needs Docker on the machine (the sandboxes), which no bundle can carry.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp import __version__
from rlm_mcp.publish.inputs import PACKAGE, repository_url, setting_inputs

# The settings the bundle's install dialog asks for (a subset of inputs.CLIENT_SETTINGS: a field
# left empty reaches the server as "", which suits only text settings with a usable default).
BUNDLE_SETTINGS = ("base_url", "model", "api_key", "allowed_roots")
ENTRY_POINT = "src/server.py"
SERVER_PY = '''"""Entry point of the rlm-mcp Claude Desktop bundle: the released package's stdio server."""

from rlm_mcp.cli import main

raise SystemExit(main([]))
'''


async def _tools() -> list[dict[str, str]]:
    from rlm_mcp.config import Settings
    from rlm_mcp.server.app import build_server

    with tempfile.TemporaryDirectory() as data_dir:  # declares the tools; starts and writes nothing
        server = build_server(Settings.model_validate({"data_dir": data_dir}), mode="stdio")
        tools = await server.list_tools()
    return [{"name": t.name, "description": (t.description or "").split("\n")[0].strip()} for t in tools]


def manifest() -> dict[str, Any]:
    inputs = {s.field: s for s in setting_inputs() if s.field in BUNDLE_SETTINGS}
    user_config: dict[str, Any] = {}
    env: dict[str, str] = {}
    for name in BUNDLE_SETTINGS:
        s = inputs[name]
        entry: dict[str, Any] = {
            "type": "directory" if name == "allowed_roots" else "number" if s.form == "number" else "string",
            "title": s.env,
            "description": s.description,
            "required": s.required,
        }
        if s.default is not None:
            entry["default"] = s.default
        if s.secret:
            entry["sensitive"] = True
        user_config[name] = entry
        env[s.env] = f"${{user_config.{name}}}"
    return {
        "manifest_version": "0.4",
        "name": PACKAGE,
        "display_name": "rlm-mcp: Recursive Language Models",
        "version": __version__,
        "description": "Answer questions over huge files and folders with a Recursive Language Model.",
        "long_description": (
            "A root LM on your OpenAI-compatible endpoint (vLLM, Ollama, OpenAI, ...) writes Python "
            "against the context in a hardened Docker sandbox. Docker must be installed and running "
            "on this machine; the bundle cannot carry it."
        ),
        "author": {"name": "The rlm-mcp authors"},
        "repository": {"type": "git", "url": repository_url()},
        "license": "MIT",
        "keywords": ["rlm", "recursive-language-models", "long-context", "sandbox"],
        "server": {
            "type": "uv",
            "entry_point": ENTRY_POINT,
            "mcp_config": {"command": "uv", "args": ["run", "--directory", "${__dirname}", ENTRY_POINT], "env": env},
        },
        "tools": anyio.run(_tools),
        "compatibility": {"platforms": ["darwin", "linux", "win32"], "runtimes": {"python": ">=3.11"}},
        "user_config": user_config,
    }


def pyproject() -> str:
    return (
        "[project]\n"
        'name = "rlm-mcp-bundle"\n'
        f'version = "{__version__}"\n'
        'description = "The rlm-mcp Claude Desktop bundle: the released rlm-mcp, run by uv."\n'
        'requires-python = ">=3.11"\n'
        f'dependencies = ["{PACKAGE}=={__version__}"]\n'
    )


def write_bundle_dir(folder: Path) -> Path:
    """The bundle's files, unpacked (what `mcpb pack` takes)."""
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "pyproject.toml").write_text(pyproject(), encoding="utf-8")
    (folder / ENTRY_POINT).write_text(SERVER_PY, encoding="utf-8")
    (folder / ".mcpbignore").write_text(".venv/\n__pycache__/\n*.pyc\nuv.lock\n", encoding="utf-8")
    return folder


def write_bundle(output: Path) -> Path:
    """`rlm-mcp.mcpb`: a zip of the bundle's files with manifest.json at its root."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest(), indent=2, ensure_ascii=False) + "\n")
        z.writestr("pyproject.toml", pyproject())
        z.writestr(ENTRY_POINT, SERVER_PY)
    return output
