"""docs/scripted-lm.md (issue 41 item 9): its tables name every key of the script and of a fault
(`rlm_mcp.testing.script`), and its session demo is a script that loads and answers each of its
two questions with the reply the page says, the follow-up reading what the first run left."""

from __future__ import annotations

import re

from rlm_mcp.testing.script import Fault, Replier, Script
from tests.readme_blocks import DOCS, blocks

PAGE = DOCS / "scripted-lm.md"
IN_PROCESS_ONLY = {"root_fn", "sub_fn"}  # functions, never in a JSON script


def table_keys(heading_line: str) -> list[str]:
    """The first column of the table that follows `heading_line` on the page."""
    text = PAGE.read_text(encoding="utf-8")
    after = text[text.index(heading_line) :]
    table = re.search(r"\| key \| default \| meaning \|\n\|---\|---\|---\|\n((?:\|.*\n)+)", after)
    assert table is not None, heading_line
    return re.findall(r"^\| `(\w+)` \|", table[1], re.M)


def test_the_tables_name_every_key_of_a_script_and_of_a_fault() -> None:
    assert table_keys("## The script format") == [f for f in Script.model_fields if f not in IN_PROCESS_ONLY]
    assert table_keys("A fault (`faults` entry)") == list(Fault.model_fields)


def test_the_session_demo_answers_each_question_with_its_reply() -> None:
    (block,) = [b for b in blocks(PAGE) if b.marker.startswith("<!-- scripted-lm: session-demo")]
    script = Script.model_validate_json(block.text)
    replier = Replier(script)
    commands = next(b for b in blocks(PAGE) if "--script session-demo.json" in b.text).text
    queries = re.findall(r'rlm-mcp run "([^"]+)"', commands)
    assert len(queries) == 2 and "--keep-session" in commands and "--session" in commands
    first, follow_up = (
        replier.reply([{"role": "system", "content": "s"}, {"role": "user", "content": f"Query: {q}"}], "root", 1)
        for q in queries
    )
    assert "words = len(context.split())" in first
    assert "{words}" in follow_up and "words =" not in follow_up  # it reads what the first run left
