"""The CLI's help is its documentation: every command and option has help text, and the docs'
CLI reference (docs/cli.md, generated from the parser by tools/docs_pages.py; its synopsis is the
block marked `<!-- commands`) names exactly the commands and options that `rlm-mcp --help` and
each command's `--help` describe."""

from __future__ import annotations

import argparse
import re
import subprocess

import pytest

from rlm_mcp.cli import build_parser, main
from rlm_mcp.cli.eval import Forms
from tests.fixtures_e2e import SERVER_SCRIPT
from tests.readme_blocks import DOCS
from tools.docs_pages import cli_reference

Path_ = tuple[str, ...]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _commands(parser: argparse.ArgumentParser, path: Path_ = ()) -> dict[Path_, argparse.ArgumentParser]:
    """Every command a user can type: a parser with a handler, keyed by its words; `eval`'s three
    forms (a task file, generate, import) stand for `eval` itself."""
    if path == ("eval",):
        return {("eval", form): p for form, p in eval_forms(parser).items()}
    found: dict[Path_, argparse.ArgumentParser] = {}
    if parser.get_default("handler") is not None:
        found[path] = parser
    for name, sub in _subcommands(parser).items():
        found.update(_commands(sub, (*path, name)))
    return found


def eval_forms(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each form of `rlm-mcp eval` (its first word, or TASKS.jsonl)."""
    (forms,) = [a for a in parser._actions if isinstance(a, Forms)]
    return {"TASKS.jsonl": forms.run_form, **forms._name_parser_map}


def _readme_commands() -> dict[Path_, str]:
    assert "<!-- generated: cli -->" in (DOCS / "cli.md").read_text(encoding="utf-8"), "docs/cli.md lost its reference"
    reference = cli_reference()
    synopsis = reference[reference.index("```text\n", reference.index("<!-- commands")) + 8 :]
    listed: dict[Path_, str] = {}
    for line in synopsis[: synopsis.index("```")].splitlines():
        words = line.split()
        assert words[0] == "rlm-mcp", line
        path: list[str] = []
        for word in words[1:]:
            if word in ("TASKS.jsonl",) or re.fullmatch(r"[a-z]+", word):
                path.append(word)
            else:
                break
        if path[:1] == ["eval"] and len(path) == 1:
            path.append("TASKS.jsonl")
        listed[tuple(path)] = line
    return listed


COMMANDS = _commands(build_parser())
LISTED = _readme_commands()


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]


def test_the_readme_lists_every_command_and_no_other() -> None:
    assert set(LISTED) == set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: " ".join(p) or "rlm-mcp")
def test_every_option_and_argument_has_help_and_is_listed(path: Path_) -> None:
    parser, line = COMMANDS[path], LISTED[path]
    listed_options = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", line))
    options = _options(parser)
    for action in [*options, *_positionals(parser)]:
        if action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{' '.join(path)}: {action.dest} has no help text"
    for action in options:
        assert listed_options & set(action.option_strings), (
            f"the CLI reference omits {action.option_strings[-1]}: {line}"
        )
    known = {s for a in options for s in a.option_strings}
    assert listed_options <= known, (
        f"the CLI reference lists options `{' '.join(path)}` lacks: {listed_options - known}"
    )
    if path[:1] != ("eval",):  # eval's forms are named by their first word
        for action in _positionals(parser):
            assert action.dest.upper() in re.findall(r"[A-Z_]+", line.upper()), (
                f"the CLI reference omits {action.dest.upper()}: {line}"
            )


def test_every_command_has_a_description() -> None:
    for path, parser in COMMANDS.items():
        assert parser.description, " ".join(path)


def test_rlm_mcp_help_names_every_command() -> None:
    proc = subprocess.run([str(SERVER_SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name in _subcommands(build_parser()):
        assert re.search(rf"^\s+{name}\s+\S", proc.stdout, re.M), f"`rlm-mcp --help` omits {name}"


@pytest.mark.parametrize("path", sorted(p for p in COMMANDS if p), ids=" ".join)
def test_each_commands_help_shows_its_options(
    path: Path_, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("RLM_MCP_DATA_DIR", str(tmp_path))
    argv = [*path[:1], *path[1:]] if path[:2] != ("eval", "TASKS.jsonl") else ["eval", "tasks.jsonl"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for action in _options(COMMANDS[path]):
        assert action.option_strings[-1] in shown and str(action.help).split()[0] in shown


def test_eval_help_shows_the_run_forms_options_and_names_the_other_forms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["eval", "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for action in _options(COMMANDS[("eval", "TASKS.jsonl")]):
        assert action.option_strings[-1] in shown, f"`rlm-mcp eval --help` omits {action.option_strings[-1]}"
    assert re.search(r"^\s+generate\s+\S", shown, re.M) and re.search(r"^\s+import\s+\S", shown, re.M)


def test_a_task_file_named_like_no_form_is_run_by_the_run_form(capsys: pytest.CaptureFixture[str]) -> None:
    # The run form parses the whole rest: a missing --output is its own error, naming its usage.
    with pytest.raises(SystemExit) as exited:
        main(["eval", "tasks.jsonl", "--parallel", "2"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "rlm-mcp eval TASKS.jsonl: error" in err and "--output" in err
