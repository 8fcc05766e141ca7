"""The LM client's HTTP layer: one keep-alive pool per endpoint, replies read whole, errors in
three kinds (lm/http_reply.py).

A plain-http endpoint the environment is not read for (a loopback vLLM) is spoken to by
lm/plain_http.py (llhttp's parser, half aiohttp's CPU per request); everything else by aiohttp.
aiohttp rather than httpx: its C parser and simple pool cost ~0.15 ms of CPU per request here,
httpx ~1-2 ms (its pool's per-request bookkeeping grows with concurrency), which made the
client, not the server, the bottleneck of a 16-way batch (bench/lm.py prints both).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson
from multidict import CIMultiDict

from rlm_mcp.lm.env_routes import DIRECT, EnvRoutes
from rlm_mcp.lm.http_reply import (
    HttpError,
    HttpReply,
    HttpTimeout,
    HttpTransportError,
    HttpUnreadable,
    decode_json,
)

_JSON_HEADERS = {"Content-Type": "application/json"}


# `json.dumps` with these options builds this encoder on every call; it keeps no state, so one does.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encode_json(obj: Any) -> bytes:
    """A request body as httpx wrote it: compact, UTF-8, no NaN. Written by orjson when it writes
    the same bytes (`_plain`: a sub-call's body, 200 in a batch, in a twentieth of the time),
    else by the standard library, whose bytes and errors these are."""
    if _plain(obj):
        try:
            return orjson.dumps(obj)
        except orjson.JSONEncodeError:  # an integer past 64 bits, a lone surrogate, deep nesting
            pass
    return _ENCODER.encode(obj).encode("utf-8")


def _plain(value: Any) -> bool:
    """Whether `value` holds only what orjson writes byte for byte as `_ENCODER` does: str (every
    code point escaped alike), int, bool, None, a float that both write in positional notation
    (zero, and 1e-4 <= |x| < 1e16: the same shortest digits), and lists and str-keyed dicts of
    them. Not a float outside that range (orjson writes `1e16` where Python writes `1e+16`, and
    NaN as null), a tuple or a subclass. A float is what most extra bodies hold (a temperature),
    and one would send the whole request, a root call's conversation with it, to `_ENCODER`."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return bool(value == 0.0 or 1e-4 <= abs(value) < 1e16)
    if kind is dict:
        for key, item in value.items():  # noqa: SIM110 - a loop, not all(...): no generator per container
            if type(key) is not str or not (type(item) is str or _plain(item)):
                return False
        return True
    if kind is list:
        for item in value:
            if type(item) is str:
                continue
            if type(item) is dict:
                # A chat message, here without a call of its own: a request carries the whole
                # conversation, so this runs once per message of every root call.
                for key, field in item.items():
                    if type(key) is not str or not (type(field) is str or _plain(field)):
                        return False
            elif not _plain(item):
                return False
        return True
    return False


AIOHTTP_IDLE_S = 15.0  # aiohttp's own idle time for a kept connection, kept for https endpoints


class HttpPool:
    """One endpoint's connections for the whole process. Make it (and use it) on the running loop.

    aiohttp is imported by the pool's methods, not at the top: a process starts without it (it is
    the largest import of the LM layer) and loads it with its first LM call.

    `trust_env`: the environment's proxy and `.netrc` login are honoured as aiohttp's own
    `trust_env` honours them, but looked up once per URL (lm/env_routes.py says why). Without it
    (a loopback endpoint), a GET or POST to a plain-http URL goes through lm/plain_http.py."""

    def __init__(
        self,
        *,
        headers: dict[str, str],
        timeout_s: float,
        connect_s: float,
        trust_env: bool,
        idle_reuse_s: float | None = None,
    ) -> None:
        """`idle_reuse_s`: a connection idle this long is closed, not reused (a plain-http
        endpoint's: `plain_http.IDLE_REUSE_S`); None keeps aiohttp's own (`AIOHTTP_IDLE_S`)."""
        import aiohttp

        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_s)
        # A proxy from the environment must not capture a local vLLM (the caller decides).
        self._routes = EnvRoutes() if trust_env else None
        # Plain http with the environment unread (a loopback endpoint): lm/plain_http.py says why.
        from rlm_mcp.lm.plain_http import PlainPool

        self._plain = None if trust_env else PlainPool(headers, timeout_s=timeout_s, connect_s=connect_s)
        # With a proxy passed per request, aiohttp copies a session's default headers into the
        # proxy's (the API key would reach the proxy as Proxy-Authorization): with routes, the
        # pool's headers go on each request instead.
        self._headers = headers if trust_env else None
        self._session = aiohttp.ClientSession(
            headers=None if trust_env else headers,
            timeout=self._timeout,
            # No connection cap: the client's semaphore bounds concurrent calls; idle ones are kept alive.
            connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=0, keepalive_timeout=AIOHTTP_IDLE_S if idle_reuse_s is None else idle_reuse_s
            ),
            # The environment is read by `_routes` instead: once per URL, not twice per request in a thread.
            trust_env=False,
        )

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: bytes | None = None,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpReply:
        import aiohttp  # loaded by __init__ already: a lookup in sys.modules

        sent: Mapping[str, str] | None = _JSON_HEADERS if json_body is not None else None
        if headers:
            sent = {**(sent or {}), **headers}
        plain = self._plain
        if plain is not None and plain.takes(method, url, sent):
            return await plain.request(method, url, body=json_body, headers=sent, timeout_s=timeout_s)
        timeout = self._timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        route = DIRECT
        if self._routes is not None:
            # The request's headers over the pool's, by name whatever its case (as aiohttp merges them).
            merged = CIMultiDict(self._headers or {})
            merged.update(sent or {})
            route = await self._routes.route(url, merged)
            if route.auth is not None:
                merged["Authorization"] = route.auth
            if route.request_proxy_auth is not None:
                merged["Proxy-Authorization"] = route.request_proxy_auth
            sent = merged
        try:
            async with self._session.request(
                method,
                url,
                data=json_body,
                headers=sent,
                timeout=timeout,
                proxy=route.proxy,
                proxy_headers=route.proxy_headers,
            ) as resp:
                content = await resp.read()
                # aiohttp's parser made these headers for this reply alone and never changes them:
                # kept as they are, not copied.
                return HttpReply(url, resp.status, resp.headers, content)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise HttpTimeout(str(exc) or type(exc).__name__) from exc
        except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
            raise HttpUnreadable(f"{type(exc).__name__}: {exc}") from exc
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise HttpTransportError(str(exc) or type(exc).__name__) from exc
        except aiohttp.ClientError as exc:
            raise HttpUnreadable(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._plain is not None:
            self._plain.close()
        await self._session.close()


__all__ = [
    "HttpError",
    "HttpPool",
    "HttpReply",
    "HttpTimeout",
    "HttpTransportError",
    "HttpUnreadable",
    "decode_json",
    "encode_json",
]
