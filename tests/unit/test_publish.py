"""The MCP Registry entry: `server.json` is what the generator makes from the settings model
(so it cannot drift), passes the registry schema's rules, and the README carries the
`mcp-name:` line the registry looks for in the PyPI description. The repository URL (still a
placeholder) is written in pyproject.toml only."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rlm_mcp.publish.__main__ import main as publish_main
from rlm_mcp.publish.inputs import registry_name, repository_url
from rlm_mcp.publish.registry import ServerJson, server_json
from tests.fixtures_uv import REPO

REGENERATE = "regenerate it: python -m rlm_mcp.publish server-json -o server.json"


def test_the_checked_in_server_json_is_the_generated_one() -> None:
    assert json.loads((REPO / "server.json").read_text()) == server_json(), REGENERATE


def test_the_command_writes_the_file(tmp_path: Path) -> None:
    assert publish_main(["server-json", "-o", str(tmp_path / "s.json")]) == 0
    assert (tmp_path / "s.json").read_text() == (REPO / "server.json").read_text(), REGENERATE


def test_the_entry_is_what_the_registry_requires() -> None:
    entry = server_json()
    ServerJson.model_validate(entry)
    (package,) = entry["packages"]
    assert (package["registryType"], package["identifier"], package["runtimeHint"]) == ("pypi", "rlm-mcp", "uvx")
    assert package["transport"] == {"type": "stdio"}
    env = {e["name"]: e for e in package["environmentVariables"]}
    assert env["RLM_MCP_API_KEY"]["isSecret"] is True and "default" not in env["RLM_MCP_API_KEY"]
    assert env["RLM_MCP_BASE_URL"]["isRequired"] is True
    assert all(e["description"] for e in env.values())
    assert not any(e["isSecret"] for name, e in env.items() if name != "RLM_MCP_API_KEY")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"name": "rlm-mcp"}, "name"),
        ({"description": "x" * 101}, "description"),
        ({"version": "^0.1.0"}, "version"),
        ({"$schema": "https://static.modelcontextprotocol.io/schemas/2025-07-09/server.schema.json"}, "schema"),
        (
            {
                "packages": [
                    {"registryType": "cargo", "identifier": "x", "version": "1", "transport": {"type": "stdio"}}
                ]
            },
            "registryType",
        ),
        (
            {
                "packages": [
                    {"registryType": "pypi", "identifier": "x", "version": "latest", "transport": {"type": "stdio"}}
                ]
            },
            "version",
        ),
        ({"packages": [{"registryType": "pypi", "identifier": "x", "version": "1"}]}, "transport"),
    ],
)
def test_the_checks_refuse_what_the_registry_refuses(change: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(why) if why != "schema" else "schema"):
        ServerJson.model_validate({**server_json(), **change})


def test_readme_has_the_mcp_name_line() -> None:
    readme = (REPO / "README.md").read_text()
    assert re.findall(r"mcp-name: (\S+)", readme) == [registry_name()]


def test_the_repository_url_is_written_once() -> None:
    owner = repository_url().removeprefix("https://github.com/").split("/")[0]
    places = [
        p.relative_to(REPO).as_posix()
        for p in [
            REPO / "pyproject.toml",
            REPO / "README.md",
            *REPO.glob("rlm_mcp/**/*.py"),
            *REPO.glob("tests/**/*.py"),
        ]
        if owner in p.read_text(encoding="utf-8")
    ]
    # README: only the generated mcp-name line (checked above).
    assert places == ["pyproject.toml", "README.md"], places
    assert (REPO / "README.md").read_text().count(owner) == 1
