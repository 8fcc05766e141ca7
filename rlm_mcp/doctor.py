"""`rlm-mcp doctor`: is everything a run needs in place? One row per check, a fix per failure.

Exit code 0 only when every check passes. Output goes to stdout: doctor is a shell command,
never run as the MCP server.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio

from rlm_mcp.config import Settings, TeamDatabase
from rlm_mcp.errors import TEAM_EXTRA_FIX, ImageMissingError, RlmMcpError
from rlm_mcp.events import CallRole
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.endpoint import key_note
from rlm_mcp.ports import LMRequest
from rlm_mcp.sandbox.backends import backend_for
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.store.migrations import MigrationError


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # passed, but on an assumption the user should know about


async def _backend(settings: Settings) -> list[Check]:
    """The configured sandbox backend (RLM_MCP_SANDBOX_BACKEND): reachable, and its image there."""
    backend = backend_for(settings.sandbox)
    try:
        try:
            about = await backend.describe()
        except RlmMcpError as exc:
            return [Check(backend.name, False, exc.cause, exc.fix or ""), Check("image", False, "not checked", "")]
        checks = [Check(backend.name, True, about)]
        try:
            await backend.check_ready()
            checks.append(Check("image", True, settings.sandbox.sandbox_image))
        except ImageMissingError as exc:
            checks.append(Check("image", False, f"{settings.sandbox.sandbox_image} is missing", exc.fix or ""))
        except RlmMcpError as exc:
            checks.append(Check("image", False, exc.cause, exc.fix or ""))
        return checks
    finally:
        backend.close()


# Said to every user, most of whom have no checkout: what to try and where to report.
SANDBOX_FIX = (
    "Rebuild the sandbox image (`rlm-mcp image build --force`) and run doctor again; if it still fails, "
    "report this output with `rlm-mcp --version` and `docker version`."
)


async def _sandbox(settings: Settings) -> list[Check]:
    async def bridge(request: LMRequest) -> list[str]:
        return [f"echo:{p}" for p in request.prompts]

    start = time.monotonic()
    try:
        async with SandboxManager(settings.model_copy(update={"pool_size": 0}).sandbox) as manager:
            await manager.ensure_ready()
            async with manager.open([]) as sandbox:
                cell = await sandbox.execute("print(1 + 1, llm_query('x'))", bridge)
                # Which channel its frames took (the Docker backend's fast channel or attach stream).
                channel = getattr(getattr(sandbox, "container", None), "channel", None)
            fallback = manager.cpu_fallback
    except RlmMcpError as exc:
        return [Check("sandbox round trip", False, exc.cause, exc.fix or "")]
    ok = cell.stdout.strip() == "2 echo:x" and cell.error is None
    detail = (
        f"one cell in {time.monotonic() - start:.2f} s" if ok else f"unexpected output {cell.stdout!r} {cell.error!r}"
    )
    if ok and channel is not None:
        detail += f", its frames over the {'fast channel (a unix socket)' if channel == 'socket' else 'attach stream'}"
    checks = [Check("sandbox round trip", ok, detail, "" if ok else SANDBOX_FIX)]
    if fallback is None:
        checks.append(Check("cpu sharing", True, "limits follow the sandboxes in use (changed in place)"))
    else:  # a fixed limit per sandbox: works, but the user must know (never silently)
        checks.append(Check("cpu sharing", True, fallback[0], fallback[1], warn=True))
    return checks


async def _lm(settings: Settings) -> list[Check]:
    lm = LMClient(settings.lm)
    try:
        checks: list[Check] = []
        probes = await lm.probes()
        for probe in probes:
            # With a separate sub-call endpoint each row names the endpoint it checked.
            name = "lm endpoint" if probe.endpoint == "root" else "sub-call endpoint"
            setting = "RLM_MCP_BASE_URL" if probe.endpoint == "root" else "RLM_MCP_SUB_BASE_URL"
            if not probe.reachable:
                fix = probe.error or f"Start the server behind {probe.base_url}, or set {setting}."
                checks.append(Check(name, False, f"{probe.base_url} is unreachable", fix))
                continue
            detail = f"{probe.base_url} answered"
            if probe.models is not None:
                detail += f"; serves {', '.join(probe.models)}"
            detail += f"; looks like {probe.kind}" if probe.kind else "; server kind not recognised"
            checks.append(Check(name, True, detail))
            if probe.endpoint == "root" and probe.models is None:  # nothing listed: "served" would be a guess
                checks.append(_unlisted(settings))
        if (note := key_note(settings.lm)) is not None:
            checks.append(
                Check("sub-call key", True, note, "Set RLM_MCP_SUB_API_KEY if that server needs a key.", warn=True)
            )
        root_listed = any(p.endpoint == "root" and p.models is not None for p in probes)
        if not all(c.ok for c in checks):
            return checks
        try:
            await lm.check_model()
            window = await lm.window(settings.lm.model)
            if root_listed:
                checks.append(Check("model", True, f"{settings.lm.model} served"))
            if await lm.window_known(settings.lm.model):
                checks.append(Check("window", True, f"{window} tokens"))
            else:
                checks.append(
                    Check(
                        "window",
                        True,
                        f"{window} tokens ASSUMED: the endpoint does not report it",
                        "Set RLM_MCP_MAX_MODEL_LEN to the window the server really has.",
                        warn=True,
                    )
                )
            if lm.separate_sub_endpoint:
                sub_model = settings.lm.effective_sub_model
                sub_window = await lm.window(sub_model, role="sub")
                known = await lm.window_known(sub_model, role="sub")
                checks.append(
                    Check(
                        "sub-call window",
                        True,
                        f"{sub_window} tokens" + ("" if known else " ASSUMED: the endpoint does not report it"),
                        "" if known else "Set RLM_MCP_SUB_MAX_MODEL_LEN to the window the sub-call server really has.",
                        warn=not known,
                    )
                )
        except RlmMcpError as exc:
            checks.append(Check("model", False, exc.cause, exc.fix or ""))
            return checks
        roles: list[CallRole] = ["root", "sub"] if lm.separate_sub_endpoint else ["root"]
        for role in roles:
            model = settings.lm.model if role == "root" else settings.lm.effective_sub_model
            name = "completion" if role == "root" else "sub-call completion"
            try:
                done = await lm.complete([{"role": "user", "content": "Say OK."}], model=model, max_tokens=1, role=role)
                rec = done.record
                checks.append(
                    Check(name, True, f"1 token in {rec.latency_s:.2f} s ({rec.prompt_tokens} prompt tokens)")
                )
            except RlmMcpError as exc:
                checks.append(Check(name, False, exc.cause, exc.fix or ""))
        return checks
    finally:
        await lm.aclose()


def _unlisted(settings: Settings) -> Check:
    """The endpoint answered but GET /models listed nothing: most often a base URL without /v1."""
    url = settings.lm.base_url.rstrip("/")
    detail = f"not confirmed: {url}/models lists no models"
    if not urlsplit(url).path.endswith("/v1"):
        return Check(
            "model", False, detail, f"OpenAI-compatible servers answer under /v1: set RLM_MCP_BASE_URL={url}/v1"
        )
    return Check("model", True, detail, "The completion check below tells whether the model answers.", warn=True)


async def _profile(settings: Settings) -> Check:
    # Never downloads: doctor reports what a run would use now, and the command that fixes it.
    from rlm_mcp.service.profile import choose_profile

    try:
        choice = await anyio.to_thread.run_sync(lambda: choose_profile(settings.service, fetch=False))
    except RlmMcpError as exc:
        return Check("prompt profile", False, exc.cause, exc.fix or "")
    if not choice.fix:
        return Check("prompt profile", True, f"{choice.profile.name} ({choice.detail})")
    # The server still works with the rlm-mcp profile; when fetching is on, the first run gets
    # the reference texts by itself. Say so, with the one command that fixes it now.
    detail = f"{choice.profile.name} ({choice.detail})"
    if settings.loop.reference_fetch:
        detail += "; the first run fetches the reference texts once (needs the package index)"
    return Check("prompt profile", True, detail, choice.fix, warn=True)


CLOCK_SKEW_WARN_S = 2.0  # as the servers' own warning at start (service.queue.CLOCK_SKEW_WARN_S)


def _clock(skew_s: float) -> Check:
    """This host's clock against the database's: leases, timeouts and record ages use the
    database's clock, but a host whose clock is off shows misleading times."""
    if abs(skew_s) <= CLOCK_SKEW_WARN_S:
        return Check("clock", True, f"within {abs(skew_s):.1f} s of the database's")
    side = "ahead of" if skew_s > 0 else "behind"
    return Check(
        "clock",
        True,
        f"{abs(skew_s):.1f} s {side} the database's",
        "Fix this host's time sync (NTP, chrony); leases and timeouts use the database's clock.",
        warn=True,
    )


async def _rehearsed(url: str, where: str) -> MigrationError | None:
    """The `MigrationError` the pending migrations would meet at the next start, tried in a
    transaction rolled back (nothing changes); None when they apply or this cannot tell."""
    import psycopg

    from rlm_mcp.store.pg.connect import Connection
    from rlm_mcp.store.pg.migrations import rehearse

    try:
        async with await Connection.connect(url, autocommit=True, connect_timeout=10) as conn:
            return await rehearse(conn, where=f"database {where}")
    except psycopg.Error:  # unreachable meanwhile, or not allowed: the other rows say so
        return None


async def _team(settings: Settings) -> list[Check]:
    """Team mode (RLM_MCP_DATABASE_URL): the database, its schema version, the replicas seen."""
    database = settings.deployment.database
    if database is None:
        return []
    try:
        from rlm_mcp.store.pg.status import LATEST, team_status
    except ImportError:
        return [Check("database", False, "the PostgreSQL driver (the team extra) is not installed", TEAM_EXTRA_FIX)]
    import psycopg

    from rlm_mcp.store.pg.db import redact
    from rlm_mcp.store.pg.faults import setup_rows

    url = database.dsn
    try:
        status = await team_status(url, settings.team.worker_lease_s)
        if status.error is None:
            setup = await setup_rows(url, status.where, pending=status.schema_version < LATEST)
    except psycopg.Error as exc:  # any driver failure, in one line without the password
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [
            Check("database", False, redact(first, url), "Check RLM_MCP_DATABASE_URL; see the docs' Team server page.")
        ]
    if status.error is not None:
        return [Check("database", False, status.error, status.fix)]
    checks = [Check("database", True, status.where)]
    checks += [Check(name, ok, detail, fix) for name, ok, detail, fix in setup]
    if status.schema_version > LATEST:
        checks.append(
            Check(
                "schema",
                False,
                f"version {status.schema_version}, newer than this rlm-mcp knows (version {LATEST})",
                "Upgrade rlm-mcp here to the version the other replicas run.",
            )
        )
    elif status.schema_version < LATEST and (refused := await _rehearsed(url, status.where)) is not None:
        checks.append(Check("schema", False, refused.cause, refused.fix or ""))  # the start would fail so
    elif status.schema_version < LATEST:
        detail = f"version {status.schema_version or 'none'}; the first server start migrates it to {LATEST}"
        checks.append(Check("schema", True, detail, warn=status.schema_version > 0))
    else:
        checks.append(Check("schema", True, f"version {LATEST}"))
    if status.clock_skew_s is not None:
        checks.append(_clock(status.clock_skew_s))
    seen = "; ".join(status.replicas) if status.replicas else "none in the last minute"
    checks.append(Check("replicas", True, seen))
    if status.workers is not None:
        # Read from the tables only: a queue with runs waiting and no live worker is a warning.
        workers = "; ".join(status.workers) if status.workers else "none alive"
        checks.append(Check("workers", True, workers, warn=not status.workers and status.queued > 0))
        checks.append(Check("queue", True, f"{status.queued} run{'s' if status.queued != 1 else ''} waiting"))
    if status.schema_version >= _SESSIONS_SCHEMA:
        checks.append(await _sessions(settings, database))
    return checks


_SESSIONS_SCHEMA = 7  # store/migrations/postgres/0007_sessions.sql: the kept sessions' tables


def _size(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


async def _sessions(settings: Settings, database: TeamDatabase) -> Check:
    """Team mode's kept sessions, read from the database: how many are open, how many a run
    holds now, and the snapshots' bytes (what restoring them costs the database). Reads only:
    the pool is opened without the store's migration (the schema check above read the version)."""
    import psycopg

    from rlm_mcp.store.pg.db import Database
    from rlm_mcp.store.pg.sessions import PgSessionStore

    db = Database(database.dsn, replica=False, max_size=1)
    try:
        await db.pool.open(wait=True)
        rows = await PgSessionStore(db).list_open(None, max_age_s=settings.sessions.session_max_age_s)
    except (psycopg.Error, RlmMcpError) as exc:
        detail = exc.cause if isinstance(exc, RlmMcpError) else type(exc).__name__
        return Check("sessions", True, f"not read ({detail})", warn=True)
    finally:
        await db.pool.close()
    if not rows:
        return Check("sessions", True, "none open")
    snapshots = [r.snapshot_bytes for r in rows if r.snapshot_bytes is not None]
    busy = sum(1 for r in rows if not r.free)
    failed = [r.snapshot_error for r in rows if r.snapshot_error]
    detail = (
        f"{len(rows)} open ({busy} running a run now); {len(snapshots)} with a snapshot, "
        f"{_size(sum(snapshots))} in all, the largest {_size(max(snapshots, default=0))}"
    )
    if failed:
        detail += f"; {len(failed)} without a current snapshot: {failed[0]}"
    return Check("sessions", True, detail, warn=bool(failed))


async def _owner_share(settings: Settings) -> Check:
    """Each owner's share of the context store, as a server with these tokens applies it."""
    from rlm_mcp.access import load_tokens
    from rlm_mcp.store.owner_caps import derived_share

    try:
        tokens = load_tokens(settings.server)
    except (OSError, UnicodeDecodeError) as exc:
        return Check("owner share", False, f"the tokens file cannot be read ({exc})", "Fix RLM_MCP_AUTH_TOKENS_FILE.")
    return Check("owner share", True, derived_share(settings.store, len(tokens))[1])


async def _bucket(settings: Settings) -> list[Check]:
    """Team mode with RLM_MCP_BLOB_URL: the bucket answers a write, a read and a delete; its
    clock against this host's (S3 signatures are refused beyond 15 minutes of skew)."""
    location = settings.blobs.location
    if location is None or settings.deployment.embedded:
        if location is not None:
            return [Check("bucket", True, "RLM_MCP_BLOB_URL is unused outside team mode", warn=True)]
        return []
    from rlm_mcp.store.bucket import Bucket

    try:
        skew = await Bucket(location, timeout_s=min(settings.blobs.blob_timeout_s, 15.0)).round_trip()
    except RlmMcpError as exc:  # unreachable, refused, full; or obstore not installed
        return [Check("bucket", False, exc.cause, exc.fix or "")]
    detail = f"{location.url}: write, read and delete round trip"
    if skew is None or abs(skew) <= BUCKET_SKEW_WARN_S:
        return [Check("bucket", True, detail + ("" if skew is None else f", clock within {abs(skew):.0f} s"))]
    return [
        Check(
            "bucket",
            True,
            f"{detail}; this host's clock is {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the bucket's",
            "Fix this host's time sync (NTP, chrony): S3 refuses requests signed more than 15 minutes off.",
            warn=True,
        )
    ]


BUCKET_SKEW_WARN_S = 60.0


async def run_doctor(settings: Settings, out: Callable[[str], Any] = print) -> int:
    checks: list[Check] = []
    steps: list[Callable[[], Awaitable[Any]]] = [
        lambda: _owner_share(settings),
        lambda: _team(settings),
        lambda: _bucket(settings),
        lambda: _backend(settings),
        lambda: _lm(settings),
        lambda: _profile(settings),
    ]
    for step in steps:
        result = await step()
        checks.extend(result if isinstance(result, list) else [result])
    backend = settings.sandbox.sandbox_backend
    if all(c.ok for c in checks if c.name in (backend, "image")):
        checks.extend(await _sandbox(settings))
    else:
        title = "Docker" if backend == "docker" else backend
        checks.append(Check("sandbox round trip", False, f"skipped: {title} or the image is not ready", ""))
    width = max(len(c.name) for c in checks)
    for c in checks:
        out(f"{('warn' if c.warn else 'ok  ') if c.ok else 'FAIL'}  {c.name:<{width}}  {c.detail}")
        if (c.warn or not c.ok) and c.fix:
            out(f"      {'':<{width}}  fix: {c.fix}")
    failed = [c for c in checks if not c.ok]
    out("all checks passed" if not failed else f"{len(failed)} check(s) failed")
    return 0 if not failed else 1
