"""The suite builds the sandbox image when it is missing: offline on the local base, or a clear
error naming the fix when no way is open. Only images tagged by the test are removed."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.errors import SandboxError
from rlm_mcp.sandbox.docker.docker_api import connect_sync, image_present_sync
from rlm_mcp.sandbox.docker.image import OFFLINE_BASE_TAG
from rlm_mcp.testing import image_ensure


@pytest.fixture
def fresh_tag() -> Iterator[str]:
    tag = f"rlm-mcp-sandbox:test-{secrets.token_hex(4)}"
    yield tag
    client = connect_sync()
    try:
        if image_present_sync(client, tag):
            client.images.remove(tag)  # untags only: never force, the layers may be shared
    finally:
        client.close()


def test_present_image_is_left_alone(fresh_tag: str) -> None:
    lines: list[str] = []
    assert image_ensure.ensure_image(Settings(), lines.append) is None
    assert lines == []


def test_missing_image_is_built_on_the_offline_base(fresh_tag: str) -> None:
    client = connect_sync()
    try:
        assert image_present_sync(client, OFFLINE_BASE_TAG), "the shared offline base is built by .ci/run or a test run"
    finally:
        client.close()
    lines: list[str] = []
    assert image_ensure.ensure_image(Settings(sandbox_image=fresh_tag), lines.append) == "offline"
    assert any("missing; building it" in line for line in lines)
    client = connect_sync()
    try:
        assert image_present_sync(client, fresh_tag)
    finally:
        client.close()


def test_no_way_to_build_names_the_fix(fresh_tag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_ensure, "OFFLINE_BASE_TAG", f"rlm-mcp-base:absent-{secrets.token_hex(4)}")
    monkeypatch.setattr(image_ensure, "_registry_answers", lambda client, log: False)
    monkeypatch.setattr(image_ensure, "can_debootstrap", lambda: False)
    with pytest.raises(SandboxError) as caught:
        image_ensure.ensure_image(Settings(sandbox_image=fresh_tag), lambda line: None)
    assert "root and debootstrap" in caught.value.cause
    assert "apt-get install debootstrap" in (caught.value.fix or "")
