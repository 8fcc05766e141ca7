"""Routing keys: the headers that let a replica router keep a run's root turns on one replica
and spread its sub-calls.

Replica routers route on a key the client sends: vllm-router `--policy consistent_hash` hashes
`X-Session-ID`, else `X-User-ID`, `X-Tenant-ID`, `X-Correlation-ID`, `X-Request-ID`, else body
fields; the production-stack router `--routing-logic session --session-key <header>`; llm-d's
session-affinity scorer answers an `x-session-token` header that the client sends back.

- A root call carries `<session_header>: <run id>` (`RLM_MCP_SESSION_HEADER`, default
  `X-Session-ID`; `RLM_MCP_SESSION_AFFINITY=false` sends none) and, once the run's earlier root
  call was answered with one, the `x-session-token` it got. A child RLM's root turns carry the
  child's own run id: its conversation is another prefix.
- Every attempt of every call carries a fresh `X-Request-ID`; a sub-call carries nothing else
  that routers key on (no session, user, tenant or correlation id), so each sub-call, and each
  retry of one, may land on any replica. The OpenAI `user` body field is never set.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping

TOKEN_HEADER = "x-session-token"
REQUEST_ID_HEADER = "X-Request-ID"
# Headers a router may key on besides the session header: never on a sub-call.
AFFINITY_HEADERS = ("X-Session-ID", "X-User-ID", "X-Tenant-ID", "X-Correlation-ID")
_MAX_SESSIONS = 4096  # remembered tokens: the most recent runs' (a run's root calls are sequential)


class RoutingKeys:
    def __init__(self, *, affinity: bool, session_header: str) -> None:
        self.affinity = affinity
        self.session_header = session_header
        self._tokens: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def headers(self, session: str | None) -> dict[str, str]:
        """The headers of one attempt: a root call's when `session` is its run id, else a sub-call's."""
        out = {REQUEST_ID_HEADER: uuid.uuid4().hex}
        if session is not None and self.affinity:
            out[self.session_header] = session
            with self._lock:
                token = self._tokens.get(session)
            if token is not None:
                out[TOKEN_HEADER] = token
        return out

    def remember(self, session: str | None, reply_headers: Mapping[str, str]) -> None:
        """Keep the `x-session-token` a root call's answer carried, for that run's next root calls."""
        if session is None or not self.affinity:
            return
        token = reply_headers.get(TOKEN_HEADER)
        if not token or len(token) > 4096 or not token.isprintable():
            return  # from the network: only a sane header value is echoed
        with self._lock:
            self._tokens[session] = token
            self._tokens.move_to_end(session)
            while len(self._tokens) > _MAX_SESSIONS:
                self._tokens.popitem(last=False)
