"""The machine ran out of something: say which and how to fix it.

A full disk, a user's quota or the open-files limit used to reach a client as "Internal error in
rlm-mcp (OSError)". `exhausted` turns those OSErrors into an `RlmMcpError` naming the path, the
cause and the fix; other errors return None and stay internal errors. Tool calls and the CLI
raise or print it; a run's final status (the engine's, and a background run's in the service)
states it through `unexpected_failure`, the same rule.
"""

from __future__ import annotations

import errno

from rlm_mcp.errors import RlmMcpError

__all__ = ["ResourceExhaustedError", "exhausted", "unexpected_failure"]


class ResourceExhaustedError(RlmMcpError):
    """The disk, a quota or the file-descriptor limit ran out."""


def exhausted(exc: BaseException) -> ResourceExhaustedError | None:
    """The phrased error for a full disk (ENOSPC), a quota (EDQUOT) or too many open files
    (EMFILE, ENFILE); None for anything else."""
    if not isinstance(exc, OSError):
        return None
    where = f" writing {exc.filename}" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return ResourceExhaustedError(
            f"The disk is full{where} (ENOSPC): the data dir (RLM_MCP_DATA_DIR) holds contexts, uploads and run logs.",
            "Free space on that disk (`rlm-mcp contexts delete`, lower RLM_MCP_STORE_MAX_BYTES), or point "
            "RLM_MCP_DATA_DIR at a bigger disk.",
        )
    if exc.errno == errno.EDQUOT:
        return ResourceExhaustedError(
            f"The disk quota of the server's user is used up{where} (EDQUOT), in the data dir (RLM_MCP_DATA_DIR).",
            "Free space under that quota (`rlm-mcp contexts delete`, lower RLM_MCP_STORE_MAX_BYTES), or raise it.",
        )
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        scope = "this process" if exc.errno == errno.EMFILE else "the system"
        return ResourceExhaustedError(
            f"Too many open files in {scope}{where} ({errno.errorcode[exc.errno]}).",
            "Try again when fewer runs and connections are open; the operator can raise the limit "
            "(`ulimit -n`, LimitNOFILE=) or lower RLM_MCP_MAX_RUNS / RLM_MCP_HTTP_MAX_CONNECTIONS.",
        )
    return None


def unexpected_failure(exc: BaseException) -> str:
    """A run's final reason for an error nobody anticipated: the phrased cause and fix when the
    machine ran out of disk, quota or descriptors (`exhausted`), else "internal error: …"."""
    phrased = exhausted(exc)
    return str(phrased) if phrased is not None else f"internal error: {type(exc).__name__}: {exc}"
