"""The chat contract's value types, as the LM layer names them (defined in rlm_mcp.ports.chat;
usage in rlm_mcp.usage)."""

from rlm_mcp.ports.chat import CallRecord, Completion
from rlm_mcp.usage import TokenCount, Usage

__all__ = ["CallRecord", "Completion", "TokenCount", "Usage"]
