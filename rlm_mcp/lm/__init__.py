"""The LM layer: an async client of OpenAI-compatible endpoints (vLLM first).

Owns root/sub routing (root turns to `RLM_MCP_BASE_URL` with the run id as session key,
sub-calls to `RLM_MCP_SUB_BASE_URL` with a fresh request id each: client.py, routing.py),
retries with backoff (429, 5xx, connection errors: completions.py, retry.py), per-call usage,
bounded concurrency, window discovery per endpoint and model (/v1/models: catalog.py,
discovery.py), token counting (/tokenize, else an estimate: counting.py, tokens.py), the
pre-flight check and doctor's probe (probe.py); and the phrasing of every endpoint failure
(lm/errors.py factories, each naming the endpoint, its kind when known, and the setting to fix).
Must not parse code or touch sandboxes. A new LM backend (another API, an endpoint pool) is a
new client here that satisfies the engine's `ChatModel` protocol (rlm_mcp/ports/). The chat
contract (the failure classes, `CallRecord`, `Completion`) is imported from `rlm_mcp.ports.chat`
itself, by this layer and its callers alike; lm/errors.py only phrases the failures.
"""

from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.discovery import DEFAULT_WINDOW, ProbeResult

__all__ = ["DEFAULT_WINDOW", "LMClient", "ProbeResult"]
