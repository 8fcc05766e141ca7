"""The front hall: the README stays short (it is also PyPI's page), the docs site builds with
`mkdocs build --strict` (no broken internal link, every generated part in place), and the
generated parts come from the code and the committed result files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme_blocks import DOCS, README, REPO
from tools.docs_pages import MARKER, benchmark, expand, include

README_MAX_LINES = 250
# The benchmarks page says what each benchmark measures and where it stands; each round's figures
# and account live in bench/results/ (CONTRIBUTING.md, Benchmarks), so the page does not grow a diary.
BENCHMARKS_MAX_LINES = 500


def test_the_readme_is_read_in_five_minutes() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to a docs/ page"


def test_the_benchmarks_page_says_where_things_stand_not_their_history() -> None:
    lines = (DOCS / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= BENCHMARKS_MAX_LINES, (
        f"docs/benchmarks.md has {len(lines)} lines; move a round's account to bench/results/ and name its file there"
    )


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s+([\w-]+\.md)$", config, re.M))
    pages = {p.name for p in DOCS.glob("*.md")}
    assert listed == pages, f"in docs/ but not in mkdocs.yml's nav: {pages - listed}; nav only: {listed - pages}"


def test_every_benchmark_table_names_its_machine_date_and_command() -> None:
    results = sorted((REPO / "bench" / "results").glob("*.json"))
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"<!-- generated: (bench/results/[\w.]+) -->", page))
    assert shown == {p.relative_to(REPO).as_posix() for p in results}
    for path in results:
        result = json.loads(path.read_text(encoding="utf-8"))
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", result["date"]) and result["machine"] and result["command"]
        table = benchmark(path.relative_to(REPO).as_posix())
        assert result["date"] in table and all(row[0] in table for row in result["rows"])
    # no figure table typed into the page by hand
    assert not re.search(r"^\|", page, re.M)


def test_included_files_link_into_the_site_or_the_repository() -> None:
    text = include("README.md")
    assert "](getting-started.md)" in text and "](viewer-run.png)" in text and "](contributing.md)" in text
    assert "](docs/" not in text and "](../LICENSE)" in text


def test_an_unknown_generated_part_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown generated part"):
        expand("<!-- generated: nothing -->")
    assert MARKER.search("<!-- generated: cli -->")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    site = tmp_path / "site"
    configuration = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    assert "RLM_MCP_SANDBOX_MEMORY" in configuration and "<!-- generated" not in configuration
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "rlm-mcp runs view" in cli and "--no-open" in cli
    assert (site / "viewer-run.png").exists()
    # A file of the repository a page links is published with the site; no page links a
    # repository host for it (the repository's address is one setting: the theme's repo_url).
    team = (site / "team" / "index.html").read_text(encoding="utf-8")
    assert 'href="../repository/deploy/haproxy/haproxy.cfg"' in team
    assert (site / "repository" / "deploy" / "haproxy" / "haproxy.cfg").read_bytes() == (
        REPO / "deploy" / "haproxy" / "haproxy.cfg"
    ).read_bytes()
    assert not [p for p in site.rglob("*.html") if "/blob/main/" in p.read_text(encoding="utf-8")]


def test_a_benchmark_run_records_what_the_page_shows(tmp_path: Path) -> None:
    # bench/results_file.py writes what tools/docs_pages.py renders: figures, machine, date, command.
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from results_file import ResultFile
    finally:
        sys.path.remove(str(REPO / "bench"))
    recorded = ResultFile("probe", "A probe", ["what", "median"], note="engine: test")
    recorded.add("trivial cell round trip", "0.52 ms")
    with pytest.raises(ValueError):
        recorded.add("one cell too few")
    path = recorded.write(tmp_path)
    result = json.loads(path.read_text(encoding="utf-8"))
    assert "vCPUs" in result["machine"] and "engine: test" in result["machine"]
    table = benchmark(str(path))
    assert "| trivial cell round trip | 0.52 ms |" in table and result["date"] in table
