"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe):
no extra package, no debugging port. Enough to load a page, evaluate expressions, wait for a
condition and take a screenshot.

Chromium reads NUL-terminated JSON commands on fd 3 and writes replies and events on fd 4.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
]
DEADLINE_S = 60.0


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise AssertionError("Chromium is missing: apt-get install -y chromium (.ci/run installs it)")
    return found


class Browser:
    def __init__(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="rlm-mcp-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def wire_fds() -> None:  # in the child: put the pipe ends at 3 and 4, whatever fds they got
            r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
            w = fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self._proc = subprocess.Popen(
            [chromium_path(), *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire_fds,
            close_fds=False,  # fds 3 and 4 are made in the child, after the fork
        )
        os.close(cmd_r)
        os.close(res_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")

    # -- protocol -------------------------------------------------------------------------------
    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._cmd_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + DEADLINE_S
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method} failed: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self._proc.poll() is not None:
                raise AssertionError("Chromium did not answer")
            ready, _, _ = select.select([self._res_r], [], [], left)
            if ready:
                chunk = os.read(self._res_r, 1 << 20)
                if not chunk:
                    raise AssertionError("Chromium closed the pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def page(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call(method, params, self._session)

    # -- what tests use -------------------------------------------------------------------------
    def open(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        self.page("Page.navigate", {"url": url})
        self.wait_for(ready)

    def eval(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, deadline_s: float = DEADLINE_S) -> None:
        """Wait until `expression` is truthy in the page (no fixed sleeps: re-check quickly)."""
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                if self.eval(expression):
                    return
            except AssertionError:
                pass  # navigating: the context was destroyed; try again
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression!r}")
            select.select([], [], [], 0.05)

    def screenshot(self, path: Path, width: int = 1200, height: int = 900) -> None:
        self.page(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        data = self.page("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except AssertionError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._cmd_w)
        os.close(self._res_r)
        shutil.rmtree(self._profile, ignore_errors=True)


@pytest.fixture
def browser() -> Iterator[Browser]:
    """A headless Chromium for one test (registered in tests/conftest.py), closed after it."""
    b = Browser()
    try:
        yield b
    finally:
        b.close()
