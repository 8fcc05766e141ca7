"""`rlm_load_context`: exactly one source (text, path, glob or url) into the store."""

from __future__ import annotations

from rlm_mcp.config import LoadSettings, StoreSettings
from rlm_mcp.errors import BadArgumentError
from rlm_mcp.owners import Owner
from rlm_mcp.ports import ContextFormat
from rlm_mcp.service.loaders import Loaded, fetch_url, load_glob, load_path
from rlm_mcp.service.loaders.addresses import AddressPolicy, parse_networks
from rlm_mcp.store import ContextInfo
from rlm_mcp.store.ports import ContextStorePort


class ContextLoader:
    """Loads into `contexts`; `loads`: what a load may read, `store`: temp files and the largest context."""

    def __init__(
        self, contexts: ContextStorePort, *, loads: LoadSettings, store: StoreSettings, allow_loopback_urls: bool
    ) -> None:
        self.loads = loads
        self.store = store
        self._contexts = contexts
        # In stdio mode the caller already runs on this machine, so loopback URLs reveal
        # nothing new; over HTTP they could reach services the caller cannot.
        self._allow_private = AddressPolicy(
            allow_all=allow_loopback_urls,
            private=loads.allow_private_urls,
            listed=tuple(parse_networks(loads.allowed_url_addresses)),
        )

    async def load(
        self,
        *,
        text: str | None,
        path: str | None,
        glob: str | None,
        url: str | None,
        name: str | None,
        format: ContextFormat,
        include: list[str] | None,
        exclude: list[str] | None,
        owner: Owner,
    ) -> ContextInfo:
        given = [k for k, v in (("text", text), ("path", path), ("glob", glob), ("url", url)) if v is not None]
        if len(given) != 1:
            raise BadArgumentError(
                f"rlm_load_context takes exactly one source; got {', '.join(given) or 'none'}.",
                "Pass one of text, path, glob or url.",
            )
        if format not in ("text", "json"):
            raise BadArgumentError(f"Unknown format {format!r}.", "Use format='text' or format='json'.")
        if (include or exclude) and text is not None:
            raise BadArgumentError("include/exclude apply to folders and globs only.", "Drop them for text.")
        if text is not None:
            data = text.encode("utf-8")
            return await self._contexts.put_bytes(
                data, name=name or "text", format=format, source={"type": "text", "bytes": len(data)}, owner=owner
            )
        if path is not None:
            loaded = await load_path(path, loads=self.loads, store=self.store, include=include, exclude=exclude)
        elif glob is not None:
            loaded = await load_glob(glob, loads=self.loads, store=self.store, include=include, exclude=exclude)
        else:
            assert url is not None
            loaded = await fetch_url(url, loads=self.loads, store=self.store, allow_private=self._allow_private)
        return await self._store_loaded(loaded, name=name, format=format, owner=owner)

    async def _store_loaded(
        self, loaded: Loaded, *, name: str | None, format: ContextFormat, owner: Owner
    ) -> ContextInfo:
        final_name = name or loaded.name
        try:
            if loaded.path is None:
                assert loaded.data is not None
                return await self._contexts.put_bytes(
                    loaded.data, name=final_name, format=format, source=loaded.source, owner=owner
                )
            # The loader's temp file (never the user's own file) moves into the store.
            return await self._contexts.put_file(
                loaded.path, name=final_name, format=format, source=loaded.source, consume=True, owner=owner
            )
        finally:
            loaded.cleanup()
