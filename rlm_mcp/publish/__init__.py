"""Distribution metadata generated from the settings model: the MCP Registry's `server.json`
(`registry.py`) and, from the same list of settings a client should ask for (`inputs.py`), the
Claude Desktop bundle's manifest. A maintainer's command, not part of the server:

    python -m rlm_mcp.publish server-json [-o server.json]

The repository URL and the registry name come from the package metadata (`[project.urls]
Repository` in pyproject.toml, the one place that URL is written). Nothing here is imported by
the server's layers.
"""
