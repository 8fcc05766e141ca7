"""Every module a docstring of rlm_mcp/ or a page of docs/ names exists: a dotted name
(`rlm_mcp.store.index`, or `store.pg.runs` written from inside the package), a name in a module
(`store.sqlite_index.ContextStore`), or a path (`service/queue/state.py`). A module that moved or
never existed (`store.pg.index`) sends the reader nowhere.

Only what reads as a module is judged: a name starting `rlm_mcp.`; a backticked name whose first
two parts are a subpackage and a module or package in it (`store.pg...`; `sandbox.execute` or
`usage.prompt_tokens_details` are attributes, not modules); a path under a subpackage ending .py.
File names (`server.json`, `x.py` written dotted) are not modules."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.paths import REPO

PACKAGE = REPO / "rlm_mcp"
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
_FIRST = "|".join(SUBPACKAGES)
FULL = re.compile(r"\brlm_mcp(?:\.[A-Za-z_]\w*)+")
SHORT = re.compile(rf"`((?:{_FIRST})(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(rf"(?<![\w/.-])(?:rlm_mcp/)?((?:{_FIRST})/[\w/]*\w\.py)\b")
FILE_SUFFIXES = {"py", "json", "jsonl", "key", "md", "toml", "yml", "yaml", "txt", "sql", "html", "js", "css", "log"}


def _module_file(parts: list[str]) -> tuple[Path | None, list[str]]:
    """The file of the longest module prefix of `parts` (under rlm_mcp/), and the parts after it."""
    here, found = REPO, None
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here, found = here / part, here / part / "__init__.py"
        elif (here / f"{part}.py").is_file():
            return here / f"{part}.py", parts[i + 1 :]
        else:
            return found, parts[i:]
    return found, []


@cache
def _top_level_names(module: Path) -> frozenset[str]:
    """What a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def resolves(name: str) -> bool:
    """A dotted name (with or without the leading `rlm_mcp.`) is a module, or a name one defines."""
    parts = name.split(".")
    if parts[0] != "rlm_mcp":
        parts = ["rlm_mcp", *parts]
    module, rest = _module_file(parts)
    return module is not None and (not rest or rest[0] in _top_level_names(module))


def named_modules(text: str) -> list[str]:
    """The dotted names in `text` that read as modules of rlm_mcp (see the module docstring)."""
    names = [m for m in FULL.findall(text)]
    for short in SHORT.findall(text):
        first, second = short.split(".")[:2]
        if (PACKAGE / first / second / "__init__.py").is_file() or (PACKAGE / first / f"{second}.py").is_file():
            names.append(short)
    return [n for n in names if n.rsplit(".", 1)[-1] not in FILE_SUFFIXES]


def named_paths(text: str) -> list[str]:
    return PATH.findall(text)


def _docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return "\n".join(d for node in ast.walk(tree) if isinstance(node, kinds) and (d := ast.get_docstring(node)))


def _texts() -> list[tuple[str, str]]:
    code = [(p, _docstrings(p)) for p in sorted(PACKAGE.rglob("*.py"))]
    pages = [(p, p.read_text(encoding="utf-8")) for p in sorted((REPO / "docs").glob("*.md"))]
    return [(str(p.relative_to(REPO)), text) for p, text in code + pages]


def test_what_counts_as_a_module_name() -> None:
    text = (
        "`store.pg.runs` and rlm_mcp.store.index, `store.sqlite_index.ContextStore`, "
        "`sandbox.execute`, `usage.prompt_tokens_details.cached_tokens`, `server.json`, `store.py`"
    )
    assert named_modules(text) == ["rlm_mcp.store.index", "store.pg.runs", "store.sqlite_index.ContextStore"]
    assert named_paths("see service/queue/state.py and rlm_mcp/store/pg/runs.py, not tests/x.py") == [
        "service/queue/state.py",
        "store/pg/runs.py",
    ]
    assert resolves("store.pg.runs") and resolves("rlm_mcp.store.sqlite_index.ContextStore")
    assert not resolves("store.pg.index") and not resolves("rlm_mcp.store.sqlite_index.NoSuchThing")


def test_every_module_the_docs_name_exists() -> None:
    missing = []
    for where, text in _texts():
        missing += [f"{where}: {name}" for name in named_modules(text) if not resolves(name)]
        missing += [f"{where}: {path}" for path in named_paths(text) if not (PACKAGE / path).is_file()]
    assert not missing, "these name no module of rlm_mcp (moved or misspelt?):\n" + "\n".join(sorted(set(missing)))
