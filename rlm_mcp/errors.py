"""Errors a user can meet before a run starts. Each names its cause and the fix.

LM endpoint failures are `rlm_mcp.ports.chat.LMError` (a subclass of `RlmMcpError`), phrased by
`rlm_mcp.lm.errors`.

The server layer turns these into MCP `ToolError`s verbatim, so the text is written for a
person reading a chat client: one sentence of cause, one of fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal


class RlmMcpError(Exception):
    """Base of every user-facing failure: `str(err)` is the message to show."""

    def __init__(self, cause: str, fix: str | None = None) -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(f"{cause} {fix}" if fix else cause)


class BadArgumentError(RlmMcpError):
    """The caller passed arguments that cannot work."""


class NotFoundError(RlmMcpError):
    """An unknown context id, run id or upload id."""


class UnknownIdError(NotFoundError):
    """An id nobody stored. It carries what was asked for (`kind`, `key`); the layer that talks
    to the user adds the fix in its own terms (`phrased`): MCP tools, or CLI commands."""

    def __init__(
        self, kind: Literal["context", "run", "upload"], key: str, *, detail: str = "", fix: str | None = None
    ) -> None:
        self.kind = kind
        self.key = key
        self.detail = detail
        super().__init__(f"Unknown {kind} id '{key}'{detail}.", fix)

    def phrased(self, fixes: Mapping[str, str]) -> UnknownIdError:
        """The same error with the fix for this audience (`fixes` by kind)."""
        return UnknownIdError(self.kind, self.key, detail=self.detail, fix=fixes.get(self.kind, self.fix))


class TooLargeError(RlmMcpError):
    """Input over a configured size cap. Built by the factories below, one per cap, so that each
    cap is phrased in one place whichever loader or store meets it."""


class ContextTooLargeError(TooLargeError):
    """Over RLM_MCP_MAX_CONTEXT_BYTES; it keeps what it was built from, so that the layer that
    knows where the limit came from can name the setting to change (`following_memory`)."""

    def __init__(self, limit: int, source: str | None, reached_at: str | None, narrow: str) -> None:
        self.limit, self.source, self.reached_at, self.narrow = limit, source, reached_at, narrow
        super().__init__(
            f"{self._what} is larger than RLM_MCP_MAX_CONTEXT_BYTES ({limit} bytes){self._where}.",
            f"{narrow}, or raise RLM_MCP_MAX_CONTEXT_BYTES.",
        )

    @property
    def _what(self) -> str:
        return f"'{self.source}'" if self.source else "The context"

    @property
    def _where(self) -> str:
        return f" (reached while adding '{self.reached_at}')" if self.reached_at else ""

    def following_memory(self, memory: str) -> TooLargeError:
        """The same refusal when the limit is derived from the sandbox's memory (the default):
        RLM_MCP_SANDBOX_MEMORY is the setting that raises it (and lets the sandbox hold it)."""
        return TooLargeError(
            f"{self._what} is larger than the largest context a sandbox of RLM_MCP_SANDBOX_MEMORY={memory} "
            f"holds ({self.limit} bytes){self._where}.",
            f"{self.narrow}, or raise RLM_MCP_SANDBOX_MEMORY (e.g. RLM_MCP_SANDBOX_MEMORY=4g), which raises "
            "this limit with it.",
        )


def context_too_large(
    limit: int, source: str | None = None, *, reached_at: str | None = None, narrow: str = "Load a smaller part of it"
) -> ContextTooLargeError:
    """Over RLM_MCP_MAX_CONTEXT_BYTES. `source`: what was being loaded (a path, folder or URL) when
    known; `reached_at`: the file a folder's text passed the cap at; `narrow`: how to load less."""
    return ContextTooLargeError(limit, source, reached_at, narrow)


def too_many_files(folder: str, max_files: int) -> TooLargeError:
    """Over RLM_MCP_MAX_FILES."""
    return TooLargeError(
        f"'{folder}' holds more than {max_files} files to load.",
        "Narrow it with include/exclude patterns or a subfolder, or raise RLM_MCP_MAX_FILES.",
    )


def chunk_too_large(index: int, size: int, max_chunk: int) -> TooLargeError:
    """An upload chunk over the fixed chunk size."""
    return TooLargeError(
        f"Chunk {index} holds {size} bytes; a chunk may hold at most {max_chunk} bytes ({max_chunk / 2**20:g} MiB).",
        f"Split the data into chunks of at most {max_chunk / 2**20:g} MiB and send them with consecutive indexes.",
    )


def uploads_over_store_cap(pending: int, adding: int, cap: int) -> TooLargeError:
    """Unfinished uploads of every owner would pass RLM_MCP_STORE_MAX_BYTES."""
    return TooLargeError(
        # Not how much is pending: that is other owners' business too.
        f"The uploads in progress on this server have no room for {adding} more bytes under "
        f"RLM_MCP_STORE_MAX_BYTES ({cap} bytes).",
        "Finish or abandon your own uploads in progress, or try again later (unfinished uploads expire a day "
        "after their last chunk); the server's operator may raise RLM_MCP_STORE_MAX_BYTES or set "
        "RLM_MCP_STORE_MAX_BYTES_PER_OWNER.",
    )


def owner_uploads_full(pending: int, adding: int, share: int) -> TooLargeError:
    """The caller's own unfinished uploads would pass RLM_MCP_STORE_MAX_BYTES_PER_OWNER."""
    return TooLargeError(
        f"Your uploads in progress hold {pending} bytes; {adding} more would pass your share of the store, "
        f"RLM_MCP_STORE_MAX_BYTES_PER_OWNER ({share} bytes).",
        "Finish or abandon your uploads in progress (each expires a day after its last chunk), "
        "or ask the server's operator to raise RLM_MCP_STORE_MAX_BYTES_PER_OWNER.",
    )


def owner_share_full(adding: int, share: int, *, kept: int | None, grace_s: float) -> TooLargeError:
    """A new context would put the caller's contexts past RLM_MCP_STORE_MAX_BYTES_PER_OWNER.
    `kept`: the bytes of the caller's contexts that could not make room (None: the new one alone
    is larger than the share)."""
    setting = f"RLM_MCP_STORE_MAX_BYTES_PER_OWNER ({share} bytes)"
    if kept is None:
        return TooLargeError(
            f"This context ({adding} bytes) is larger than each owner's share of the store, {setting}.",
            "Load a smaller part of it, or ask the server's operator to raise RLM_MCP_STORE_MAX_BYTES_PER_OWNER.",
        )
    return TooLargeError(
        f"Your contexts that runs are using or that were stored or used in the last {grace_s:g} s hold "
        f"{kept} bytes; with this one ({adding} bytes) they would pass your share of the store, {setting}.",
        "Delete contexts you no longer need, or wait for your runs to finish and try again; the server's "
        "operator may raise RLM_MCP_STORE_MAX_BYTES_PER_OWNER.",
    )


def contexts_over_sandbox_memory(need: int, usable: int, memory: str) -> TooLargeError:
    """The contexts of a run would not fit in RLM_MCP_SANDBOX_MEMORY."""
    return TooLargeError(
        f"These contexts need about {need / 2**20:.0f} MiB inside the sandbox, more than its memory limit "
        f"allows ({memory}, about {max(usable, 0) / 2**20:.0f} MiB usable).",
        "Raise RLM_MCP_SANDBOX_MEMORY (e.g. RLM_MCP_SANDBOX_MEMORY=4g) or load fewer/smaller contexts.",
    )


# How to get team mode's driver (psycopg and its pool), said the same way wherever it is missing.
# From a checkout the extra must be named on every `uv run`: a plain one syncs it away again.
TEAM_EXTRA_FIX = (
    "From a checkout: run every command as `uv run --extra team rlm-mcp ...` (or `uv sync --extra team` "
    "once, then `.venv/bin/rlm-mcp ...`); from a package index: pip install 'rlm-mcp[team]'."
)


class AccessDeniedError(RlmMcpError):
    """A path outside the allowed roots, a hidden entry, or a refused URL."""


class StoreUnreachableError(RlmMcpError):
    """The store cannot be reached now (its database restarting, out of connections): the same
    write may land later, unlike one the store refused for what it holds."""


class BackendUnavailableError(RlmMcpError):
    """The sandbox backend (a Docker engine, a cluster) cannot be reached."""


class DockerUnavailableError(BackendUnavailableError):
    """The Docker daemon cannot be reached."""


class ImageMissingError(RlmMcpError):
    """The sandbox image is not present."""


class SandboxError(RlmMcpError):
    """A sandbox failed in a way the run cannot recover from."""


class ConnectionLostError(SandboxError):
    """The connection to the sandbox backend was lost and could not be made good again."""


class BusyError(RlmMcpError):
    """Too many runs or sandboxes at once."""


class CpuLimitFixed(RlmMcpError):
    """The backend cannot change a running sandbox's CPU limit (`cause`: why; `fix`: what to do)."""
