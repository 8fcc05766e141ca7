"""The engine layer: the RLM loop (see loop.py).

Owns prompt profiles, the message history, ```repl parsing, answer detection, output
formatting and truncation, the token-aware window, limits, recursion, the usage tree and
producing the run events (their types and encoding are `rlm_mcp.events`); and the decision whether a run has started (`RunNotStarted`).
Must not know about MCP or Docker: it talks to the `Sandbox` and `ChatModel` protocols
(rlm_mcp/ports/, docs/architecture.md), which the service wires to the real `sandbox` and `lm`
layers; it never imports `sandbox`, `store` or `lm` (their failures and results are the chat
contract, `ports/chat.py`), so importing it loads no HTTP client.
The service layer is written against the names exported here.
"""

from rlm_mcp.engine.loop import RLMEngine
from rlm_mcp.engine.prompts import resolve_system_prompt
from rlm_mcp.engine.types import EventSink, RunLimits, RunNotStarted, RunPhase, RunProgress, RunResult, RunStatus

__all__ = [
    "EventSink",
    "RLMEngine",
    "RunLimits",
    "RunNotStarted",
    "RunPhase",
    "RunProgress",
    "RunResult",
    "RunStatus",
    "resolve_system_prompt",
]
