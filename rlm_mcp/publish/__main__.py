"""`python -m rlm_mcp.publish server-json [-o FILE]`: write the generated file (stdout by default)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def render_server_json() -> str:
    from rlm_mcp.publish.registry import server_json

    return json.dumps(server_json(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlm_mcp.publish", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("server-json", help="the MCP Registry's server.json, from the settings model")
    one.add_argument("-o", "--output", help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    text = render_server_json()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
