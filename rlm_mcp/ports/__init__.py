"""The contracts between layers (docs/architecture.md, "Ports").

Owns the protocols and value types that the engine, the LM client, the sandbox and the store
agree on, so none of them imports another: `engine` (the engine's chat model and sandbox),
`chat` (what an LM call returns and how it fails), `runs` (the versioned run record, its usage,
notices and live summary), `kernel` (how a sandbox backend plugs in: a kernel channel and a
backend), `owners` (who may reap a sandbox), `sessions` (kept sessions as the service sees them,
in either mode). Must not import another layer at run time (only
the neutral modules: `rlm_mcp.errors`, `events`, `owners`).
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
