"""The core loop: messages, turns, output formatting, answer protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures_engine import FakeChatModel, make_context, make_settings, repl, run_engine

pytestmark = pytest.mark.anyio


async def test_one_turn_answer_and_message_structure(tmp_path: Path) -> None:
    lm = FakeChatModel(
        root=[
            repl("print(len(context))"),
            repl('answer["content"] = "42"\nanswer["ready"] = True', "Submitting."),
        ]
    )
    result, events, factory, progress = await run_engine(tmp_path, lm, system_prompt="SYS", max_iterations=20)
    assert result.status == "completed"
    assert result.answer == "42"
    assert result.iterations == 2
    assert progress.status == "completed"
    first, second = lm.root_calls
    m = first.messages
    assert [x["role"] for x in m] == ["system", "user", "user"]
    assert m[0]["content"] == "SYS"
    assert m[1]["content"].startswith(
        "Answer the following: What is the magic number?\n\nYour context is a str of 240 total characters."
    )
    assert "sub-LLM call can handle roughly ~12k tokens" in m[1]["content"]
    assert m[2]["content"].endswith("\n\nTurn 1/20:")
    assert "not" in m[2]["content"].split("\n\n")[0]  # the safeguard
    m2 = second.messages
    assert m2[:3] == m  # the prefix never changes
    assert m2[3] == {"role": "assistant", "content": first_reply(lm)}
    assert m2[4] == {
        "role": "user",
        "content": "REPL output:\n\n240\n\n\nREPL variables: ['answer', 'context_0', 'context']\n",
    }
    assert m2[5] == {"role": "user", "content": "Turn 2/20:"}
    assert factory.closed == 1
    types = [e["type"] for e in events.items]
    assert types[0] == "run_start" and types[-1] == "run_end"
    for kind in ("turn_start", "llm_call", "cell", "turn"):
        assert kind in types
    assert events.of("run_end")[0]["status"] == "completed"
    turn1 = events.of("turn")[0]
    # Turn 1 carries the whole opening (system and metadata too), later turns only what is new.
    assert [x["role"] for x in turn1["new_messages"]] == ["system", "user", "user", "assistant", "user"]
    assert [x["role"] for x in events.of("turn")[1]["new_messages"]] == ["user", "assistant", "user"]
    start = events.of("run_start")[0]
    assert start["contexts"] == [{"context_id": "ctx", "name": "ctx", "kind": "str", "chars": 240}]
    assert "The magic number" not in str(start)


def first_reply(lm: FakeChatModel) -> str:
    assert isinstance(lm.root, list)
    reply = lm.root[0]
    assert isinstance(reply, str)
    return reply


async def test_no_repl_block_just_continues_with_next_turn(tmp_path: Path) -> None:
    lm = FakeChatModel(
        root=["I think first.", "```python\nprint(1)\n```", repl('answer.update(content="x", ready=True)')]
    )
    result, *_ = await run_engine(tmp_path, lm)
    assert result.status == "completed" and result.answer == "x"
    m = lm.root_calls[2].messages
    assert [x["role"] for x in m[2:]] == ["user", "assistant", "user", "assistant", "user"]
    assert m[4]["content"] == "Turn 2/20:"
    assert m[6]["content"] == "Turn 3/20:"


async def test_only_exact_repl_fences_run(tmp_path: Path) -> None:
    reply = (
        "```python\nprint('py')\n```\n```REPL\nprint('upper')\n```\n```repl print('one-line')```\n"
        "```repl\nprint('yes')\n```"
    )
    lm = FakeChatModel(root=[reply, repl('answer["content"]="a"; answer["ready"]=True')])
    result, events, factory, _ = await run_engine(tmp_path, lm)
    assert factory.opened[0].cells[0] == "print('yes')"
    out = lm.root_calls[1].messages[4]["content"]
    assert out.startswith("REPL output:\n\nyes\n")


async def test_multiple_blocks_run_in_order_in_one_sandbox(tmp_path: Path) -> None:
    reply = repl("x = 1\nprint('a')") + "\nthen\n" + repl("print(x + 1)") + "\n" + repl("pass")
    lm = FakeChatModel(root=[reply, repl('answer["content"]=x; answer["ready"]=True')])
    result, events, factory, _ = await run_engine(tmp_path, lm)
    out = lm.root_calls[1].messages[4]["content"]
    assert out.startswith("REPL output (block 1):\n\na\n")
    assert "\n\nREPL output (block 2):\n\n2\n" in out
    assert "REPL output (block 3):\nREPL variables:" in out
    assert len(events.of("cell")) == 4
    assert result.answer == "1"  # non-string content is stringified
    assert len(factory.opened) == 1


async def test_output_truncated_at_20000_chars_per_block(tmp_path: Path) -> None:
    reply = repl("print('a' * 50000)") + "\n" + repl("print('b' * 10)")
    lm = FakeChatModel(root=[reply, repl('answer["content"]="d"; answer["ready"]=True')])
    await run_engine(tmp_path, lm)
    out = lm.root_calls[1].messages[4]["content"]
    block1, block2 = out.split("\n\nREPL output (block 2):\n")
    body = block1.removeprefix("REPL output (block 1):\n")
    assert body.startswith("\n" + "a" * 100)
    assert body.endswith("... + [30073 chars...]") or "... + [" in body
    head = body.split("... + [")[0]
    assert len(head) == 20000
    formatted_len = len("\n" + "a" * 50000 + "\n") + 2 + len("REPL variables: ['answer', 'context_0', 'context']\n")
    assert body.endswith(f"... + [{formatted_len - 20000} chars...]")
    assert block2.startswith("\nbbbbbbbbbb\n")


async def test_no_output_and_error_formatting(tmp_path: Path) -> None:
    settings = make_settings()
    lm = FakeChatModel(root=[repl("_x = 1"), repl("1/0"), repl('answer["content"]="ok"; answer["ready"]=True')])
    result, events, *_ = await run_engine(tmp_path, lm, settings=settings)
    m = lm.root_calls[2].messages
    assert "REPL variables:" in m[4]["content"]
    assert "ZeroDivisionError: division by zero" in m[7]["content"]
    assert events.of("cell")[1]["error"].startswith("ZeroDivisionError")


async def test_several_contexts_are_listed(tmp_path: Path) -> None:
    a = make_context(tmp_path, "aaaa", "a")
    b = make_context(tmp_path, "bbbbbb", "b")
    lm = FakeChatModel(root=[repl('answer["content"]=context_1; answer["ready"]=True')])
    result, *_ = await run_engine(tmp_path, lm, contexts=[a, b])
    meta = lm.root_calls[0].messages[1]["content"]
    assert "2 contexts of 10 total characters" in meta
    assert "context_0 is a str of 4 characters; context_1 is a str of 6 characters" in meta
    assert "context_0 through context_1" in lm.root_calls[0].messages[2]["content"]
    assert result.answer == "bbbbbb"


async def test_no_query_means_no_answer_line(tmp_path: Path) -> None:
    lm = FakeChatModel(root=[repl('answer["content"]="z"; answer["ready"]=True')])
    await run_engine(tmp_path, lm, query="")
    assert lm.root_calls[0].messages[1]["content"].startswith("Your context is a str of")
