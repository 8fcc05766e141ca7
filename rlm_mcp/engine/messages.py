"""The chat history of one run and the user messages the engine writes into it.

The texts follow the trained layout (metadata message, `Turn k/N:` messages, REPL output
messages) in this project's own words. Messages already sent are never rewritten except by
window elision (window.py), so vLLM's prefix cache keeps hitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rlm_mcp.ports import ContextSpec

MessageKind = Literal["system", "metadata", "turn", "assistant", "output", "notice"]


@dataclass
class Entry:
    """One message of the history, tagged with what it is (so elision knows what it may touch)."""

    message: dict[str, str]  # as sent: {"role": ..., "content": ...}
    kind: MessageKind
    turn: int  # the iteration that added it (0: setup)
    elided: bool = False  # its content was replaced by a marker


@dataclass
class History:
    """The run's messages in order, as typed entries."""

    entries: list[Entry] = field(default_factory=list)

    def add(self, role: str, content: str, kind: MessageKind, turn: int) -> dict[str, str]:
        message = {"role": role, "content": content}
        self.entries.append(Entry(message, kind, turn))
        return message

    @property
    def messages(self) -> list[dict[str, str]]:
        """The messages themselves (the same dicts: window elision edits them in place)."""
        return [entry.message for entry in self.entries]

    @property
    def elided_count(self) -> int:
        return sum(entry.elided for entry in self.entries)

    def snapshot(self) -> list[dict[str, str]]:
        """Copies to hand to the LM client (it must not be able to alter our history)."""
        return [dict(entry.message) for entry in self.entries]

    def __len__(self) -> int:
        return len(self.entries)


def _fmt_int(value: int) -> str:
    return f"{value:,}"


def metadata_message(query: str | None, contexts: Sequence[ContextSpec], sub_capacity_tokens: int) -> str:
    """The first user message: the query, what the context is, and what one sub-call can take."""
    total = sum(c.chars for c in contexts)
    if len(contexts) <= 1:
        kind = contexts[0].kind if contexts else "str"
        body = f"Your context is a {kind} of {total} total characters."
    else:
        listing = "; ".join(f"context_{i} is a {c.kind} of {c.chars} characters" for i, c in enumerate(contexts))
        body = (
            f"Your context is {len(contexts)} contexts of {total} total characters (`context` is context_0): {listing}."
        )
    # The real capacity, from the sub model's window (the reference always claims ~100k).
    capacity_k = max(1, round(sub_capacity_tokens / 1000))
    body += (
        f" Each sub-LLM call can handle roughly ~{capacity_k}k tokens at once "
        f"(about {_fmt_int(sub_capacity_tokens * 3)} characters of prompt)."
    )
    if query:
        return f"Answer the following: {query}\n\n{body}"
    return body


def added_contexts_note(contexts: Sequence[ContextSpec], first_index: int) -> str:
    """A kept session's follow-up: where this run's contexts are bound (after the earlier ones)."""
    listing = "; ".join(
        f"context_{i} is a {c.kind} of {c.chars} characters" for i, c in enumerate(contexts, first_index)
    )
    return f"This question adds {len(contexts)} context{'s' if len(contexts) > 1 else ''}: {listing}."


def no_new_context_note(context_count: int) -> str:
    """A follow-up that adds no context (the reference always adds one)."""
    last = f"context_{context_count - 1}"
    span = "context_0" if context_count == 1 else f"context_0 through {last}"
    return (
        f"No new context was added for this question: the REPL still holds {span} "
        "and every variable from the earlier conversations."
    )


def session_restarted_note() -> str:
    """A kept session's REPL had stopped between runs and was started again (variables lost)."""
    return (
        "Note: this session's REPL had stopped since the last question and was started again: "
        "the variables of earlier runs are gone; the contexts and the histories were loaded again."
    )


def session_partial_note(runs_kept: int | None) -> str:
    """A kept session was restored from a snapshot older than its last run (team mode: the worker
    holding it was lost, or its REPL stopped, before a newer one was stored), or with none at all."""
    if not runs_kept:
        return (
            "Note: this session's REPL was restored in a fresh sandbox, but no snapshot of its variables was "
            "stored: the variables of earlier runs are gone. The contexts and the histories are all there."
        )
    return (
        f"Note: this session's REPL was restored in a fresh sandbox from the snapshot stored after its first "
        f"{runs_kept} run(s); variables set after them are gone. The contexts and the histories are all there."
    )


def restored_lost_note(names: Sequence[str]) -> str:
    """A kept session's REPL was restored in a fresh sandbox, and some names could not be saved."""
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return (
        f"Note: this session's REPL was restored in a fresh sandbox; these variables could not be saved and "
        f"are gone: {shown}. Everything else, the contexts and the histories are there."
    )


# Turn 1 starts with a two-sentence safeguard (as in training): the model has not seen the
# context yet and must look before it answers.
_FIRST_TURN_SAFEGUARD = (
    "You have not used the REPL or looked at your context yet. "
    "Inspect the context first and do not submit a final answer yet.\n\n"
)


def turn_message(iteration: int, max_iterations: int, context_count: int, history_count: int = 0) -> str:
    """`Turn k/N:` (1-based k), with the safeguard on turn 1 and a note when there are several
    contexts or earlier conversations of a kept session."""
    text = f"Turn {iteration}/{max_iterations}:"
    if iteration == 1:
        text = _FIRST_TURN_SAFEGUARD + text
    if context_count > 1:
        text += (
            f"\n\nNote: You have {context_count} contexts available (context_0 through context_{context_count - 1})."
        )
    if history_count == 1:
        text += "\n\nNote: Your earlier conversation in this session is in the REPL variable `history`."
    elif history_count > 1:
        text += (
            f"\n\nNote: Your {history_count} earlier conversations in this session are in the REPL variables "
            f"history_0 through history_{history_count - 1} (`history` is history_0)."
        )
    return text


def submit_now_message(max_iterations: int) -> str:
    """The one extra turn after the last: a user turn (never an assistant prefill)."""
    return (
        f"Turn {max_iterations + 1}/{max_iterations}: you have used all your turns. "
        'Submit your best answer now: in one ```repl``` block set answer["content"] to it '
        'and answer["ready"] = True.'
    )


def cut_off_message(max_tokens: int) -> str:
    """After a reply that hit the completion limit inside a ```repl block."""
    return (
        f"Your previous reply was cut off at the {max_tokens}-token limit inside a ```repl``` block, "
        "so that block was not run. Send shorter code: one compact ```repl``` block per turn, "
        "keep long text in variables and sub-LLM calls rather than in your reply."
    )


PROSE_FINAL_REFUSED = (
    "FINAL(...) in the same reply as a ```repl``` block was not accepted: you wrote it before that "
    'code ran. Read the output above, then submit (answer["content"] and answer["ready"] = True).'
)

ELIDED_OUTPUT = "[REPL output of an earlier turn removed to fit the context window ({chars} chars). Its variables are still in the REPL.]"
ELIDED_REPLY = "[Earlier reply removed to fit the context window ({chars} chars).]"
CUT_OUTPUT = "\n... [output cut to fit the context window: {chars} more chars not shown]"
