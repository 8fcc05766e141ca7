"""The Docker API calls of a sandbox's life, sent through docker-py's connection pool directly.

A docker-py call costs its process 430-550 µs of CPU on a unix socket (an inspect, an update; the
2-vCPU VM), two fifths of it in `requests`' session layer (preparing the request, merging
settings, hooks, building the response) before urllib3 sends it: 240-330 µs sent this way. A
sandbox's start and removal make five such calls, the attach among them. `LeanCalls`
sends the same requests through the same urllib3 pool (`docker_api.share_one_pool`: its
connections, their reuse and its check of a dropped connection before reuse) and keeps what
matters of docker-py's answer: the body of a call that succeeded, and for one that did not the
very exception docker-py raises (`docker.errors.create_api_error_from_http_exception`), so that
`faults.classify` and every caller tell the cases apart as before. A connection that fails
raises urllib3's own exceptions, which `faults.classify` already knows as a lost connection.
The attach call (~640 µs through docker-py) is sent the same way: its upgraded connection is
taken out of the pool for good and its socket handed over, as docker-py's `attach_socket` does.

Only for a client on a unix socket (where `share_one_pool` put the one pool); other transports
(TCP with TLS, SSH) keep docker-py's calls, whose methods `LeanCalls` mirrors by name and
signature (`calls`).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

__all__ = ["LeanCalls", "calls"]

_JSON = {"Content-Type": "application/json"}


def calls(client: Any) -> Any:
    """What a sandbox's calls go through: the `LeanCalls` that `docker_api.connect_sync` gave a
    client on a unix socket, else docker-py's own API client (same method names)."""
    return getattr(client, "rlm_lean_calls", None) or client.api


class LeanCalls:
    """`create_container`, `inspect_container`, `start`, `update_container`,
    `remove_container` and `attach_socket`, as docker-py's `APIClient` answers them, without its
    session layer."""

    def __init__(self, api: Any, pool_key: str) -> None:
        self._api = api
        self._pool_key = pool_key  # the adapter gives every URL of this socket the same pool
        self._prefix = f"/v{api._version}"
        self._headers = {"User-Agent": api.headers.get("User-Agent", "docker-sdk-python")}

    def _send(
        self, method: str, target: str, headers: dict[str, str], payload: bytes | None, *, keep: bool = False
    ) -> Any:
        """urllib3's response; `keep`: its connection stays with it (an upgraded stream), unread."""
        import urllib3

        pool = self._api._custom_adapter.get_connection(self._pool_key)
        timeout = self._api.timeout
        return pool.urlopen(
            method,
            target,
            body=payload,
            headers=headers,
            retries=False,  # as docker-py's requests adapter: a failure is the caller's to judge
            redirect=False,
            assert_same_host=False,
            timeout=urllib3.Timeout(connect=timeout, read=timeout),
            preload_content=not keep,
            release_conn=not keep,
        )

    def _call(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        headers = self._headers if body is None else {**self._headers, **_JSON}
        payload = None if body is None else json.dumps(body).encode()
        response = self._send(method, target, headers, payload)
        data = response.data
        if response.status >= 400:
            _raise_refusal(self._pool_key + target, response.status, response.reason or "", data)
        if not data:
            return None
        return json.loads(data)

    def create_container(
        self, image: str, command: Any = None, *, name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        # `use_config_proxy` is docker-py's own option (hardening.py turns it off): nothing to send.
        if kwargs.pop("use_config_proxy", False):
            raise ValueError("LeanCalls does not inject the client configuration's proxies")
        config = self._api.create_container_config(image, command, **kwargs)
        # As docker-py sends it: no top-level nulls (old daemons cannot read a null string).
        body = {key: value for key, value in config.items() if value is not None}
        params = {"name": name} if name is not None else None
        answer: dict[str, Any] = self._call("POST", "/containers/create", params, body)
        return answer

    def inspect_container(self, container: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("GET", f"/containers/{container}/json")
        return answer

    def start(self, container: str) -> None:
        self._call("POST", f"/containers/{container}/start")

    def update_container(self, container: str, *, cpu_period: int, cpu_quota: int) -> None:
        self._call("POST", f"/containers/{container}/update", body={"CpuPeriod": cpu_period, "CpuQuota": cpu_quota})

    def remove_container(self, container: str, *, force: bool = False) -> None:
        self._call("DELETE", f"/containers/{container}", {"v": "False", "link": "False", "force": str(force)})

    def attach_socket(self, container: str, params: dict[str, Any]) -> Any:
        """The container's attach stream: the connection the daemon upgraded (`Upgrade: tcp`),
        out of the pool for good, as docker-py's `attach_socket` returns it (the socket's file
        object, which keeps the response from being collected and closing it)."""
        query = {"stdout": 1, "stderr": 1, "stream": 1, **params}
        detach_keys = self._api._general_configs.get("detachKeys")  # docker-py's, from the CLI's config
        if detach_keys and "detachKeys" not in query:
            query["detachKeys"] = detach_keys
        target = f"{self._prefix}/containers/{container}/attach?{urlencode(query)}"
        headers = {**self._headers, "Connection": "Upgrade", "Upgrade": "tcp"}
        response = self._send("POST", target, headers, None, keep=True)
        if response.status >= 400:
            data = response.data
            response.release_conn()
            _raise_refusal(self._pool_key + target, response.status, response.reason or "", data)
        stream = response._fp.fp.raw  # http.client's buffered reader's socket file, past the headers
        stream._response = response
        # The call's read timeout stays on the socket; a stream that lives as long as its
        # container has none (as docker-py's attach socket), so the event loop may read it.
        stream._sock.settimeout(None)
        return stream


def _raise_refusal(url: str, status: int, reason: str, data: bytes) -> None:
    """Raise what docker-py raises for this answer (`APIError`, `NotFound`, `ImageNotFound`, ...)."""
    import docker.errors
    import requests

    response = requests.models.Response()
    response.status_code, response.reason, response._content = status, reason, data
    response.url = url  # as docker-py's error text names it
    try:
        response.raise_for_status()
    except requests.exceptions.HTTPError as exc:
        docker.errors.create_api_error_from_http_exception(exc)  # raises
    raise AssertionError(f"{url}: {status} was not raised")  # pragma: no cover
