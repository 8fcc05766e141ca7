"""Routing keys: the headers that let a replica router keep a run's root turns on one replica
and spread its sub-calls.

Replica routers route on a key the client sends: vllm-router `--policy consistent_hash` and
`--policy sticky_least_loaded` both take `X-Session-ID`, else `X-User-ID`, `X-Tenant-ID`,
`X-Correlation-ID`, `X-Request-ID`, else body fields (`session_params.session_id`, `user`); the
production-stack router `--routing-logic session --session-key <header>`; llm-d's
session-affinity scorer answers an `x-session-token` header that the client sends back.

- A root call carries `<session_header>: <run id>` (`RLM_MCP_SESSION_HEADER`, default
  `X-Session-ID`; `RLM_MCP_SESSION_AFFINITY=false` sends none) and, once the run's earlier root
  call was answered with one, the `x-session-token` it got. A child RLM's root turns carry the
  child's own run id (`<parent>.<n>`): its conversation is another prefix.
- Every attempt of every call carries a fresh `X-Request-ID`. By default a sub-call carries
  nothing else that routers key on (no session, user, tenant or correlation id), so each
  sub-call, and each retry of one, may land on any replica. The OpenAI `user` body field is
  never set.
- With `RLM_MCP_ROUTER_SESSIONS` (routers that count sessions, vllm-router
  `sticky_least_loaded`): such a router makes every distinct key a session it keeps for two hours
  unless told it finished, and sends keyless requests all to one replica. So a sub-call carries
  `<session_header>: <tree root>~sub<k>`, k taking turns over `RLM_MCP_ROUTER_SUB_SESSIONS`
  values per run tree (a few sessions per run, which the router spreads over its replicas by
  count, instead of one per request); the header outranks the `X-Request-ID`. Every key sent is
  noted with the endpoint it went to (`SessionLedger`), so the run's end finishes exactly those
  (lm/router_sessions.py).
- With `RLM_MCP_PROGRAM_HINTS` (vllm-router `--enable-program-scheduling`), a root call's body
  carries `vllm_xargs.agentic_context` (`program_hints`): the run is the program (its root loop
  a program whose tool call is each REPL cell), a child RLM a program its parent blocks on.
  Sub-calls carry none: each is a single request, not a program.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Mapping
from typing import Any

from rlm_mcp.lru import LruMap

TOKEN_HEADER = "x-session-token"
REQUEST_ID_HEADER = "X-Request-ID"
# Headers a router may key on besides the session header: never on a sub-call.
AFFINITY_HEADERS = ("X-Session-ID", "X-User-ID", "X-Tenant-ID", "X-Correlation-ID")
_MAX_SESSIONS = 4096  # remembered tokens: the most recent runs' (a run's root calls are sequential)
_MAX_TREES = 4096  # run trees whose keys are noted (a run's end takes its own: this bounds a leak)


def request_id() -> str:
    """A fresh `X-Request-ID`: a random (version 4) UUID's 32 hex digits, what `uuid.uuid4().hex`
    gives, without building a `UUID` object (its checks cost more than the random bytes). The
    bits come from `random`, not `os.urandom`: an id must be unique, not unguessable (it names a
    request in logs and routers, it grants nothing), and the system call per sub-call cost 1-7 µs
    on the 2-core VM against ~0.5 µs. `random` is seeded from the OS at start and again in a
    forked child, so processes do not repeat each other's ids."""
    n = random.getrandbits(128)
    n = (n & ~(0xF000 << 64) | (4 << 76)) & ~(0xC000 << 48) | (0x8000 << 48)  # version 4, RFC 4122 variant
    return f"{n:032x}"


def tree_root(run_id: str) -> str:
    """The run id of a run tree's root: a child RLM's id is its parent's plus `.<n>`."""
    return run_id.split(".", 1)[0]


def sub_session_key(run_id: str, k: int) -> str:
    """The routing key of the k-th sub-call session of the run tree of `run_id`."""
    return f"{tree_root(run_id)}~sub{k}"


def program_hints(run_id: str) -> dict[str, Any]:
    """The `vllm_xargs` of a root call of run `run_id` for a program-scheduling router: the run
    as the program, its tree's root, and, for a child RLM (`<parent>.<n>`), the parent that waits
    on it. `expected_resume`: after this turn's reply the run executes a REPL cell and comes back
    with the next turn (the router keeps the program's KV over that tool call); a turn that ends
    the run is only known once its cell ran, so every turn says so."""
    context: dict[str, Any] = {"program_id": run_id, "root_program_id": tree_root(run_id), "expected_resume": True}
    parent, dot, _ = run_id.rpartition(".")
    if dot:
        context["parent_program_id"] = parent
        context["blocks_parent"] = True
    return {"agentic_context": context}


class SessionLedger:
    """The router sessions each run tree opened: (endpoint's root URL, key), by tree root."""

    def __init__(self) -> None:
        # A tree's entry is made by its first key (a later key is not a use): the oldest trees go first.
        self._trees: LruMap[str, set[tuple[str, str]]] = LruMap(_MAX_TREES)
        self._lock = threading.Lock()

    def note(self, run_id: str, url: str, key: str) -> None:
        root = tree_root(run_id)
        with self._lock:
            keys = self._trees.get(root)
            if keys is None:
                keys = set()
                self._trees.put(root, keys)
            keys.add((url, key))

    def take_one(self, run_id: str) -> set[tuple[str, str]]:
        """The sessions keyed on `run_id` itself (a child RLM's root session), forgotten."""
        with self._lock:
            keys = self._trees.get(tree_root(run_id))
            if keys is None:
                return set()
            mine = {(url, key) for url, key in keys if key == run_id}
            keys -= mine
            return mine

    def take(self, run_id: str) -> set[tuple[str, str]]:
        """The sessions the tree of `run_id` opened through this process, forgotten."""
        with self._lock:
            keys = self._trees.pop(tree_root(run_id))
            return keys if keys is not None else set()


class RoutingKeys:
    def __init__(
        self, *, affinity: bool, session_header: str, router_sessions: bool = False, sub_sessions: int = 4
    ) -> None:
        self.affinity = affinity
        self.session_header = session_header
        self.router_sessions = router_sessions
        self.sub_sessions = max(1, sub_sessions)
        self.ledger = SessionLedger()
        self._tokens: LruMap[str, str] = LruMap(_MAX_SESSIONS)  # a token stored is a use; one read is not
        self._turns = itertools.count()  # the sub-call sessions' turns (any order spreads them)
        self._lock = threading.Lock()

    def headers(self, session: str | None, *, sub_of: str | None = None) -> dict[str, str]:
        """The headers of one attempt: a root call's when `session` is its run id; a sub-call's
        otherwise (`sub_of`: the run it was made in, used when routers count sessions)."""
        out = {REQUEST_ID_HEADER: request_id()}
        if session is not None and self.affinity:
            out[self.session_header] = session
            with self._lock:
                token = self._tokens.get(session)
            if token is not None:
                out[TOKEN_HEADER] = token
        elif sub_of is not None and self.router_sessions:
            out[self.session_header] = sub_session_key(sub_of, next(self._turns) % self.sub_sessions)
        return out

    def sent(self, run_id: str | None, url: str, headers: Mapping[str, str]) -> None:
        """Note the session key `headers` carried to the endpoint at `url`, when routers count
        sessions (so the run's end finishes it)."""
        if run_id is None or not self.router_sessions:
            return
        key = headers.get(self.session_header)
        if key is not None:
            self.ledger.note(run_id, url, key)

    def remember(self, session: str | None, reply_headers: Mapping[str, str]) -> None:
        """Keep the `x-session-token` a root call's answer carried, for that run's next root calls."""
        if session is None or not self.affinity:
            return
        token = reply_headers.get(TOKEN_HEADER)
        if not token or len(token) > 4096 or not token.isprintable():
            return  # from the network: only a sane header value is echoed
        with self._lock:
            self._tokens.put(session, token)
