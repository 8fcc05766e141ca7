"""What the environment says about reaching an LM endpoint: its proxy and its `.netrc` credentials.

aiohttp's `trust_env=True` reads both on every request, each in a worker thread (the netrc file,
then the proxy variables): two thread hops per LM call, on the 2-core VM about 0.3 ms more of the
event loop's CPU per call than the call itself (bare requests to the scripted LM: 0.45-0.75 ms
against 0.28-0.36 ms with `trust_env` off), and milliseconds of latency when the machine is busy.
A process's environment does not change under it, so `EnvRoutes` reads them once per URL (an
endpoint's client asks a handful of URLs), in one worker thread, with
aiohttp's own helpers (the same variables, `NO_PROXY` and `.netrc` lookups), and the pool passes
the answer to aiohttp per request with `trust_env` off:

- a proxy for the URL's scheme (`HTTP_PROXY`, `HTTPS_PROXY`; `NO_PROXY` exempts hosts), its
  credentials from the proxy URL or `.netrc`, sent as `Proxy-Authorization` where aiohttp sends
  them (on the request itself through a plain-http proxy, on the CONNECT for https);
- the endpoint host's `.netrc` login as basic auth, unless the URL carries credentials or the
  request already has an `Authorization` header (the endpoint's API key: kept, where aiohttp
  refused the request with a ValueError).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import anyio
from multidict import CIMultiDict


@dataclass(frozen=True)
class Route:
    """How one request reaches its origin: through `proxy` (None: directly), with these headers."""

    proxy: str | None = None
    # Proxy-Authorization for an https target (it goes on the CONNECT request) ...
    proxy_headers: Mapping[str, str] | None = None
    # ... and for a plain-http one (it goes on the request the proxy forwards).
    request_proxy_auth: str | None = None
    auth: str | None = None  # basic auth from `.netrc`, as an Authorization value


DIRECT = Route()


def _lookup(url: str) -> Route:
    """The route the environment gives `url` (blocking: reads the netrc file; run in a worker thread)."""
    from aiohttp.helpers import basicauth_from_netrc, get_env_proxy_for_url, netrc_from_env
    from yarl import URL

    target = URL(url)
    proxy: str | None = None
    proxy_auth: str | None = None
    try:
        proxy_url, credentials = get_env_proxy_for_url(target)
        proxy = str(proxy_url)
        proxy_auth = credentials.encode() if credentials is not None else None
    except LookupError:  # no proxy for this scheme, or NO_PROXY exempts the host
        pass
    auth: str | None = None
    if target.user is None and target.host is not None:
        try:
            auth = basicauth_from_netrc(netrc_from_env(), target.host).encode()
        except LookupError:  # no netrc file, or no entry for the host
            pass
    https = target.scheme in ("https", "wss")
    return Route(
        proxy=proxy,
        proxy_headers={"Proxy-Authorization": proxy_auth} if proxy_auth is not None and https else None,
        request_proxy_auth=proxy_auth if not https else None,
        auth=auth,
    )


class EnvRoutes:
    """The environment's route per URL, looked up on the first request to it."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    async def route(self, url: str, headers: CIMultiDict[str]) -> Route:
        """The route for a request to `url` with `headers` (all of them: the pool's too)."""
        route = self._routes.get(url)
        if route is None:
            # Concurrent first requests may each look it up: the same answer, stored once.
            route = self._routes.setdefault(url, await anyio.to_thread.run_sync(_lookup, url))
        if route.auth is not None and "Authorization" in headers:
            # The endpoint's API key: a netrc login never replaces it.
            route = Route(route.proxy, route.proxy_headers, route.request_proxy_auth, None)
        return route
