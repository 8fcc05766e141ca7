"""The docs site's generated parts, as a MkDocs hook (mkdocs.yml `hooks:`).

A page asks for generated text with a marker line, replaced at build time:

- `<!-- generated: settings -->`: the settings tables, one per section of `rlm_mcp.config` (name,
  default, description of every field), so it cannot drift from the code;
- `<!-- generated: cli -->`: the command reference, from the argparse parser of `rlm_mcp.cli`;
- `<!-- generated: bench/results/NAME.json -->`: a benchmark's table with its machine, date and
  command, from the committed result file;
- `<!-- include: CONTRIBUTING.md -->`, `<!-- include: README.md -->`: a file of the repository.

Links that leave `docs/` (`../deploy/...`, or `docs/x.md` in an included top-level file) are
rewritten so that they work on the site as they do in the repository: a file of the repository a
page links is published with the site, under `REPO_FILES/` (the configuration a page describes,
a benchmark's result file, the license), so no page links a repository host. The repository's
address is a setting of the build, once: the theme's `repo_url`, set here from pyproject.toml's
`Repository` (the one place it is written). The tests call the same functions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[1]
REPO_FILES = "repository"  # where the site publishes the repository's files its pages link
MARKER = re.compile(r"^<!-- (generated|include): (\S+) -->$", re.MULTILINE)
# Defaults computed on the reader's machine, said in words rather than as this machine's value.
COMPUTED_DEFAULTS = {
    "data_dir": "the platform's user data folder (`~/.local/share/rlm-mcp` on Linux)",
    "allowed_roots": "your home folder",
}


def repository_url() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return str(project["project"]["urls"]["Repository"]).rstrip("/")


def _default(name: str, field: Any) -> str:
    if name in COMPUTED_DEFAULTS:
        return COMPUTED_DEFAULTS[name]
    if field.default_factory is not None:
        value = field.default_factory()
        return "none" if not value else f"`{json.dumps(value)}`"
    value = field.default
    if value is None:
        return "none (see meaning)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


def settings_rows(section: type[Any] | None = None) -> list[tuple[str, str, str]]:
    """(environment variable, default, meaning) of every setting (or one section's), in the model's order."""
    from rlm_mcp.config import SETTING_FIELDS

    rows = []
    for name, field in (section.model_fields if section is not None else SETTING_FIELDS).items():
        if not field.description:
            raise ValueError(f"rlm_mcp/config/: the setting {name} has no description; the docs' table needs one")
        rows.append((f"RLM_MCP_{name.upper()}", _default(name, field), field.description))
    return rows


def settings_table() -> str:
    """One table per settings section (rlm_mcp/config/), headed by its name and what it holds."""
    from rlm_mcp.config import SECTIONS

    parts = []
    for name, section in SECTIONS.items():
        lines = [f"### `{name}`", "", (section.__doc__ or "").strip(), ""]
        lines += ["| environment variable | default | meaning |", "|---|---|---|"]
        for env, default, meaning in settings_rows(section):
            lines.append(f"| `{env}` | {default} | {_cell(meaning)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def eval_forms(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each form of `rlm-mcp eval` (its first word, or TASKS.jsonl)."""
    from rlm_mcp.cli.eval import Forms

    (forms,) = [a for a in parser._actions if isinstance(a, Forms)]
    return {"TASKS.jsonl": forms.run_form, **forms._name_parser_map}


def commands(
    parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command a user can type: a parser with a handler, keyed by its words; `eval`'s three
    forms (a task file, generate, import) stand for `eval` itself."""
    if parser is None:
        from rlm_mcp.cli import build_parser

        parser = build_parser()
    if path == ("eval",):
        return {("eval", form): p for form, p in eval_forms(parser).items()}
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    if parser.get_default("handler") is not None:
        found[path] = parser
    for name, sub in _subparsers(parser).items():
        found.update(commands(sub, (*path, name)))
    return found


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().removeprefix("usage: ").replace(" [-h]", "").split())


def cli_reference() -> str:
    """The synopsis of every command, then each command's description and `--help`."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it for the page
    try:
        found = commands()
        synopsis = [_usage(p) for p in found.values()]
        parts = ["<!-- commands -->", "```text", *synopsis, "```", ""]
        for path, parser in found.items():
            words = " ".join(("rlm-mcp", *path))
            parts += [
                f"## `{words}`",
                "",
                parser.description or "",
                "",
                "```text",
                parser.format_help().rstrip(),
                "```",
                "",
            ]
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(parts)


def benchmark(relative: str) -> str:
    """A committed result file as a table, with the machine, the date and the command."""
    result = json.loads((REPO / relative).read_text(encoding="utf-8"))
    columns, rows = result["columns"], result["rows"]
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"{relative}: a row has {len(row)} cells for {len(columns)} columns: {row}")
    lines = [
        f"**{result['title']}**: `{result['command']}`, {result['date']}, on {result['machine']} "
        f"([{relative}](../{relative})).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows),
    ]
    return "\n".join(lines)


# Top-level files that are pages of the site too (docs/index.md, contributing.md, changelog.md).
SITE_PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md", "CHANGELOG.md": "changelog.md"}
RELATIVE_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def _from_docs(target: str) -> str:
    """A link written in a top-level file, as docs/ sees it."""
    path, _, anchor = target.partition("#")
    if path.startswith("docs/"):
        path = path.removeprefix("docs/")
    elif path in SITE_PAGES:
        path = SITE_PAGES[path]
    else:
        path = "../" + path
    return path + ("#" + anchor if anchor else "")


def include(relative: str) -> str:
    """A top-level file of the repository, less its first heading, its links made to work from docs/."""
    text = (REPO / relative).read_text(encoding="utf-8")
    text = re.sub(r"\A# [^\n]*\n+", "", text)
    return RELATIVE_LINK.sub(lambda m: f"]({_from_docs(m[1])})", text)


def expand(markdown: str) -> str:
    """The page with every marker replaced by its generated text."""

    def one(match: re.Match[str]) -> str:
        kind, what = match[1], match[2]
        if kind == "include":
            return include(what)
        if what == "settings":
            return settings_table()
        if what == "cli":
            return cli_reference()
        if what.startswith("bench/results/"):
            return benchmark(what)
        raise ValueError(f"unknown generated part {what!r}")

    return MARKER.sub(one, markdown)


OUTSIDE_LINK = re.compile(r"\]\(\.\./([^)\s#]+)(#[^)\s]*)?\)")


def outside_links(markdown: str) -> str:
    """`](../path)` links to files of the repository outside docs/ point at the copy the site
    publishes (`REPO_FILES/path`; every page is at the top of docs/)."""
    return OUTSIDE_LINK.sub(lambda m: f"]({REPO_FILES}/{m[1]}{m[2] or ''})", markdown)


def linked_repository_files() -> list[str]:
    """The repository's files (relative paths) that some page links outside docs/."""
    found: set[str] = set()
    for page in sorted((REPO / "docs").glob("*.md")):
        found |= {m[1] for m in OUTSIDE_LINK.finditer(expand(page.read_text(encoding="utf-8")))}
    for relative in found:
        if not (REPO / relative).resolve().is_relative_to(REPO) or not (REPO / relative).is_file():
            raise ValueError(f"a page links ../{relative}, which is not a file of the repository")
    return sorted(found)


def on_config(config: MkDocsConfig, **_: Any) -> MkDocsConfig:
    """MkDocs hook: the repository's address, from its one place, as the theme's link in every
    page's header. No edit links: each would be one more address to keep right."""
    config.repo_url = repository_url()
    config.edit_uri = ""
    return config


def on_files(files: Files, *, config: MkDocsConfig, **_: Any) -> Files:
    """MkDocs hook: the repository files the pages link, published with the site."""
    for relative in linked_repository_files():
        files.append(File.generated(config, f"{REPO_FILES}/{relative}", abs_src_path=str(REPO / relative)))
    return files


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: generated parts in, links out of docs/ made to the published copies."""
    return outside_links(expand(markdown))
