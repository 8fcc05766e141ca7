"""Property-based fuzz of every tool's arguments through the real in-memory MCP client (issue 14
item 12): any input gets a result or a clean tool error, and the server keeps answering.

One server serves every example (started once, on an event loop in a helper thread), so the
examples are cheap; the LM endpoint is unreachable on purpose. The module is in the fast tier, so
Docker is refused to it (tests/conftest.py): whatever a run asks of Docker fails cleanly, and no
container can be left behind (a check for leaked containers would need Docker, and could not fail).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from rlm_mcp.errors import DockerUnavailableError
from rlm_mcp.sandbox.docker import docker_api
from rlm_mcp.server.app import build_server
from tests.fixtures_surface import ALL_TOOLS, make_settings

FUZZ = settings(
    max_examples=int(os.environ.get("RLM_MCP_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=60),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
# Values that reach deeper than schema validation: ids that look right, paths, patterns, URLs.
plausible = st.sampled_from(
    [
        "",
        " ",
        "ctx_",
        "ctx_" + "0" * 24,
        "run_" + "0" * 20,
        "upl_" + "0" * 24,
        "/",
        "/etc/passwd",
        "../..",
        "*",
        "**/*?" * 8,
        "[z-a]",
        "a\x00b",
        "\ud800",
        "http://127.0.0.1:9/x",
        "file:///etc/passwd",
        "ftp://x",
        '{"a": 1}',
        "[1, 2]",
        "-1",
        "1e309",
        "text",
        "json",
        "base64",
        "=" * 8,
    ]
)
argument = st.one_of(json_values, plausible, st.integers(min_value=-(2**63), max_value=2**63), st.lists(plausible))


@pytest.fixture(autouse=True)
def _docker_is_not_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run the fuzzer starts (a known context, a plain query) asks the sandbox backend whether
    Docker answers before it calls the LM: here Docker is not running, as a user without it sees,
    instead of the fast tier's guard (which fails a test that connects, and would make this
    example an internal error). Nothing connects either way."""

    def not_running(*args: object, **kwargs: object) -> None:
        raise DockerUnavailableError("Docker is not running or cannot be reached (fuzz).", "Start Docker.")

    monkeypatch.setattr(docker_api, "connect_sync", not_running)


class Served:
    def __init__(self, portal: BlockingPortal, client: Client, schemas: dict[str, dict[str, Any]], known: str) -> None:
        self.portal = portal
        self.client = client
        self.schemas = schemas
        self.known_context = known

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        return self.portal.call(lambda: self.client.call_tool(tool, args))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp_path: Path = tmp_path_factory.mktemp("fuzz")
    settings_ = make_settings(tmp_path, "http://127.0.0.1:9/v1", url_timeout_s=3, lm_retries=0, run_queue_timeout_s=5)
    (tmp_path / "root" / "f.txt").write_text("a file to load\n")
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(Client(build_server(settings_))) as client,
    ):
        tools = portal.call(client.list_tools).tools
        schemas = {t.name: t.input_schema for t in tools}
        known = portal.call(lambda: client.call_tool("rlm_load_context", {"text": "known"})).structured_content
        assert known is not None
        yield Served(portal, client, schemas, known["context_id"])


def arguments_for(schema: dict[str, Any], known_context: str) -> st.SearchStrategy[dict[str, Any]]:
    names = sorted(schema.get("properties", {}))
    value = st.one_of(argument, st.just(known_context))
    declared = st.fixed_dictionaries({}, optional={n: value for n in names})
    extra = st.dictionaries(st.text(max_size=8), argument, max_size=2)
    return st.tuples(declared, extra).map(lambda pair: {**pair[1], **pair[0]})


@pytest.mark.parametrize("tool", sorted(ALL_TOOLS))
@FUZZ
@given(data=st.data())
def test_any_arguments_get_a_result_or_a_clean_tool_error(served: Served, tool: str, data: st.DataObject) -> None:
    args = data.draw(arguments_for(served.schemas[tool], served.known_context))
    result = served.call(tool, args)
    text = " ".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        assert text.strip(), "a tool error must say what went wrong"
        assert "Traceback" not in text
        assert "Internal error" not in text, f"{tool}({args!r}) hit a bug: {text}"
    else:
        assert result.structured_content is not None
        json.dumps(result.structured_content)
    # The server still answers after every example.
    assert served.call("rlm_list_contexts", {}).is_error is False
