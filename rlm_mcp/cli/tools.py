"""`rlm-mcp doctor`, `profile fetch|show` and `image build|status`: the setup checks and tools."""

from __future__ import annotations

import argparse
import sys

import anyio

from rlm_mcp.config import Settings


def doctor(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.doctor import run_doctor

    return anyio.run(run_doctor, settings)


def profile_fetch(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.reference import fetch_wheel

    print(f"reference wheel: {fetch_wheel(settings.store.data_dir)}")
    return profile_show(args, settings)


def profile_show(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.service.profile import choose_profile

    choice = choose_profile(settings.service, fetch=False)
    print(f"prompt profile: {choice.profile.name} ({choice.detail})")
    if choice.fix:
        print(f"fix: {choice.fix}")
    return 0 if not choice.fix else 1


def image_status(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.sandbox.docker.docker_api import connect_sync, image_present_sync

    client = connect_sync()
    try:
        present = image_present_sync(client, settings.sandbox.sandbox_image)
    finally:
        client.close()
    print(
        f"{settings.sandbox.sandbox_image}: {'present' if present else 'missing (run: rlm-mcp image build --offline)'}"
    )
    return 0 if present else 1


def image_build(args: argparse.Namespace, settings: Settings) -> int:
    from rlm_mcp.sandbox.docker.image import build_image

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    tag = build_image(settings.sandbox, offline=args.offline, mirror=args.mirror, force=args.force, log=log)
    print(tag)
    return 0
