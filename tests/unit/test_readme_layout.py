"""The contributing page's "Layout" (docs/contributing.md) names every module of the package, and
only modules that exist: a module added, moved or removed without the page fails here, naming the
fix."""

from __future__ import annotations

import re

from tests.paths import REPO
from tests.readme_blocks import DOCS

LAYOUT_PAGE = DOCS / "contributing.md"

PACKAGE = REPO / "rlm_mcp"


def _layout() -> dict[str, set[str]]:
    """Each bullet's folder (`store/`, `service/loaders/`; `rlm_mcp/` for the top level) and the
    module file names it mentions."""
    text = LAYOUT_PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Layout\n") :]
    section = section[: section.index("\n## ", 1)]
    named: dict[str, set[str]] = {}
    for bullet in re.split(r"\n- ", section)[1:]:
        folder = re.match(r"`([\w/]+/)`", bullet)
        assert folder is not None, bullet
        named[folder[1]] = set(re.findall(r"`(\w+\.py)`", bullet))
    return named


def _modules() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py" or "__pycache__" in path.parts:
            continue
        folder = path.parent.relative_to(PACKAGE).as_posix()
        found.setdefault("rlm_mcp/" if folder == "." else folder + "/", set()).add(path.name)
    return found


def test_the_layout_names_every_module() -> None:
    named = _layout()
    for folder, modules in _modules().items():
        missing = modules - named.get(folder, set())
        assert not missing, f"docs/contributing.md Layout: add {sorted(missing)} to the `{folder}` bullet"


def test_the_layout_names_only_modules_that_exist() -> None:
    modules = _modules()
    for folder, files in _layout().items():
        if folder.rstrip("/") in ("sandbox_images", "bench", "tests"):
            continue
        stale = files - modules.get(folder, set())
        assert not stale, (
            f"docs/contributing.md Layout names {sorted(stale)} under `{folder}`, which do not exist there"
        )
