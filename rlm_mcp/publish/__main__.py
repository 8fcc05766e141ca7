"""`python -m rlm_mcp.publish server-json [-o FILE]` (stdout by default) and
`python -m rlm_mcp.publish bundle --wheel dist/rlm_mcp-VERSION-py3-none-any.whl [-o rlm-mcp.mcpb]
[--dir FOLDER]`: write the generated files."""

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
    bundle = sub.add_parser("bundle", help="the Claude Desktop bundle (MCPB 0.4, server.type uv)")
    bundle.add_argument("-o", "--output", default="rlm-mcp.mcpb", help="bundle file (default: rlm-mcp.mcpb)")
    bundle.add_argument("--dir", help="also write the unpacked files to this folder (what `mcpb pack` takes)")
    bundle.add_argument(
        "--wheel", required=True, help="this version's wheel (`uv build --wheel`), carried in the bundle"
    )
    args = parser.parse_args(argv)
    if args.what == "bundle":
        from rlm_mcp.publish.bundle import write_bundle, write_bundle_dir

        if args.dir:
            write_bundle_dir(Path(args.dir), Path(args.wheel))
        print(write_bundle(Path(args.output), Path(args.wheel)))
        return 0
    text = render_server_json()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
