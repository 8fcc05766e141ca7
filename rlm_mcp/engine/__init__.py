"""The RLM loop (see loop.py). The service layer is written against these names."""

from rlm_mcp.engine.loop import RLMEngine
from rlm_mcp.engine.prompts import resolve_system_prompt
from rlm_mcp.engine.types import EventSink, RunLimits, RunProgress, RunResult, RunStatus

__all__ = ["EventSink", "RLMEngine", "RunLimits", "RunProgress", "RunResult", "RunStatus", "resolve_system_prompt"]
