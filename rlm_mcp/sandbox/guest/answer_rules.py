"""The answer protocol inside a REPL: the one implementation, used by the sandbox kernel and by
the engine tests' fake sandbox.

Stdlib only and import-free on purpose: bootstrap.kernel_payload() sends this file's source
ahead of kernel.py over the container's stdin (the container has no rlm_mcp package), and the
host imports it as an ordinary module.

Rules (docs/tools.md, "The answer"):
- `answer` starts as {"content": "", "ready": False}, as in the reference and in training;
- it is read at the END of each cell, so the order of assignment does not matter, and
  `answer.update(...)` or rebinding `answer` to a new dict count too;
- `ready` counts when it is truthy and not a string (`answer["ready"] = "False"` does not end
  a run; the reference would end it);
- the content is shown as `str()` shows it; `FINAL(value)` sets content and ready;
  `FINAL_VAR(name)` does the same with the variable called `name` (quotes allowed).
"""


def new_answer() -> dict[str, object]:
    """The initial `answer` dict."""
    return {"content": "", "ready": False}


def answer_is_ready(value: object) -> bool:
    """Whether a `ready` value ends the run."""
    return bool(value) and not isinstance(value, str)


def read_answer(ns: dict[str, object], max_chars: int) -> dict[str, object] | None:
    """The end-of-cell view of `answer`: {"content": str, "ready": bool}, or None when `answer`
    is no dict. Content longer than `max_chars` is cut with a note. Never raises."""
    value = ns.get("answer")
    if not isinstance(value, dict):
        return None
    try:
        content = value.get("content")
        ready = answer_is_ready(value.get("ready"))
        content = "" if content is None else str(content)
        if len(content) > max_chars:
            content = content[:max_chars] + f"\n... [answer truncated at {max_chars} characters]"
    except BaseException as exc:  # a hostile __str__ or __eq__ must not end the kernel
        return {
            "content": f"Error: the answer could not be turned into text ({type(exc).__name__}: {exc})",
            "ready": False,
        }
    return {"content": content, "ready": ready}


def submit_answer(ns: dict[str, object], value: object) -> object:
    """FINAL(value): set the content and mark the answer ready (in place when it is a dict)."""
    current = ns.get("answer")
    if isinstance(current, dict):
        current["content"] = value
        current["ready"] = True
    else:
        ns["answer"] = {"content": value, "ready": True}
    return value


def submit_variable(ns: dict[str, object], name: object) -> object:
    """FINAL_VAR(name): submit the variable called `name` (a str, quotes allowed), or a value."""
    if not isinstance(name, str):
        return submit_answer(ns, name)
    key = name.strip().strip("'\"")
    if key not in ns:
        raise NameError(f"FINAL_VAR: no variable named {key!r} (create it first, then call FINAL_VAR({key!r}))")
    return submit_answer(ns, ns[key])
