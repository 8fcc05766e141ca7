"""The chat contract's value types, as the LM layer names them (defined in rlm_mcp.ports.chat;
usage in rlm_mcp.events)."""

from rlm_mcp.events import TokenCount, Usage
from rlm_mcp.ports.chat import CallRecord, Completion

__all__ = ["CallRecord", "Completion", "TokenCount", "Usage"]
