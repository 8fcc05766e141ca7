"""`rlm-mcp` entry point. No subcommand: serve MCP over stdio (what `uvx rlm-mcp` does).

The package: `parser.py` every command and its options (argparse, one handler per command);
`serve.py` the server and the team worker; `records.py` what the stores hold; `run.py` one run
from the shell; `sessions.py` kept sessions; `eval.py` the evaluator's commands; `tools.py`
doctor, the prompt profile and the sandbox image; `options.py` the run-limit flags `run` and
`eval` share; `hints.py` what a bare `rlm-mcp` on a terminal says.

Nothing but MCP protocol may reach stdout in stdio mode, so every log line goes to stderr.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from rlm_mcp.cli.common import Handler
from rlm_mcp.cli.parser import build_parser
from rlm_mcp.config import SETTING_FIELDS, load_settings
from rlm_mcp.config_check import SettingsError, unknown_env_vars
from rlm_mcp.errors import RlmMcpError, UnknownIdError
from rlm_mcp.resource_errors import exhausted
from rlm_mcp.visible import visible

__all__ = ["CLI_FIXES", "build_parser", "main", "run"]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        serve_flags = [(name, getattr(args, name, None)) for name in ("transport", "host", "port", "role")]
        overrides = {k: v for k, v in serve_flags if v is not None}
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"rlm-mcp: bad configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        stream=sys.stderr,
        level=settings.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for warning in unknown_env_vars(SETTING_FIELDS, os.environ):
        logging.getLogger("rlm_mcp.config").warning(warning)
    if settings.server.log_level.upper() != "DEBUG":  # the clients' line per request only when asked for
        for noisy in ("httpx", "httpcore"):  # (the server's access lines stay: uvicorn, at INFO)
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        handler: Handler = args.handler
        return handler(args, settings)
    except BrokenPipeError:
        return _reader_gone()
    except RlmMcpError as exc:
        if isinstance(exc, UnknownIdError):
            exc = exc.phrased(CLI_FIXES)
        print(f"rlm-mcp: {visible(str(exc))}", file=sys.stderr)  # may quote a URL, a name, a model
        return 1
    except OSError as exc:
        if (phrased := exhausted(exc)) is None:
            raise
        print(f"rlm-mcp: {visible(str(phrased))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run() -> NoReturn:
    """The `rlm-mcp` console script and `python -m rlm_mcp`: `main`, then the process ends with its
    status. After the object-storage client (obstore) was used, it ends at once, its output
    flushed: that client's Rust runtime keeps worker threads that may still be running when the
    interpreter is torn down, and one that touches it then aborts the process (SIGABRT), so a
    command that answered 1 could exit with a signal instead."""
    code = main()
    if "obstore" not in sys.modules:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, a closed stream: nothing more to write
            pass
    os._exit(code)


# How a shell user fixes an unknown id (the store only says which id was unknown).
CLI_FIXES = {
    "context": "List stored contexts with `rlm-mcp contexts list`.",
    "run": "List run records with `rlm-mcp runs list`.",
}


def _reader_gone() -> int:
    """The command's reader went away (`rlm-mcp runs export ID | head`): stop quietly, as other
    tools do, with SIGPIPE's exit status; stdout goes to /dev/null so that the interpreter's last
    flush at exit cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a descriptor (embedded use)
        pass
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    run()
