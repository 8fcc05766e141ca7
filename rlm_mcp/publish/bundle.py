"""The Claude Desktop bundle (`rlm-mcp.mcpb`, MCPB manifest 0.4), generated like `server.json`.

`server.type` is `uv`: the bundle carries a tiny `pyproject.toml` and the host installs it with
uv. A `python` bundle would have to vendor every dependency, including compiled ones
(pydantic-core, aiohttp), once per platform and Python version; `uv` keeps the bundle small and
the same on every platform. The bundle still needs Docker on the machine (the sandboxes), which
no bundle can carry.

Supply chain: the bundle carries rlm-mcp's own wheel (`wheels/`, the file this checkout built)
and a `uv.lock` made when the bundle is made, which pins every other package to one version and
its sha256 hashes; the server starts with `uv run --frozen`, so install day installs exactly the
lock, verified, and no package index is asked for `rlm-mcp` itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp import __version__
from rlm_mcp.publish.inputs import PACKAGE, repository_url, setting_inputs

# The settings the bundle's install dialog asks for (a subset of inputs.CLIENT_SETTINGS; a field
# left empty reaches the server as "" or an unexpanded placeholder, which it reads as unset).
BUNDLE_SETTINGS = ("base_url", "model", "api_key", "allowed_roots")
# What the install dialog shows for each: a title and a sentence for a person, not a variable name.
DIALOG = {
    "base_url": (
        "LM endpoint",
        "The OpenAI-compatible endpoint the models are served from, ending in /v1 "
        "(vLLM: http://localhost:8000/v1; Ollama: http://localhost:11434/v1).",
    ),
    "model": ("Root model", "The model that writes the code (rlm-v0.1: the RLM-trained adapter on vLLM)."),
    "api_key": ("API key", "The endpoint's API key, if it needs one; leave empty for a local server."),
    "allowed_roots": (
        "Folder it may read",
        "Files and folders under this folder can be loaded as contexts (default: your home folder).",
    ),
}
ENTRY_POINT = "src/server.py"
WHEELS = "wheels"
# Claude Desktop runs on macOS and Windows; the bundle is tested here on Linux only (by starting it
# as its manifest says), and macOS is untested; Windows is not declared: nothing here has tried it.
PLATFORMS = ["darwin", "linux"]
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
    # The whole description, as a client sees it over MCP (whitespace folded for the dialog).
    return [{"name": t.name, "description": " ".join((t.description or "").split())} for t in tools]


def manifest() -> dict[str, Any]:
    inputs = {s.field: s for s in setting_inputs() if s.field in BUNDLE_SETTINGS}
    user_config: dict[str, Any] = {}
    env: dict[str, str] = {}
    for name in BUNDLE_SETTINGS:
        s = inputs[name]
        title, description = DIALOG[name]
        entry: dict[str, Any] = {
            "type": "directory" if name == "allowed_roots" else "number" if s.form == "number" else "string",
            "title": title,
            "description": description,
            "required": s.required,
        }
        if name == "allowed_roots":
            entry["default"] = "${HOME}"
        elif s.default is not None:
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
            "mcp_config": {
                "command": "uv",
                "args": ["run", "--frozen", "--directory", "${__dirname}", ENTRY_POINT],
                "env": env,
            },
        },
        "tools": anyio.run(_tools),
        "compatibility": {"platforms": PLATFORMS, "runtimes": {"python": ">=3.11"}},
        "user_config": user_config,
    }


def pyproject(wheel_name: str) -> str:
    """The bundle's project: rlm-mcp from the wheel it carries (never looked up by name)."""
    return (
        "[project]\n"
        'name = "rlm-mcp-bundle"\n'
        f'version = "{__version__}"\n'
        'description = "The rlm-mcp Claude Desktop bundle: rlm-mcp, run by uv from a locked environment."\n'
        'requires-python = ">=3.11"\n'
        f'dependencies = ["{PACKAGE}=={__version__}"]\n'
        "\n"
        "[tool.uv.sources]\n"
        f'{PACKAGE} = {{ path = "{WHEELS}/{wheel_name}" }}\n'
    )


def _uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("uv is needed to lock the bundle's environment: pip install uv")
    return found


def _check_wheel(wheel: Path) -> None:
    expected = f"rlm_mcp-{__version__}-"
    if not (wheel.is_file() and wheel.name.startswith(expected) and wheel.suffix == ".whl"):
        raise RuntimeError(f"{wheel} is not this version's wheel ({expected}*.whl): build it with `uv build --wheel`")


def write_bundle_dir(folder: Path, wheel: Path) -> Path:
    """The bundle's files, unpacked (what `mcpb pack` takes), with `uv.lock` made by `uv lock`
    (the package index is asked once, here, for the dependencies' versions and hashes)."""
    _check_wheel(wheel)
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / WHEELS).mkdir(exist_ok=True)
    shutil.copyfile(wheel, folder / WHEELS / wheel.name)
    (folder / "manifest.json").write_text(json.dumps(manifest(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "pyproject.toml").write_text(pyproject(wheel.name), encoding="utf-8")
    (folder / ENTRY_POINT).write_text(SERVER_PY, encoding="utf-8")
    (folder / ".mcpbignore").write_text(".venv/\n__pycache__/\n*.pyc\n", encoding="utf-8")
    locked = subprocess.run([_uv(), "lock", "--quiet"], cwd=folder, capture_output=True, text=True, timeout=600)
    if locked.returncode != 0:
        raise RuntimeError(f"uv lock failed for the bundle: {locked.stderr.strip()[-2000:]}")
    return folder


def bundle_files(folder: Path) -> list[str]:
    """The files a bundle made from `folder` holds, relative and sorted."""
    names = ["manifest.json", "pyproject.toml", "uv.lock", ENTRY_POINT]
    names += [f"{WHEELS}/{p.name}" for p in (folder / WHEELS).glob("*.whl")]
    return sorted(names)


def write_bundle(output: Path, wheel: Path) -> Path:
    """`rlm-mcp.mcpb`: a zip of the bundle's files with manifest.json at its root."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlm-mcp-bundle-") as tmp:
        folder = write_bundle_dir(Path(tmp), wheel)
        with zipfile.ZipFile(output, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for name in bundle_files(folder):
                z.write(folder / name, name)
    return output
