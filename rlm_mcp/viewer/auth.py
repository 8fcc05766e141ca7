"""Who may see the viewer under `/runs/`.

API clients send the server's bearer token, as for `/mcp`. A browser cannot, and the
long-lived token must never sit in a URL (history, logs, referrers), so a holder of the token
asks for a one-time login code (`POST /runs/api/login-link`, bearer header); opening
`/runs/login?code=...` spends the code (it works once, for a minute, on any replica in team mode:
`rlm_mcp.store.spent_codes`) and sets a random session
cookie: HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it),
Path=/runs/s/<key>/ with a random key (never sent to /mcp, nor to another listener on the same
host: cookies are not port-bound, see `path_key`), for an hour. A code is redeemed only in a
navigation the user made (Sec-Fetch-Site absent, `none` or `same-origin`): a page elsewhere,
another local port included, cannot log a browser in as its own token (login CSRF). Host and
Origin are checked on every request, so a page on another site cannot reach a loopback server
by DNS rebinding.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlm_mcp.access import BearerTokens, HostPolicy
from rlm_mcp.owners import EVERY_OWNER, LOCAL_OWNER, Owner, OwnerScope
from rlm_mcp.store.spent_codes import LocalSpentCodes, SpentCodesPort
from rlm_mcp.viewer import signed
from rlm_mcp.viewer.path_key import random_key

COOKIE = "rlm_mcp_view"
CODE_TTL_S = 60.0
SESSION_TTL_S = 3600.0
MAX_SESSIONS = 4096  # all owners: a bound on memory
MAX_SESSIONS_PER_OWNER = 16  # one owner's logins evict only that owner's oldest sessions


@dataclass
class ViewerAuth:
    """Sessions and one-time codes of one server process (kept in memory: a restart logs out).

    `tokens` are the server's bearer tokens (none: one local user). Each token is an owner; a
    login code and the browser session it opens carry the owner of the token that asked for it.
    """

    tokens: Sequence[str]
    policy: HostPolicy
    # Team mode: a key every replica shares; codes and sessions are then signed (`signed.py`),
    # so a link opened or a cookie sent to another replica behind the load balancer is valid.
    key: bytes | None = None
    # Who spends a code first (`rlm_mcp.store.spent_codes`): the server passes its store's, so in
    # team mode a code opened on one replica is refused on every other.
    spent: SpentCodesPort = field(default_factory=LocalSpentCodes)
    path_key: str = field(default_factory=random_key)  # the cookie path's random part
    # RLM_MCP_PUBLIC_URL: login links name it; https there marks the session cookie Secure (TLS
    # ends at the proxy, so the request this server sees says http).
    public_url: str | None = None
    _codes: dict[str, tuple[float, OwnerScope]] = field(default_factory=dict)
    _sessions: dict[str, tuple[float, OwnerScope]] = field(default_factory=dict)
    _bearer: BearerTokens = field(init=False)

    def __post_init__(self) -> None:
        self._bearer = BearerTokens(self.tokens)

    @property
    def secure_cookie(self) -> bool:
        return bool(self.public_url and self.public_url.startswith("https://"))

    def host_ok(self, host: str | None, origin: str | None) -> bool:
        return self.policy.host_ok(host or "") and self.policy.origin_ok(origin)

    def bearer_owner(self, authorization: str | None) -> Owner | None:
        """The owner a bearer header proves (LOCAL_OWNER when no token is set), else None."""
        found = self._bearer.owner(authorization)
        return Owner(found) if found is not None else None

    def session_owner(self, cookie: str | None) -> OwnerScope | None:
        if not self.tokens:
            return LOCAL_OWNER
        if self.key is not None:
            valid = signed.verify(self.key, "session", cookie)
            return Owner(valid[0]) if valid is not None else None
        found = self._sessions.get(cookie or "")
        return found[1] if found is not None and found[0] > time.monotonic() else None

    def issue_code(self, owner: OwnerScope) -> str:
        """A one-time login code for `owner` (required: a forgotten owner is a type error)."""
        if self.key is not None:
            if owner is EVERY_OWNER:  # team mode signs one owner's codes; only the local viewer sees all
                raise ValueError("a signed (team mode) login code names one owner, never EVERY_OWNER")
            return signed.sign(self.key, "code", owner, CODE_TTL_S)
        now = time.monotonic()
        self._codes = {c: v for c, v in self._codes.items() if v[0] > now}
        code = secrets.token_urlsafe(24)
        self._codes[code] = (now + CODE_TTL_S, owner)
        return code

    async def redeem(self, code: str) -> str | None:
        """A new session id for a valid, unspent code; None otherwise. Whether it is unspent is
        `spent`'s to say (the store's: once per process, or once on every replica in team mode)."""
        if self.key is not None:
            valid = signed.verify(self.key, "code", code)
            if valid is None or not await self.spent.spend(code, valid[1]):
                return None
            return signed.sign(self.key, "session", valid[0], SESSION_TTL_S)
        found = self._codes.get(code)
        now = time.monotonic()
        if found is None or found[0] <= now or not await self.spent.spend(code, time.time() + found[0] - now):
            return None
        self._codes.pop(code, None)
        self._sessions = {s: v for s, v in self._sessions.items() if v[0] > now}
        owner = found[1]
        theirs = [s for s, v in self._sessions.items() if v[1] == owner]
        if len(theirs) >= MAX_SESSIONS_PER_OWNER:  # the owner's own oldest goes, nobody else's
            self._sessions.pop(min(theirs, key=lambda s: self._sessions[s][0]))
        elif len(self._sessions) >= MAX_SESSIONS:  # bounded memory (owners x per-owner cap past it)
            self._sessions.pop(min(self._sessions, key=lambda s: self._sessions[s][0]))
        session = secrets.token_urlsafe(32)
        self._sessions[session] = (now + SESSION_TTL_S, owner)
        return session
