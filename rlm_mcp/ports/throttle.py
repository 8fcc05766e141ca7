"""The throttle channel: how the processes of a team tell each other that an LM endpoint asked
for less load (lm/throttle.py learns it; team mode carries it on PostgreSQL LISTEN/NOTIFY,
store/pg/throttle.py). A note is a short text; a lost one costs only a slower adaptation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class ThrottleChannel(Protocol):
    async def publish(self, note: str) -> None:
        """Send `note` to every listening process (this one included)."""
        ...

    async def listen(self, on_note: Callable[[str], None], *, on_connect: Callable[[], object]) -> None:
        """Call `on_note` with every note sent (`on_connect` once listening, again after each
        reconnect); never returns (cancel it)."""
        ...
