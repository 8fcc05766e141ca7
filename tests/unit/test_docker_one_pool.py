"""A Docker client on a unix socket sends every request through one connection pool: docker-py's
adapter kept a pool per URL in an LRU of 25 and closed the one it evicted, even while another
thread was sending through it (a run at 32 concurrent runs ended with urllib3's
`AttributeError: 'NoneType' object has no attribute ...` as its internal error). No daemon is
needed: the client is only built, and the adapter asked for its pools."""

from __future__ import annotations

from pathlib import Path

import docker

from rlm_mcp.sandbox.docker.docker_api import UNIX_POOL_CONNECTIONS, share_one_pool


def _client(tmp_path: Path) -> docker.DockerClient:
    # A fixed API version: the client is built without asking a daemon for it.
    return docker.DockerClient(base_url=f"unix://{tmp_path / 'docker.sock'}", version="1.41")


def _urls(n: int) -> list[str]:
    return [f"http+docker://localhost/v1.41/containers/c{i}/json" for i in range(n)]


def test_a_pool_in_use_is_not_closed_by_requests_to_other_urls(tmp_path: Path) -> None:
    client = _client(tmp_path)
    share_one_pool(client)
    adapter = client.api.get_adapter("http+docker://localhost/v1.41/version")
    in_use = adapter.get_connection("http+docker://localhost/v1.41/containers/busy/attach")
    for url in _urls(60):  # more URLs than docker-py's LRU of 25 pools holds
        assert adapter.get_connection(url) is in_use
    assert in_use.pool is not None  # not closed under the request still using it
    assert in_use.pool.maxsize == UNIX_POOL_CONNECTIONS
    assert len(adapter.pools) == 1
    client.close()


def test_the_socket_and_timeout_are_kept(tmp_path: Path) -> None:
    client = _client(tmp_path)
    before = client.api.get_adapter("http+docker://localhost/v1.41/version")
    share_one_pool(client)
    after = client.api.get_adapter("http+docker://localhost/v1.41/version")
    assert after is not before and after is client.api._custom_adapter
    assert (after.socket_path, after.timeout) == (before.socket_path, before.timeout)
    client.close()


def test_a_tcp_client_is_left_as_docker_py_makes_it(tmp_path: Path) -> None:
    client = docker.DockerClient(base_url="tcp://127.0.0.1:1", version="1.41")
    adapters = dict(client.api.adapters)
    share_one_pool(client)
    assert dict(client.api.adapters) == adapters
    client.close()
