"""The answer rules (rlm_mcp/sandbox/guest/answer_rules.py) and the trained error shape, through the
real kernel in a real sandbox: one case per edge."""

from __future__ import annotations

import pytest

from rlm_mcp.sandbox.guest import answer_rules
from rlm_mcp.sandbox.guest.bootstrap import kernel_payload
from tests.fixtures_sandbox import docker_image, no_bridge, ready_manager

__all__ = ["docker_image"]

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("docker_image")]

EDGE_CASES = [
    # (cell, expected end-of-cell answer)
    ("pass", {"content": "", "ready": False}),  # initial: content "" as in the reference
    ("print(answer)", {"content": "", "ready": False}),
    ('answer["ready"] = "False"', {"content": "", "ready": False}),  # a string never ends a run
    ('answer["ready"] = "yes"', {"content": "", "ready": False}),
    ('answer["ready"] = 1\nanswer["content"] = "after"', {"content": "after", "ready": True}),  # order irrelevant
    ('answer["content"] = None\nanswer["ready"] = True', {"content": "", "ready": True}),
    ('answer.update(content={"k": 1}, ready=True)', {"content": "{'k': 1}", "ready": True}),
    ('answer = {"content": 5, "ready": [1]}', {"content": "5", "ready": True}),  # rebinding counts
    ("answer = 'not a dict'", None),
    ('answer = {"ready": True}', {"content": "", "ready": True}),
    ('FINAL("text")', {"content": "text", "ready": True}),
    ("v = [1, 2]\nFINAL_VAR(\"'v'\")", {"content": "[1, 2]", "ready": True}),
    (
        "class Bad:\n    def __str__(self):\n        raise ValueError('no')\nanswer['content'] = Bad()\nanswer['ready'] = True",
        {"content": "Error: the answer could not be turned into text (ValueError: no)", "ready": False},
    ),
]


async def test_answer_edge_cases_through_the_kernel() -> None:
    async with ready_manager() as manager:
        for code, expected in EDGE_CASES:
            async with manager.open([]) as sb:  # a fresh namespace per case
                result = await sb.execute(code, no_bridge)
                assert result.error is None, (code, result.error)
                assert result.answer == expected, code
                if code == "print(answer)":
                    assert result.stdout == "{'content': '', 'ready': False}\n"


def test_the_kernel_payload_carries_the_shared_rules() -> None:
    payload = kernel_payload().decode()
    assert payload.split("\n", 1)[1].startswith('"""The answer protocol inside a REPL')
    assert "def read_answer(" in payload and "def handle_exec(" in payload
    ns: dict[str, object] = {}
    assert answer_rules.read_answer(ns, 10) is None
    assert answer_rules.read_answer({"answer": {"content": "x" * 20, "ready": True}}, 10) == {
        "content": "x" * 10 + "\n... [answer truncated at 10 characters]",
        "ready": True,
    }


async def test_trained_error_shape_and_rollback() -> None:
    async with ready_manager() as manager, manager.open([]) as sb:
        kept = await sb.execute("a = 1\nb = 1 / 0", no_bridge)
        assert kept.error is not None and kept.error.startswith("ZeroDivisionError: division by zero")
        assert kept.trained_error == (
            "\nZeroDivisionError: division by zero\nTraceback (most recent call last):\n"
            '  File "<string>", line 2, in <module>\nZeroDivisionError: division by zero\n'
        )
        assert kept.variables_at_start == ["answer"] and "a" in kept.variables
        assert (await sb.execute("print(a)", no_bridge)).stdout == "1\n"  # rlm-mcp keeps bindings
        undone = await sb.execute("c = 2\nraise KeyError('k')", no_bridge, training_cell=True)
        assert undone.variables_at_start == ["answer", "a"]
        gone = await sb.execute("print('c' in globals())", no_bridge)
        assert gone.stdout == "False\n"  # as training: a raising cell binds nothing
        late = await sb.execute("d = 4\nprint(SHOW_VARS())", no_bridge, training_cell=True)
        assert late.stdout == "Available variables: {'a': 'int'}\n"  # as training: names at cell start
        now = await sb.execute("print(SHOW_VARS())", no_bridge)
        assert now.stdout == "Available variables: {'a': 'int', 'd': 'int'}\n"
        syntax = await sb.execute("x = (1,", no_bridge)
        assert syntax.trained_error is not None
        assert syntax.trained_error.startswith("\nSyntaxError: '(' was never closed (<string>, line 1)\n")
        assert '  File "<string>", line 1\n    x = (1,\n' in syntax.trained_error
