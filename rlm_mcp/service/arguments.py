"""The one check of the text a caller sends: no NUL and no lone surrogate where it cannot be kept.

A NUL (U+0000) cannot be stored in a PostgreSQL text or jsonb value (team mode answered
"Internal error (DataError)") and ends a C string early in a path; a lone UTF-16 surrogate
(`"\\ud800"`, which JSON can carry) is not Unicode text and cannot be encoded as UTF-8 by any
store. Every tool argument that names or asks something (queries, names, ids, paths, globs,
URLs, patterns) passes through `check_text` in the service, for both stores, before anything is
stored or looked up; a refusal is a `BadArgumentError` naming the argument and the fix. Context
bodies (`text`, an upload chunk's text) may hold NULs (they are stored as bytes) but not lone
surrogates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlm_mcp.errors import BadArgumentError


def check_text(argument: str, value: str | None, *, nul_ok: bool = False) -> None:
    """Refuse `value` (the argument called `argument`) when it holds a NUL (unless `nul_ok`) or a
    lone surrogate; None passes."""
    if value is None or not isinstance(value, str):
        return
    if not nul_ok and (at := value.find("\x00")) >= 0:
        raise BadArgumentError(
            f"`{argument}` contains a NUL character (U+0000) at position {at}.",
            f"Remove the NUL from `{argument}`: no name, id, query, path, pattern or URL can hold one.",
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        raise BadArgumentError(
            f"`{argument}` contains a lone UTF-16 surrogate (U+{code:04X}) at position {exc.start}, "
            "which is not Unicode text.",
            f"Send `{argument}` as valid UTF-8: keep both halves of a surrogate pair together, or drop the stray one.",
        ) from None


def check_texts(argument: str, values: Iterable[str] | None) -> None:
    """`check_text` for each item of a list argument (its index named in the refusal)."""
    for index, value in enumerate(values or ()):
        check_text(f"{argument}[{index}]", value)


def check_query(query: object) -> None:
    """A run's question: a non-blank string, and text (`check_text`)."""
    if not isinstance(query, str) or not query.strip():
        raise BadArgumentError("The query is empty.", "Pass the question to answer about the context as `query`.")
    check_text("query", query)


def checked_context_ids(context_id: str | Sequence[str] | None) -> list[str]:
    """A run's context id(s), one or a list, each checked (`check_text`), as `unique_ids` has them."""
    if isinstance(context_id, str):
        check_text("context_id", context_id)
    elif context_id is not None:
        check_texts("context_id", context_id)
    return unique_ids(context_id or [])


def unique_ids(ids: str | Sequence[str]) -> list[str]:
    """Context ids as given, stripped, each once, in their first order; blanks dropped."""
    items = [ids] if isinstance(ids, str) else list(ids)
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item.strip(), None)
    return [i for i in seen if i]
