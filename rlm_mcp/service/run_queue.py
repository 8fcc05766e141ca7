"""How many runs may wait for a slot, and how many of the slots one owner may hold.

Runs beyond RLM_MCP_MAX_RUNS wait in a queue; unbounded, 1,100 `rlm_start` calls held 1,100
run logs open and exhausted a 1,024-fd server. The queue is bounded overall
(RLM_MCP_RUN_MAX_QUEUED) and per owner (RLM_MCP_RUN_MAX_QUEUED_PER_OWNER, so one token cannot
fill it for the others); a run over either bound is refused at once, before anything is opened,
with an error that speaks only of the caller's own runs or of the server as a whole.

Of the slots themselves, each owner holds at most its share (`owner_run_share`): a run over it
waits in the queue even while slots are free, so one token cannot hold every slot while another
token's runs reach the queue timeout. Embedded mode enforces it at start (`service.slots`); a
team-mode worker asks the same function at claim time.
"""

from __future__ import annotations

from collections.abc import Hashable

from rlm_mcp.access import load_tokens
from rlm_mcp.config import RunSettings, ServerSettings
from rlm_mcp.errors import BusyError

__all__ = ["ConfiguredOwners", "configured_owners", "owner_run_share", "queue_refusal"]


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def queue_refusal(settings: RunSettings, *, queued: int, queued_by_owner: int) -> BusyError | None:
    """The busy error for one more queued run, or None when there is room."""
    if queued_by_owner >= settings.run_max_queued_per_owner:
        return BusyError(
            f"You already have {_runs(queued_by_owner)} waiting for a slot "
            f"(RLM_MCP_RUN_MAX_QUEUED_PER_OWNER={settings.run_max_queued_per_owner}).",
            "Wait for one to start or end (rlm_status), or cancel one (rlm_cancel).",
        )
    if queued >= settings.run_max_queued:
        return BusyError(
            f"The server's queue is full: {_runs(queued)} waiting for a slot (RLM_MCP_RUN_MAX_QUEUED).",
            "Try again in a while; the operator can raise RLM_MCP_RUN_MAX_QUEUED or RLM_MCP_MAX_RUNS.",
        )
    return None


def owner_run_share(settings: RunSettings, *, owners: int, slots: int | None = None) -> int:
    """How many runs one owner may have executing at once (RLM_MCP_MAX_RUNS_PER_OWNER).

    `slots`: the run slots the share is of (default RLM_MCP_MAX_RUNS, this process's; team mode
    passes the slots of every live worker). `owners`: how many tokens are configured
    (`configured_owners`, `ConfiguredOwners`). Unset, the share is every slot when one owner can exist (stdio,
    or HTTP with one token) and half of them, rounded up, when several tokens are configured, so
    one token never holds every slot while another's runs wait. Never more than `slots`, never
    less than 1."""
    total = settings.max_runs if slots is None else slots
    if settings.max_runs_per_owner is not None:
        return max(1, min(settings.max_runs_per_owner, total))
    return max(1, total if owners <= 1 else -(-total // 2))


def configured_owners(settings: ServerSettings) -> int:
    """The number of tokens the settings accept (each one an owner); 1 without any."""
    try:
        return max(1, len(load_tokens(settings)))
    except OSError:  # an unreadable tokens file: the server refuses to start over it anyway
        return 1


class ConfiguredOwners:
    """`configured_owners`, read once and again only when the tokens file changes (its size,
    modification time or inode): a team worker asks at every claim, inside the claim's locked
    transaction, which must not read and parse a file each time; a token added to the file still
    counts from the next claim on."""

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        self._seen: Hashable = None
        self._count: int | None = None

    def count(self) -> int:
        seen = self._file_state()
        if self._count is None or seen != self._seen:
            self._seen, self._count = seen, configured_owners(self._settings)
        return self._count

    def _file_state(self) -> Hashable:
        path = self._settings.auth_tokens_file
        if path is None:
            return None
        try:
            st = path.expanduser().stat()
        except OSError:
            return "unreadable"
        return (st.st_mtime_ns, st.st_size, st.st_ino)
