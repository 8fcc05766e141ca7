"""rlm-mcp: an MCP server that gives any agent a Recursive Language Model.

Layers (docs/architecture.md), each a package that imports only those to its right:
server -> service -> engine -> lm, and service -> sandbox, store; engine, sandbox and store
depend on `ports` (the contracts), never on each other. `config` is read by all; nothing
imports `server`. `errors` holds the user-facing errors every layer raises.
"""

__version__ = "0.1.0"
