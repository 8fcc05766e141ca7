"""The contracts between layers (docs/architecture.md, "Ports").

Owns the protocols and value types that the engine, the sandbox and the store agree on, so
none of them imports another: `engine` (the engine's chat model and sandbox), `sandbox` (how a
sandbox backend plugs in: a kernel channel and a backend), `owners` (who may reap a sandbox).
Must not import any other `rlm_mcp` package at run time (only `rlm_mcp.errors` and `config`).
"""

from rlm_mcp.ports.engine import (
    CellResult,
    ChatModel,
    ContextFormat,
    ContextKind,
    ContextSpec,
    LMBridge,
    LMRequest,
    Sandbox,
    SandboxFactory,
)

__all__ = [
    "CellResult",
    "ChatModel",
    "ContextFormat",
    "ContextKind",
    "ContextSpec",
    "LMBridge",
    "LMRequest",
    "Sandbox",
    "SandboxFactory",
]
