"""HAProxy (Debian's package) in front of rlm-mcp HTTP replicas sharing one PostgreSQL database
and one Docker daemon: the deployment docs/team.md describes.

`balanced_replicas` starts `count` replicas (tests/fixtures_team.py's `team_replica`: `rlm-mcp
serve --transport http`, each with its own data dir and log), then HAProxy on a free loopback port
with the repository's own configuration, `deploy/haproxy/haproxy.cfg` (docs/team.md links that
file): only the lines marked `# yours` (the listening address and certificate, the servers) are
replaced, with TLS terminated by a certificate made for the test. Everything is stopped on exit.

Which replica served what is read from the replicas' own logs (uvicorn's access lines and the
SDK's "Created new transport with session ID" line), never from HAProxy's word.
"""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_team import Replica, team_replica

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
YOURS = "# yours"


def haproxy_path() -> str:
    # /usr/sbin is not on every user's PATH
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if found is None:
        pytest.fail(
            "haproxy is missing: the load-balancer tests run Debian's package. Install it (apt-get install "
            "haproxy; .ci/run does), or deselect them with -m 'not postgres'."
        )
    return found


def render(template: str, *, port: int, cert: Path, servers: Sequence[tuple[str, int]]) -> str:
    """The configuration with the `# yours` lines replaced: the bind's address and certificate
    (its other options kept), and the server lines by `servers`. Fails if the template no longer
    has exactly the lines this replaces (then the README's configuration is untested)."""
    out: list[str] = []
    binds = placed = 0
    for line in template.splitlines():
        if not line.rstrip().endswith(YOURS):
            out.append(line)
            continue
        directive = line.strip().split()[0]
        if directive == "bind":
            bound = re.sub(r"^(\s*bind )\S+", rf"\g<1>127.0.0.1:{port}", line.split(YOURS)[0].rstrip())
            out.append(re.sub(r" crt \S+", f" crt {cert}", bound))
            binds += 1
        elif directive == "server":
            if not placed:
                indent = line[: len(line) - len(line.lstrip())]
                out += [f"{indent}server rlm{i + 1} {host}:{p}" for i, (host, p) in enumerate(servers)]
            placed += 1
        else:
            raise AssertionError(f"{CONFIG.name}: unexpected '{YOURS}' line: {line!r}")
    assert binds == 1 and placed >= 1, f"{CONFIG.name} must mark one bind line and its server lines '{YOURS}'"
    return "\n".join(out) + "\n"


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1: (HAProxy's PEM, certificate and key; the CA file
    clients trust)."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    both = folder / "haproxy.pem"
    both.write_bytes(cert.read_bytes() + key.read_bytes())
    return both, cert


@dataclass(frozen=True)
class Balanced:
    url: str  # https://127.0.0.1:PORT, HAProxy
    cafile: Path  # the certificate clients trust
    replicas: list[Replica]
    public_url: str
    log: Path  # HAProxy's

    def _states(self, name: str) -> list[str]:
        text = self.log.read_text(errors="replace")
        return re.findall(rf"Server rlm_mcp/{re.escape(name)} is (UP|DOWN)", text)

    def server_down(self, name: str) -> bool:
        """HAProxy has taken `name` out of the rotation (its health checks failed)."""
        return self._states(name)[-1:] == ["DOWN"]

    def server_up(self, name: str) -> bool:
        """HAProxy has put `name` back after taking it out."""
        return "DOWN" in self._states(name) and self._states(name)[-1] == "UP"

    def requests(self) -> dict[str, int]:
        return {r.name: r.mcp_requests() for r in self.replicas}


@contextmanager
def balanced_replicas(
    tmp_path: Path,
    *,
    database_url: str | Sequence[str],
    lm_url: str,
    tokens: Sequence[str],
    count: int = 3,
    env: Mapping[str, str] | None = None,
    roles: Sequence[str] | None = None,
) -> Iterator[Balanced]:
    """`count` replicas on `database_url` behind HAProxy (see the module's docstring); a list
    gives each replica its own; `roles` gives each its `--role` (default: both)."""
    urls = [database_url] * count if isinstance(database_url, str) else list(database_url)
    roles = list(roles) if roles is not None else ["both"] * count
    assert len(urls) == count == len(roles)
    haproxy = haproxy_path()
    folder = tmp_path / "haproxy"
    folder.mkdir()
    pem, cafile = make_certificate(folder)
    lb_port = free_port()
    public_url = f"https://127.0.0.1:{lb_port}"
    replicas: list[Replica] = []
    with ExitStack() as stack:
        for i in range(count):
            replicas.append(
                stack.enter_context(
                    team_replica(
                        tmp_path / f"replica{i + 1}",
                        name=f"rlm{i + 1}",  # its server name in HAProxy's configuration
                        role=roles[i],
                        database_url=urls[i],
                        lm_url=lm_url,
                        tokens=tokens,
                        # the Host and Origin HAProxy forwards; the caller's settings win
                        env={"RLM_MCP_PUBLIC_URL": public_url, **(env or {})},
                    )
                )
            )
        config = folder / "haproxy.cfg"
        config.write_text(
            render(CONFIG.read_text(), port=lb_port, cert=pem, servers=[("127.0.0.1", r.port) for r in replicas])
        )
        checked = subprocess.run([haproxy, "-c", "-q", "-f", str(config)], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        # -db: in the foreground, stopped by SIGTERM like the replicas; its log says when it
        # takes a server out of the rotation
        log = folder / "haproxy.log"
        stack.enter_context(server_process([haproxy, "-db", "-f", str(config)], port=lb_port, within_s=60, log=log))
        yield Balanced(url=public_url, cafile=cafile, replicas=replicas, public_url=public_url, log=log)


@asynccontextmanager
async def mcp_client(balanced: Balanced, mode: str, token: str) -> AsyncIterator[Client]:
    """An MCP client through the balancer (TLS, its certificate trusted), as `token`."""
    http = httpx2.AsyncClient(
        headers={"authorization": f"Bearer {token}"},
        timeout=120,
        verify=ssl.create_default_context(cafile=balanced.cafile),
    )
    transport = streamable_http_client(f"{balanced.url}/mcp", http_client=http)
    async with http, Client(transport, mode=mode) as client:
        yield client


async def served_by(balanced: Balanced, before: dict[str, int]) -> str:
    """The one replica that answered the /mcp requests made since `before`."""
    await wait_until(
        lambda: balanced.requests() != before, within_s=60, what="a replica to log the request it answered"
    )
    after = balanced.requests()
    changed = [name for name in after if after[name] != before[name]]
    assert len(changed) == 1, f"one call, several replicas: {before} -> {after}"
    return changed[0]


def health_status(base: str) -> int | None:
    try:
        return httpx.get(f"{base}/healthz", timeout=10).status_code
    except httpx.HTTPError:
        return None
