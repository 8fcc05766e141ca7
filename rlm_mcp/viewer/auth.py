"""Who may see the viewer under `/runs/`.

API clients send the server's bearer token, as for `/mcp`. A browser cannot, and the
long-lived token must never sit in a URL (history, logs, referrers), so a holder of the token
asks for a one-time login code (`POST /runs/api/login-link`, bearer header); opening
`/runs/login?code=...` spends the code (it works once, for a minute) and sets a random session
cookie: HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it),
Path=/runs/ (never sent to /mcp). Host and Origin are checked on every request, so a page on
another site cannot reach a loopback server by DNS rebinding.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlm_mcp.access import BearerTokens, HostPolicy
from rlm_mcp.owners import LOCAL_OWNER

COOKIE = "rlm_mcp_view"
CODE_TTL_S = 60.0
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 256
ALL_OWNERS = "*"  # the local viewer (`rlm-mcp runs view`): the data dir's own user sees every run


@dataclass
class ViewerAuth:
    """Sessions and one-time codes of one server process (kept in memory: a restart logs out).

    `tokens` are the server's bearer tokens (none: one local user). Each token is an owner; a
    login code and the browser session it opens carry the owner of the token that asked for it.
    """

    tokens: Sequence[str]
    policy: HostPolicy
    _codes: dict[str, tuple[float, str]] = field(default_factory=dict)
    _sessions: dict[str, tuple[float, str]] = field(default_factory=dict)
    _bearer: BearerTokens = field(init=False)

    def __post_init__(self) -> None:
        self._bearer = BearerTokens(self.tokens)

    def host_ok(self, host: str | None, origin: str | None) -> bool:
        return self.policy.host_ok(host or "") and self.policy.origin_ok(origin)

    def bearer_owner(self, authorization: str | None) -> str | None:
        """The owner a bearer header proves (LOCAL_OWNER when no token is set), else None."""
        return self._bearer.owner(authorization)

    def session_owner(self, cookie: str | None) -> str | None:
        if not self.tokens:
            return LOCAL_OWNER
        found = self._sessions.get(cookie or "")
        return found[1] if found is not None and found[0] > time.monotonic() else None

    def issue_code(self, owner: str = LOCAL_OWNER) -> str:
        now = time.monotonic()
        self._codes = {c: v for c, v in self._codes.items() if v[0] > now}
        code = secrets.token_urlsafe(24)
        self._codes[code] = (now + CODE_TTL_S, owner)
        return code

    def redeem(self, code: str) -> str | None:
        """A new session id for a valid, unspent code; None otherwise."""
        found = self._codes.pop(code, None)
        now = time.monotonic()
        if found is None or found[0] <= now:
            return None
        self._sessions = {s: v for s, v in self._sessions.items() if v[0] > now}
        if len(self._sessions) >= MAX_SESSIONS:  # drop the oldest: bounded memory
            self._sessions.pop(min(self._sessions, key=lambda s: self._sessions[s][0]))
        session = secrets.token_urlsafe(32)
        self._sessions[session] = (now + SESSION_TTL_S, found[1])
        return session
