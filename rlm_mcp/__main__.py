"""`python -m rlm_mcp` is the same as the `rlm-mcp` console script."""

from rlm_mcp.cli import run

run()
