"""`rlm-mcp doctor`: is everything a run needs in place? One row per check, a fix per failure.

Exit code 0 only when every check passes. Output goes to stdout: doctor is a shell command,
never run as the MCP server.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from rlm_mcp.config import Settings
from rlm_mcp.errors import ImageMissingError, RlmMcpError
from rlm_mcp.lm.client import LMClient
from rlm_mcp.lm.server_kind import guess_server_kind
from rlm_mcp.ports import LMRequest
from rlm_mcp.sandbox.backends import backend_for
from rlm_mcp.sandbox.manager import SandboxManager


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # passed, but on an assumption the user should know about


async def _backend(settings: Settings) -> list[Check]:
    """The configured sandbox backend (RLM_MCP_SANDBOX_BACKEND): reachable, and its image there."""
    backend = backend_for(settings)
    try:
        try:
            about = await backend.describe()
        except RlmMcpError as exc:
            return [Check(backend.name, False, exc.cause, exc.fix or ""), Check("image", False, "not checked", "")]
        checks = [Check(backend.name, True, about)]
        try:
            await backend.check_ready()
            checks.append(Check("image", True, settings.sandbox_image))
        except ImageMissingError as exc:
            checks.append(Check("image", False, f"{settings.sandbox_image} is missing", exc.fix or ""))
        except RlmMcpError as exc:
            checks.append(Check("image", False, exc.cause, exc.fix or ""))
        return checks
    finally:
        backend.close()


async def _sandbox(settings: Settings) -> Check:
    async def bridge(request: LMRequest) -> list[str]:
        return [f"echo:{p}" for p in request.prompts]

    start = time.monotonic()
    try:
        async with SandboxManager(settings.model_copy(update={"pool_size": 0})) as manager:
            await manager.ensure_ready()
            async with manager.open([]) as sandbox:
                cell = await sandbox.execute("print(1 + 1, llm_query('x'))", bridge)
    except RlmMcpError as exc:
        return Check("sandbox round trip", False, exc.cause, exc.fix or "")
    ok = cell.stdout.strip() == "2 echo:x" and cell.error is None
    detail = (
        f"one cell in {time.monotonic() - start:.2f} s" if ok else f"unexpected output {cell.stdout!r} {cell.error!r}"
    )
    return Check("sandbox round trip", ok, detail, "" if ok else "Run the tests: pytest tests/test_sandbox_*.py")


async def _lm(settings: Settings) -> list[Check]:
    lm = LMClient(settings)
    try:
        probe = await lm.probe()
        if not probe.reachable:
            fix = probe.error or f"Start the server behind {settings.base_url}, or set RLM_MCP_BASE_URL."
            return [Check("lm endpoint", False, f"{settings.base_url} is unreachable", fix)]
        detail = f"{settings.base_url} answered"
        if probe.models is not None:
            detail += f"; serves {', '.join(probe.models)}"
        kind = guess_server_kind(settings.base_url, await lm.served_cards())
        detail += f"; looks like {kind}" if kind else "; server kind not recognised"
        checks = [Check("lm endpoint", True, detail)]
        try:
            await lm.check_model()
            window = await lm.window(settings.model)
            checks.append(Check("model", True, f"{settings.model} served"))
            if await lm.window_known(settings.model):
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
        except RlmMcpError as exc:
            checks.append(Check("model", False, exc.cause, exc.fix or ""))
            return checks
        try:
            done = await lm.complete(
                [{"role": "user", "content": "Say OK."}], model=settings.model, max_tokens=1, role="sub"
            )
            rec = done.record
            checks.append(
                Check("completion", True, f"1 token in {rec.latency_s:.2f} s ({rec.prompt_tokens} prompt tokens)")
            )
        except RlmMcpError as exc:
            checks.append(Check("completion", False, exc.cause, exc.fix or ""))
        return checks
    finally:
        await lm.aclose()


async def _profile(settings: Settings) -> Check:
    # Never downloads: doctor reports what a run would use now, and the command that fixes it.
    from rlm_mcp.service.profile import choose_profile

    try:
        choice = await anyio.to_thread.run_sync(lambda: choose_profile(settings, fetch=False))
    except RlmMcpError as exc:
        return Check("prompt profile", False, exc.cause, exc.fix or "")
    if not choice.fix:
        return Check("prompt profile", True, f"{choice.profile.name} ({choice.detail})")
    # The server still works with the rlm-mcp profile; when fetching is on, the first run gets
    # the reference texts by itself. Say so, with the one command that fixes it now.
    detail = f"{choice.profile.name} ({choice.detail})"
    if settings.reference_fetch:
        detail += "; the first run fetches the reference texts once (needs the package index)"
    return Check("prompt profile", True, detail, choice.fix, warn=True)


async def run_doctor(settings: Settings, out: Callable[[str], Any] = print) -> int:
    checks: list[Check] = []
    steps: list[Callable[[], Awaitable[Any]]] = [
        lambda: _backend(settings),
        lambda: _lm(settings),
        lambda: _profile(settings),
    ]
    for step in steps:
        result = await step()
        checks.extend(result if isinstance(result, list) else [result])
    backend = settings.sandbox_backend
    if all(c.ok for c in checks if c.name in (backend, "image")):
        checks.append(await _sandbox(settings))
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
