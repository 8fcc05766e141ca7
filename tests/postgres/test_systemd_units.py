"""The systemd units in deploy/systemd/ (docs/team.md): hardened, their settings known to
rlm-mcp, accepted by `systemd-analyze verify` where systemd is installed, and their ExecStart
commands run: each starts as the unit would start it (its Environment= lines, the test's own
settings in place of the EnvironmentFile) and answers the health route."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlm_mcp import __version__
from rlm_mcp.config import SETTING_FIELDS, Settings
from rlm_mcp.config_check import unknown_env_vars
from rlm_mcp.testing.servers import free_port, server_process
from rlm_mcp.testing.waiting import wait_until
from tests.fixtures_e2e import SERVER_SCRIPT, cli_env
from tests.paths import REPO

UNITS = REPO / "deploy" / "systemd"
ROLES = {"rlm-mcp-front.service": "front", "rlm-mcp-worker.service": "worker"}
INSTALLED = "/opt/rlm-mcp/bin/rlm-mcp"  # where the units' comments install rlm-mcp
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "CapabilityBoundingSet": "",
    "RestrictNamespaces": "yes",
    "UMask": "0077",
}


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """[Section] -> Key -> every value given (systemd allows a key several times)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}: not a unit line: {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def environment(service: dict[str, list[str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in service.get("Environment", []):
        for item in shlex.split(line):
            key, value = item.split("=", 1)
            env[key] = value
    return env


def env_file(path: Path) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def as_settings(env: dict[str, str]) -> Settings:
    fields: dict[str, Any] = {key.removeprefix("RLM_MCP_").lower(): value for key, value in env.items()}
    return Settings(_env_file=None, **fields)


def test_the_units_are_the_front_and_the_worker() -> None:
    assert sorted(p.name for p in UNITS.glob("*.service")) == sorted(ROLES)


@pytest.mark.parametrize("name", sorted(ROLES))
def test_a_unit_is_hardened_and_names_only_known_settings(name: str, tmp_path: Path) -> None:
    unit = parse_unit(UNITS / name)
    service = unit["Service"]
    assert service.get("DynamicUser") == ["yes"] or service.get("User"), "runs as an unprivileged user"
    for key, value in HARDENING.items():
        assert service.get(key) == [value], f"{name}: {key}={value}"
    assert service["EnvironmentFile"] == ["/etc/rlm-mcp/rlm-mcp.env"]  # the token and the database URL
    assert "docker" in " ".join(service.get("SupplementaryGroups", [])) or ROLES[name] == "front"
    assert "docker" not in " ".join(service.get("SupplementaryGroups", [])) or ROLES[name] == "worker"
    env = environment(service)
    assert unknown_env_vars(SETTING_FIELDS, env) == []
    settings = as_settings(env)
    assert settings.team.role == ROLES[name] and settings.store.data_dir == Path(env["RLM_MCP_DATA_DIR"])
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]

    (argv0, *args) = shlex.split(service["ExecStart"][0])
    assert argv0 == INSTALLED and args[:1] == ["serve"]
    systemd_analyze = shutil.which("systemd-analyze")
    if systemd_analyze is not None:  # where systemd is installed, it checks the unit itself
        copy = tmp_path / name
        copy.write_text((UNITS / name).read_text().replace(INSTALLED, str(SERVER_SCRIPT)))
        verified = subprocess.run(
            [systemd_analyze, "verify", "--man=no", "--generators=no", str(copy)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verified.returncode == 0 and not (verified.stdout + verified.stderr).strip(), verified.stderr


def test_the_example_environment_file_is_valid_settings() -> None:
    env = env_file(UNITS / "rlm-mcp.env.example")
    assert unknown_env_vars(SETTING_FIELDS, env) == []
    settings = as_settings(env)
    assert settings.team.database_url is not None and settings.server.auth_tokens and settings.server.public_url


def _health(base: str) -> httpx.Response | None:
    try:
        return httpx.get(f"{base}/healthz", timeout=10)
    except httpx.HTTPError:
        return None


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(ROLES))
async def test_a_units_command_starts_and_answers_health(name: str, tmp_path: Path, pg_url: str) -> None:
    service = parse_unit(UNITS / name)["Service"]
    (_, *args) = shlex.split(service["ExecStart"][0])
    port = free_port()
    unit_env = environment(service)
    # The test's own EnvironmentFile: what /etc/rlm-mcp/rlm-mcp.env holds on a real machine.
    env = cli_env(
        tmp_path,
        **{
            **unit_env,
            "RLM_MCP_DATA_DIR": str(tmp_path / "data"),
            "RLM_MCP_DATABASE_URL": pg_url,
            "RLM_MCP_AUTH_TOKENS": "unit-test-token",
            "RLM_MCP_HOST": "127.0.0.1",
            "RLM_MCP_PORT": str(port),
            "RLM_MCP_BASE_URL": "http://127.0.0.1:9/v1",
        },
    )
    base = f"http://127.0.0.1:{port}"
    with server_process([str(SERVER_SCRIPT), *args], port=port, env=env, within_s=120):
        await wait_until(
            lambda: (r := _health(base)) is not None and r.status_code == 200, within_s=120, what=f"{name} healthy"
        )
        answer = _health(base)
        assert answer is not None
        expected = {"status": "ok", "version": __version__, "role": ROLES[name], "database": "reachable"}
        assert answer.json() == expected


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp and tcp6 write them) listening on `port`."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, hexport = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.postgres
@pytest.mark.anyio
async def test_the_worker_units_health_listens_on_loopback_whatever_the_environment_file_says(
    tmp_path: Path, pg_url: str
) -> None:
    """The shared environment file binds the fronts to 0.0.0.0; the worker's command keeps its
    unauthenticated health route on loopback. Positive control: the front's command, given the
    same file, listens on every address."""
    example = env_file(UNITS / "rlm-mcp.env.example")
    assert example["RLM_MCP_HOST"] == "0.0.0.0"
    seen: dict[str, set[str]] = {}
    for name in sorted(ROLES):
        service = parse_unit(UNITS / name)["Service"]
        (_, *args) = shlex.split(service["ExecStart"][0])
        port = free_port()
        env = cli_env(
            tmp_path,
            **{
                **environment(service),
                "RLM_MCP_DATA_DIR": str(tmp_path / f"data-{name}"),
                "RLM_MCP_DATABASE_URL": pg_url,
                "RLM_MCP_AUTH_TOKENS": "unit-test-token",
                "RLM_MCP_HOST": example["RLM_MCP_HOST"],
                "RLM_MCP_PORT": str(port),
                "RLM_MCP_BASE_URL": "http://127.0.0.1:9/v1",
            },
        )
        base = f"http://127.0.0.1:{port}"
        with server_process([str(SERVER_SCRIPT), *args], port=port, env=env, within_s=120):

            def answering(base: str = base) -> bool:
                return _health(base) is not None

            await wait_until(answering, within_s=120, what=f"{name} listening")
            seen[name] = _listening(port)
    assert seen["rlm-mcp-worker.service"] == {"0100007F"}  # 127.0.0.1 only
    assert seen["rlm-mcp-front.service"] & {"00000000", "00000000000000000000000000000000"}
