"""docs/tools.md against the server's own lists (issue 41 item 9): every tool and every argument
of it, required or optional, each documented default the schema's, and every resource template;
nothing documented that the server does not have. A tool or argument added without its line
fails here, so the page stays true."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio

from rlm_mcp.server.app import build_server
from rlm_mcp.testing.settings import make_settings
from tests.readme_blocks import DOCS

PAGE = DOCS / "tools.md"
SIGNATURE = re.compile(r"^\| `(rlm_\w+)\(([^`]*)\)`", re.M)
ARGUMENT = re.compile(r"^([a-z_0-9]+)(\?|=(.+))?$")


def server_lists(tmp_path: Path) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """{tool: its input schema}, and the resource templates, as a client lists them."""

    async def listed() -> tuple[dict[str, dict[str, Any]], set[str]]:
        mcp = build_server(make_settings(tmp_path), mode="stdio")
        tools = {t.name: t.input_schema for t in await mcp.list_tools()}
        return tools, {r.uri_template for r in await mcp.list_resource_templates()}

    return anyio.run(listed)


def documented() -> dict[str, dict[str, tuple[bool, str | None]]]:
    """{tool: {argument: (required, documented default)}} from the page's table."""
    found: dict[str, dict[str, tuple[bool, str | None]]] = {}
    for name, signature in SIGNATURE.findall(PAGE.read_text(encoding="utf-8")):
        assert name not in found, f"{name} documented twice"
        arguments: dict[str, tuple[bool, str | None]] = {}
        for part in filter(None, (p.strip() for p in signature.split(","))):
            parsed = ARGUMENT.match(part)
            assert parsed is not None, f"{name}: cannot read the argument {part!r} (write name, name? or name=value)"
            arguments[parsed[1]] = (parsed[2] is None, parsed[3])
        found[name] = arguments
    return found


def test_every_tool_and_argument_is_documented_as_the_server_declares_it(tmp_path: Path) -> None:
    tools, _ = server_lists(tmp_path)
    page = documented()
    assert set(page) == set(tools), f"undocumented: {set(tools) - set(page)}; not served: {set(page) - set(tools)}"
    for name, schema in tools.items():
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        assert set(page[name]) == set(properties), (
            f"{name}: documented {sorted(page[name])}, served {sorted(properties)}"
        )
        for argument, (is_required, default) in page[name].items():
            assert is_required == (argument in required), f"{name}({argument}): required is {argument in required}"
            if default is not None:
                assert json.loads(default) == properties[argument].get("default"), f"{name}({argument}={default})"


def test_every_resource_template_is_documented(tmp_path: Path) -> None:
    _, templates = server_lists(tmp_path)
    text = PAGE.read_text(encoding="utf-8")
    shown = set(re.findall(r"`(rlm://[^`]+)`", text))
    assert shown == templates, f"undocumented: {templates - shown}; not served: {shown - templates}"
