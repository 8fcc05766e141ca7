"""What every command module shares: a handler's type and the two helpers that register one."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from rlm_mcp.config import Settings

# A command: its parsed arguments and the settings in, the process's exit status out.
Handler = Callable[[argparse.Namespace, Settings], int]


def run_async(handler: Callable[[argparse.Namespace, Settings], Awaitable[int]]) -> Handler:
    """A handler that runs an async command on its own event loop."""

    def run(args: argparse.Namespace, settings: Settings) -> int:
        return anyio.run(handler, args, settings)

    return run


def command(sub: Any, name: str, handler: Handler | None, help: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose help is `help` (its summary in the parent's list and its description)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=kwargs.pop("description", help))
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser
