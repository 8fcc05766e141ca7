"""Turning a path, folder, glob or URL into context bytes (a temp file the caller stores).

loaded = await load_path("~/notes", loads=settings.loads, store=settings.store)
try:
    info = await store.put_file(loaded.path, name=loaded.name, format="text",
                                source=loaded.source, consume=True)
finally:
    loaded.cleanup()
"""

from rlm_mcp.service.loaders.common import Loaded
from rlm_mcp.service.loaders.paths import load_glob, load_path
from rlm_mcp.service.loaders.urls import fetch_url

__all__ = ["Loaded", "fetch_url", "load_glob", "load_path"]
