"""Make sure the sandbox image exists, choosing online or offline the way a person would.

Test support: the suite calls it before its Docker tests (tests/conftest.py), so that its
command works on a fresh machine; `rlm-mcp image build` is the user's way. Order: the image is there -> nothing; the offline base is there -> build
on it (no network); a registry answers (the base pulls) -> build online; this user can run
debootstrap (root, and debootstrap installed) -> build offline; otherwise a clear error.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

from rlm_mcp.config import Settings
from rlm_mcp.errors import SandboxError
from rlm_mcp.sandbox.docker.docker_api import connect_sync, image_present_sync
from rlm_mcp.sandbox.docker.image import OFFLINE_BASE_TAG, build_image

ONLINE_BASE = ("debian", "bookworm-slim")

NO_WAY_FIX = (
    "Build it once by hand: `sudo apt-get install debootstrap` then `sudo $(which uv) run rlm-mcp image build "
    "--offline` (offline: needs root), or make an image registry reachable and run `uv run rlm-mcp image build`."
)


def can_debootstrap() -> bool:
    """Whether this process may make the offline base: debootstrap installed and running as root."""
    return shutil.which("debootstrap") is not None and hasattr(os, "geteuid") and os.geteuid() == 0


def _registry_answers(client: Any, log: Callable[[str], None]) -> bool:
    """Pull the online base; False (with the reason logged) when no registry answers."""
    import docker.errors

    repo, tag = ONLINE_BASE
    if image_present_sync(client, f"{repo}:{tag}"):
        return True
    try:
        client.images.pull(repo, tag=tag)
    except (docker.errors.APIError, docker.errors.DockerException) as exc:
        log(f"No image registry answered ({str(exc).strip().splitlines()[0][:200]}).")
        return False
    return True


def ensure_image(settings: Settings, log: Callable[[str], None] = print) -> str | None:
    """Build `settings.sandbox_image` if it is missing; return how ("online"/"offline"), or None
    when it was already there. Raises `SandboxError` naming the fix when it cannot be built."""
    client = connect_sync(timeout=300)
    try:
        if image_present_sync(client, settings.sandbox.sandbox_image):
            return None
        log(f"The sandbox image {settings.sandbox.sandbox_image} is missing; building it (a few minutes, once).")
        if image_present_sync(client, OFFLINE_BASE_TAG):
            offline = True
        elif _registry_answers(client, log):
            offline = False
        elif can_debootstrap():
            offline = True
        else:
            raise SandboxError(
                f"The sandbox image {settings.sandbox.sandbox_image} is missing, no image registry answered, and the "
                "offline build needs root and debootstrap.",
                NO_WAY_FIX,
            )
    finally:
        client.close()
    build_image(settings.sandbox, offline=offline, log=log)
    return "offline" if offline else "online"
