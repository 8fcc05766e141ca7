"""The scripted server's prefix ledger counts, per message, what rendering both prompts into
tokens and comparing them counts (`render`, `common_prefix`: the definition)."""

from __future__ import annotations

import random
from typing import Any

from rlm_mcp.testing.prefix import PrefixLedger, _text_tokens, common_prefix, render, reused_tokens, said
from rlm_mcp.testing.script import count_prompt_tokens, count_text_tokens

# Texts whose byte lengths fall on and off the 4-byte token edge, multi-byte characters among them.
TEXTS = ["", "a", "ab", "abc", "abcd", "abcde", "abcdefgh", "abcdefghi", "é", "aé", "abé", "abcé", "Turn 2:"]
TEXTS.append("x" * 70_000)  # past one slice of the byte comparison
ROLES = ["system", "user", "assistant"]


def _rendered(new: list[dict[str, Any]], previous: list[dict[str, Any]], completion: str) -> int:
    return common_prefix(render(new), render(previous) + _text_tokens(completion))


def _variant(text: str, rng: random.Random) -> str:
    """The same text, or one that shares a head with it."""
    choice = rng.randrange(5)
    if choice == 0:
        return text
    if choice == 1:
        return text + rng.choice(TEXTS)
    if choice == 2:
        return text[: rng.randrange(len(text) + 1)]
    if choice == 3 and text:
        at = rng.randrange(len(text))
        return text[:at] + rng.choice("zé") + text[at + 1 :]
    return rng.choice(TEXTS)


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    return [{"role": rng.choice(ROLES), "content": rng.choice(TEXTS)} for _ in range(rng.randrange(4))]


def test_per_message_count_equals_the_rendered_comparison() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        previous = _conversation(rng)
        completion = rng.choice(TEXTS)
        new = [dict(m) for m in previous]
        for m in new:  # some messages edited, some roles changed
            if rng.random() < 0.3:
                m["content"] = _variant(m["content"], rng)
            if rng.random() < 0.1:
                m["role"] = rng.choice(ROLES)
        if rng.random() < 0.7:  # the usual next turn: the completion as a reply, then more
            new.append({"role": rng.choice(["assistant", "assistant", "user"]), "content": _variant(completion, rng)})
            new += _conversation(rng)
        elif new and rng.random() < 0.5:
            del new[rng.randrange(len(new)) :]  # fewer messages than before
        want = _rendered(new, previous, completion)
        assert reused_tokens(said(new), said(previous), completion) == want, (new, previous, completion)


def test_the_ledger_records_prompt_and_reuse_per_session() -> None:
    ledger = PrefixLedger()
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Turn 1:"}]
    second = [*first, {"role": "assistant", "content": "reply é"}, {"role": "user", "content": "out"}]
    ledger.completed("s", ledger.request("s", first), "reply é")
    ledger.completed("t", ledger.request("t", second), "other")
    ledger.completed("s", ledger.request("s", second), "next")
    one, two = ledger.by_session("s")
    assert (one.prompt_tokens, one.reused_tokens) == (count_prompt_tokens(first), 0)
    assert ledger.by_session("t")[0].reused_tokens == 0  # another session: nothing cached for it
    assert two.prompt_tokens == len(render(second)) == count_prompt_tokens(second)
    assert two.reused_tokens == count_prompt_tokens(first) + count_text_tokens("reply é")
    assert two.reused_tokens == _rendered(second, first, "reply é")


def test_common_bytes_finds_the_first_difference_anywhere() -> None:
    from rlm_mcp.testing.prefix import _common_bytes

    base = bytes(range(256)) * 700  # past one slice of the comparison
    for at in (0, 1, 3, 4, 5, 65535, 65536, 65537, 100_000, len(base) - 1):
        changed = base[:at] + b"!" + base[at + 1 :]
        assert _common_bytes(base, changed) == at
        assert _common_bytes(base[:at], base) == at  # one ends where the other goes on
    assert _common_bytes(base, base) == len(base)
    assert _common_bytes(b"", b"") == 0
