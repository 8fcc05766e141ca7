"""Test modules share helpers through tests/fixtures_*.py, never by importing each other: pytest
loads a test module under its bare name (`test_http_guard`), so another module's
`from tests.unit.test_http_guard import ...` loads it a second time, with its own copies of its
state; and a fast-tier test that imports an e2e module depends on everything that module imports."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.tiers import TESTS


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> Iterator[str]:
    """The dotted module names an import statement in `package` loads (a name imported from a
    package counts as a module: `from tests.e2e import test_cli`)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:  # relative: resolve against the importing module's package
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        module = f"{base}.{node.module}" if node.module else base
    else:
        module = node.module or ""
    yield module
    yield from (f"{module}.{alias.name}" for alias in node.names)


def imports_of_test_modules(source: str, package: str) -> list[str]:
    """The test modules (a `test_` name under tests., or a bare one) that `source`, a module of `package`, imports."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in _imported(node, package):
                parts = name.split(".")
                if parts[0] == "tests":
                    first = next((i for i, part in enumerate(parts) if i and part.startswith("test_")), None)
                else:  # a bare `test_x`: a test module, on the path because pytest put its folder there
                    first = 0 if parts[0].startswith("test_") else None
                if first is not None and (module := ".".join(parts[: first + 1])) not in found:
                    found.append(module)
    return found


def test_the_check_sees_every_form_of_import() -> None:
    assert imports_of_test_modules("from tests.e2e.test_cli import cli", "tests.unit") == ["tests.e2e.test_cli"]
    assert imports_of_test_modules("import tests.unit.test_x as x", "tests.unit") == ["tests.unit.test_x"]
    assert imports_of_test_modules("from tests.e2e import test_cli", "tests.unit") == ["tests.e2e.test_cli"]
    assert imports_of_test_modules("from .test_y import helper", "tests.unit") == ["tests.unit.test_y"]
    assert imports_of_test_modules("def f():\n    from tests.e2e.test_z import z\n", "tests.unit") == [
        "tests.e2e.test_z"
    ]
    assert imports_of_test_modules("from test_http_guard import serving", "tests.unit") == ["test_http_guard"]
    assert imports_of_test_modules("from tests.fixtures_e2e import cli", "tests.unit") == []
    assert imports_of_test_modules("from rlm_mcp.testing.test_double import x", "tests.unit") == []


def test_no_test_module_imports_another() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        package = ".".join(("tests", *path.relative_to(TESTS).parent.parts))
        for name in imports_of_test_modules(path.read_text(encoding="utf-8"), package):
            offenders.append(f"{path.relative_to(TESTS.parent)} imports {name}")
    assert not offenders, "move the shared helper into a tests/fixtures_*.py module:\n" + "\n".join(offenders)
