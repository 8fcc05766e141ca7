"""The live viewer under `/runs/` of the HTTP server: the index and run pages poll small JSON
endpoints while runs are running. `mount_viewer` puts it in front of the MCP app with its own
auth (see `auth.py`); every other path goes to the MCP app untouched.

Who is asking is the owner of the bearer token or of the browser session (`auth.py`); records
whose summary carries an `owner` are shown only to that owner.

A kept session's id (`ses_...`) where a run id would be shows the session as a chain of its runs
(`chain.py`): built from the run records the asker may see, so another owner's session is as
unknown as an id nobody issued; `session_state`, where the server gives one, adds what the
process holding the session knows (live, stored or ended; its size).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rlm_mcp.config import EventSettings
from rlm_mcp.errors import RlmMcpError
from rlm_mcp.owners import Everyone, Owner, OwnerScope
from rlm_mcp.ports.webhooks import WebhookOutboxPort
from rlm_mcp.store.ports import RunStorePort
from rlm_mcp.viewer.auth import COOKIE, SESSION_TTL_S, ViewerAuth
from rlm_mcp.viewer.chain import build_session, is_session_id, session_runs
from rlm_mcp.viewer.model import build_run, index_entry
from rlm_mcp.viewer.page import render_page
from rlm_mcp.viewer.stream import (
    END_ID,
    EVENT_TYPES,
    EventStreamResponse,
    StreamSlots,
    parse_last_event_id,
    run_messages,
)

log = logging.getLogger("rlm_mcp.viewer")

PREFIX = "/runs"
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
POLL_MS = 1000
INDEX_LIMIT = 500
# What the process holding a kept session knows of it (`RlmService.session_state`), or None.
SessionState = Callable[[str, OwnerScope], Awaitable[dict[str, object] | None]]
# The LM back-pressure each endpoint and model is under (`lm/throttle.py` `Gate.state`), as the
# process that serves the viewer knows it: the runs list shows it.
ThrottleStates = Callable[[], Awaitable[list[dict[str, object]]]]

_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def _refusal(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith(f"{PREFIX}/api/"):
        return JSONResponse({"error": message}, status_code=status, headers=_HEADERS)
    page = f"<!doctype html><meta charset='utf-8'><title>rlm-mcp</title><p>{message}</p>"
    return HTMLResponse(page, status_code=status, headers=_HEADERS)


def build_viewer(
    records: RunStorePort,
    auth: ViewerAuth,
    *,
    session_state: SessionState | None = None,
    events: EventSettings | None = None,
    webhooks: WebhookOutboxPort | None = None,
    throttles: ThrottleStates | None = None,
    follow: Callable[[str], Awaitable[None]] | None = None,
) -> ASGIApp:
    """The app of every path under /runs/ (the same pages also under /runs/s/<key>/, the cookie's
    path); `events`: the event streams' bounds (the defaults when None); `webhooks`: the outbox
    whose deliveries `/runs/api/webhooks` shows each owner; `throttles`: the LM limits
    `/runs/api/throttles` shows (none when None); `follow`: says that an event stream (the live
    page's too) follows a run's progress (`RunBackend.follow_progress`; a hint for latency only)."""
    pages = _Pages(records, auth, session_state, events or EventSettings())
    pages.webhooks = webhooks
    pages.throttles = throttles
    pages.follow = follow
    app = Starlette(
        routes=[
            Route(f"{PREFIX}/", pages.index),
            Route(f"{PREFIX}/login", pages.login),
            Route(f"{PREFIX}/api/runs", pages.index_api),
            Route(f"{PREFIX}/api/runs/{{run_id}}/events", pages.run_events),
            Route(f"{PREFIX}/api/webhooks", pages.webhook_list),
            Route(f"{PREFIX}/api/throttles", pages.throttle_list),
            Route(f"{PREFIX}/api/webhooks/{{webhook_id}}/redeliver", pages.webhook_redeliver, methods=["POST"]),
            Route(f"{PREFIX}/api/runs/{{run_id}}", pages.run_api),
            Route(f"{PREFIX}/api/login-link", pages.login_link, methods=["POST"]),
            Route(f"{PREFIX}/{{run_id}}", pages.run_page),
        ]
    )

    async def under_key(scope: Scope, receive: Receive, send: Send) -> None:
        # /runs/s/<key>/... is /runs/...: the pages' links are relative, so they stay under it.
        # (The key is read per request: in team mode it is set once the shared store is open.)
        keyed = f"{PREFIX}/s/{auth.path_key}/"
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(keyed):
            scope = {**scope, "path": PREFIX + "/" + path[len(keyed) :], "raw_path": None}
        await app(scope, receive, send)

    return under_key


class _Pages:
    """The viewer's endpoints; each checks who is asking first (`denied`)."""

    def __init__(
        self,
        records: RunStorePort,
        auth: ViewerAuth,
        session_state: SessionState | None = None,
        events: EventSettings | None = None,
    ) -> None:
        self.records = records
        self.auth = auth
        self.session_state = session_state
        self.events = events or EventSettings()
        self.streams = StreamSlots(self.events)
        self.webhooks: WebhookOutboxPort | None = None
        self.throttles: ThrottleStates | None = None
        self.follow: Callable[[str], Awaitable[None]] | None = None

    def owner_of(self, request: Request) -> OwnerScope:
        """Whose runs this request may see (`EVERY_OWNER`: the local viewer's session)."""
        owner = request.scope.get("state", {}).get("viewer_owner")
        assert isinstance(owner, (str, Everyone)), "denied() runs first and records the owner"
        return owner if isinstance(owner, Everyone) else Owner(owner)

    def denied(self, request: Request, *, bearer_only: bool = False) -> Response | None:
        if not self.auth.host_ok(request.headers.get("host"), request.headers.get("origin")):
            return _refusal(request, 403, "This Host or Origin is not allowed.")
        owner: OwnerScope | None = self.auth.bearer_owner(request.headers.get("authorization"))
        if owner is None and not bearer_only:
            owner = self.auth.session_owner(request.cookies.get(COOKIE))
        if owner is None:
            return _refusal(
                request, 401, "Not signed in: run `rlm-mcp runs view --url <this server>` for a one-time login link."
            )
        request.scope.setdefault("state", {})["viewer_owner"] = owner
        return None

    async def index(self, request: Request) -> Response:
        if (refused := self.denied(request)) is not None:
            return refused
        version, entries = await self._index(request)
        page = render_page(
            "index",
            entries,
            title="rlm-mcp runs",
            version=version,
            run_href="",
            live={"url": "api/runs", "interval_ms": POLL_MS * 3},
        )
        return HTMLResponse(page, headers=_HEADERS)

    async def _index(self, request: Request) -> tuple[str, list[dict[str, Any]]]:
        owner = self.owner_of(request)
        entries = [index_entry(s) for s in await self.records.list(INDEX_LIMIT, owner=owner)]
        return _digest(entries), entries

    async def index_api(self, request: Request) -> Response:
        if (refused := self.denied(request)) is not None:
            return refused
        version, entries = await self._index(request)
        if request.query_params.get("since") == version:
            return JSONResponse({"version": version}, headers=_HEADERS)
        return JSONResponse({"version": version, "data": entries}, headers=_HEADERS)

    async def _model(self, request: Request) -> tuple[str, dict[str, Any]] | Response:
        """The asked run's (or session's) view model and its version; a refusal when the asker
        may not see it (the one check of both the page and the API)."""
        if (refused := self.denied(request)) is not None:
            return refused
        run_id = request.path_params["run_id"]
        if is_session_id(run_id):
            return await self._session(request, run_id)
        try:
            scope = self.owner_of(request)
            summary = await self.records.read_summary(run_id, owner=scope)  # another owner's: unknown
            version = await self.records.version(run_id)
            if request.query_params.get("since") == version:
                return version, {}
            return version, build_run(summary, await self.records.read_events(run_id, owner=scope))
        except RlmMcpError:
            return _refusal(request, 404, "Unknown run id.")

    async def _session(self, request: Request, session_id: str) -> tuple[str, dict[str, Any]] | Response:
        """A kept session's chain: its runs among those the asker may see; unknown without any."""
        scope = self.owner_of(request)
        runs = session_runs(await self.records.list(INDEX_LIMIT, owner=scope), session_id)
        if not runs or not _RUN_ID.match(session_id):
            return _refusal(request, 404, "Unknown session id.")
        state = await self.session_state(session_id, scope) if self.session_state is not None else None
        listed = state.get("runs") if state is not None else None
        for run_id in set(listed if isinstance(listed, list) else []) - {r.run_id for r in runs}:
            try:  # a run older than the index's newest: read on its own
                runs.append(await self.records.read_summary(str(run_id), owner=scope))
            except RlmMcpError:
                continue  # deleted by retention (RLM_MCP_RUN_MAX_RECORDS)
        model = build_session(session_id, session_runs(runs, session_id), state)
        version = _digest(model)
        return version, ({} if request.query_params.get("since") == version else model)

    async def run_page(self, request: Request) -> Response:
        found = await self._model(request)
        if isinstance(found, Response):
            return found
        version, model = found
        run_id = request.path_params["run_id"]
        session = is_session_id(run_id)
        page = render_page(
            "session" if session else "run",
            model,
            title=f"rlm-mcp {'session' if session else 'run'} {run_id}",
            version=version,
            index_href="./",
            # A session polls while it may grow a run; a run follows its event stream until it
            # has ended (polling when the stream is refused).
            live={"url": f"api/runs/{run_id}", "interval_ms": POLL_MS * 3 if session else POLL_MS}
            | ({} if session else {"events": f"api/runs/{run_id}/events", "event_types": EVENT_TYPES}),
        )
        return HTMLResponse(page, headers=_HEADERS)

    async def run_api(self, request: Request) -> Response:
        found = await self._model(request)
        if isinstance(found, Response):
            return found
        version, model = found
        body: dict[str, Any] = {"version": version}
        if model:
            body["data"] = model
        return JSONResponse(body, headers=_HEADERS)

    async def run_events(self, request: Request) -> Response | EventStreamResponse:
        """The run's event stream (`stream.py`); another owner's run is unknown, as on the page."""
        if (refused := self.denied(request)) is not None:
            return refused
        run_id = request.path_params["run_id"]
        owner = self.owner_of(request)
        try:
            await self.records.read_summary(run_id, owner=owner)
        except RlmMcpError:
            return _refusal(request, 404, "Unknown run id.")
        after = parse_last_event_id(request.headers.get("last-event-id"))
        if after == END_ID:  # the stream had ended: 204 tells EventSource not to reconnect
            return Response(status_code=204, headers=_HEADERS)
        if self.follow is not None:
            try:
                await self.follow(run_id)
            except Exception:  # a hint for latency only: the stream reads the store either way
                log.info("could not say run %s is followed", run_id, exc_info=True)
        if not self.streams.take(owner):
            refused = _refusal(request, 429, "Too many event streams are open: close one, or retry shortly.")
            refused.headers["Retry-After"] = "5"
            return refused
        assert not isinstance(after, str)
        return EventStreamResponse(run_messages(self.records, run_id, owner, after, self.events), self.streams, owner)

    async def webhook_list(self, request: Request) -> Response:
        """The asker's webhook deliveries, newest first (the body is left out: it is thin anyway)."""
        if (refused := self.denied(request)) is not None:
            return refused
        rows = await self.webhooks.list(self.owner_of(request), INDEX_LIMIT) if self.webhooks is not None else []
        data = [{k: v for k, v in asdict(d).items() if k not in ("body", "owner")} for d in rows]
        return JSONResponse({"data": data}, headers=_HEADERS)

    async def throttle_list(self, request: Request) -> Response:
        """Each LM endpoint and model's limit, calls in flight and throttling (no run data: every
        signed-in asker sees the same)."""
        if (refused := self.denied(request)) is not None:
            return refused
        data = await self.throttles() if self.throttles is not None else []
        return JSONResponse({"data": data}, headers=_HEADERS)

    async def webhook_redeliver(self, request: Request) -> Response:
        """Deliver one of the asker's webhooks again, same webhook-id (bearer only: no cookie, so
        no other page can make a browser ask)."""
        if (refused := self.denied(request, bearer_only=True)) is not None:
            return refused
        webhook_id = request.path_params["webhook_id"]
        found = self.webhooks is not None and await self.webhooks.redeliver(
            webhook_id, self.owner_of(request), time.time()
        )
        if not found:
            return _refusal(request, 404, "Unknown webhook id.")
        return JSONResponse({"webhook_id": webhook_id, "state": "pending"}, headers=_HEADERS)

    async def login_link(self, request: Request) -> Response:
        if (refused := self.denied(request, bearer_only=True)) is not None:
            return refused
        code = self.auth.issue_code(self.owner_of(request))
        body = {"path": f"{PREFIX}/login?code={code}"}
        if self.auth.public_url:  # behind a proxy: the whole link, by the name browsers use
            body["url"] = self.auth.public_url + body["path"]
        return JSONResponse(body, headers=_HEADERS)

    async def login(self, request: Request) -> Response:
        if not self.auth.host_ok(request.headers.get("host"), request.headers.get("origin")):
            return _refusal(request, 403, "This Host or Origin is not allowed.")
        if request.headers.get("sec-fetch-site", "none") not in ("none", "same-origin"):
            # Opened from another page (another site, or another port of this host): login CSRF.
            return _refusal(request, 403, "Login links work only when opened directly: paste it into the address bar.")
        try:
            session = await self.auth.redeem(request.query_params.get("code", ""))
        except RlmMcpError as exc:  # team mode: the database that records spent codes is unreachable
            log.warning("viewer login could not be checked: %s", exc)
            return _refusal(
                request, 503, "The login could not be checked now (the database is unreachable): try again."
            )
        if session is None:
            return _refusal(request, 401, "This login link was already used or has expired: ask for a new one.")
        target = request.query_params.get("run", "")
        home = f"{PREFIX}/s/{self.auth.path_key}/"
        response = RedirectResponse(home + target if _RUN_ID.match(target) else home, status_code=303, headers=_HEADERS)
        response.set_cookie(
            COOKIE,
            session,
            max_age=int(SESSION_TTL_S),
            path=home,
            httponly=True,
            samesite="strict",
            secure=self.auth.secure_cookie,
        )
        return response


def _digest(model: Any) -> str:
    """The version of a page's data: the same data, the same version (a live page redraws on a change)."""
    return hashlib.sha256(json.dumps(model, default=str, sort_keys=True).encode()).hexdigest()[:16]


def mount_viewer(app: ASGIApp, viewer: ASGIApp) -> ASGIApp:
    """Send /runs and everything under it to the viewer, the rest (and lifespan) to `app`."""

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == PREFIX or path.startswith(PREFIX + "/"):
            await viewer(scope, receive, send)
        else:
            await app(scope, receive, send)

    return dispatch
