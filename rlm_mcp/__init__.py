"""rlm-mcp: an MCP server that gives any agent a Recursive Language Model."""

__version__ = "0.1.0"
