"""The cell namespace the kernel gives user code: the sub-call helpers, SHOW_VARS, FINAL, and the
variables listed back to the host after a cell.

Stdlib only: its source is sent ahead of kernel.py's (see bootstrap.kernel_payload) and runs in
the kernel's namespace, after answer_rules.py's.
"""

import builtins
from typing import Any

if "new_answer" not in globals():
    from rlm_mcp.sandbox.guest.answer_rules import new_answer, submit_answer, submit_variable

SIMPLE_TYPES = (str, int, float, bool, list, dict, tuple)
RESERVED = {
    "llm_query",
    "llm_query_batched",
    "rlm_query",
    "rlm_query_batched",
    "SHOW_VARS",
    "FINAL",
    "FINAL_VAR",
    "answer",
    "__builtins__",
    "__name__",
}


def make_namespace(kernel: Any) -> dict[str, Any]:
    """A fresh namespace; `kernel` answers `lm_call(kind, prompts, model)` and holds `show_vars_from`."""
    ns: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}

    def llm_query(prompt: Any, model: Any = None) -> str:
        """Ask the sub-LM one prompt; returns its answer (a str; errors start with 'Error:')."""
        return kernel.lm_call("llm", [prompt], model)[0]  # type: ignore[no-any-return]

    def llm_query_batched(prompts: Any, model: Any = None) -> list[str]:
        """Ask the sub-LM several prompts concurrently; answers come back in order."""
        return kernel.lm_call("llm", list(prompts), model)  # type: ignore[no-any-return]

    def rlm_query(prompt: Any, model: Any = None) -> str:
        """Ask a recursive LM (with its own REPL) one prompt; returns its answer."""
        return kernel.lm_call("rlm", [prompt], model)[0]  # type: ignore[no-any-return]

    def rlm_query_batched(prompts: Any, model: Any = None) -> list[str]:
        """Ask a recursive LM several prompts concurrently; answers come back in order."""
        return kernel.lm_call("rlm", list(prompts), model)  # type: ignore[no-any-return]

    def SHOW_VARS() -> str:
        """The variables this REPL holds, with their types (returned, as the reference does)."""
        source = kernel.show_vars_from if kernel.show_vars_from is not None else ns
        names = {
            k: type(v).__name__
            for k, v in list(source.items())
            if type(k) is str and not k.startswith("_") and k not in RESERVED
        }
        return f"Available variables: {names!r}"

    def FINAL(value: Any) -> Any:
        """Submit `value` as the final answer."""
        return submit_answer(ns, value)

    def FINAL_VAR(name: Any) -> Any:
        """Submit the variable called `name` as the final answer."""
        return submit_variable(ns, name)

    for fn in (llm_query, llm_query_batched, rlm_query, rlm_query_batched, SHOW_VARS, FINAL, FINAL_VAR):
        ns[fn.__name__] = fn
    ns["answer"] = new_answer()
    return ns


def list_variables(ns: dict[Any, Any]) -> list[str]:
    # Keys need not be str (globals()[1] = 2) and isinstance() runs a user __class__
    # property: either used to raise here and end the kernel. Names are clipped too.
    names: list[str] = []
    for key, value in list(ns.items()):
        try:
            # `answer` is listed, as in the trained format (it is a dict); the helpers are not.
            if type(key) is not str or key.startswith("_") or (key in RESERVED and key != "answer") or len(key) > 200:
                continue
            if isinstance(value, SIMPLE_TYPES):
                names.append(key)
        except BaseException:
            continue
        if len(names) >= 1000:
            break
    return names
