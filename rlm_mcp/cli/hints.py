"""What the CLI tells a person at a terminal (not a client): kept here so the words have one owner."""

from __future__ import annotations

STDIO_ON_A_TERMINAL = """\
rlm-mcp: serving MCP on stdio: waiting for an MCP client to speak on stdin (a client such as
Claude Desktop or Claude Code starts this command itself; typing here does nothing useful).
To try it by hand instead:
  rlm-mcp doctor                                    checks Docker, the image and the LM endpoint
  rlm-mcp run "a question" --path FILE_OR_FOLDER    one run, with progress
  npx @modelcontextprotocol/inspector rlm-mcp       a browser UI that calls the tools
Press Ctrl-C to stop."""
