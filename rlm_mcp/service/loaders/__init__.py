"""Turning a path, folder, glob or URL into context bytes (a temp file the caller stores).

loaded = await load_path("~/notes", loads=settings.loads, store=settings.store)
try:
    info = await store.put_file(loaded.path, name=loaded.name, format="text",
                                source=loaded.source, consume=True)
finally:
    loaded.cleanup()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlm_mcp.service.loaders.common import Loaded
from rlm_mcp.service.loaders.paths import load_glob, load_path

if TYPE_CHECKING:
    from rlm_mcp.config import LoadSettings, StoreSettings
    from rlm_mcp.service.loaders.addresses import AddressPolicy

__all__ = ["Loaded", "fetch_url", "load_glob", "load_path"]


async def fetch_url(
    url: str, *, loads: LoadSettings, store: StoreSettings, allow_private: bool | AddressPolicy
) -> Loaded:
    """`urls.fetch_url`, imported on the first URL load: httpx (and, when installed, the click, rich
    and pygments of its command line) would otherwise load with every server and CLI start."""
    from rlm_mcp.service.loaders import urls

    return await urls.fetch_url(url, loads=loads, store=store, allow_private=allow_private)
