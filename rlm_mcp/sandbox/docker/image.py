"""Building the sandbox image, online (from debian:bookworm-slim) or offline (debootstrap).

Offline: `debootstrap --variant=minbase` makes a bookworm rootfs from the Debian mirror (plain
HTTP reaches it where no image registry does), the rootfs is `docker import`ed as a base tag
with the config an imported image lacks (ENV/USER/WORKDIR), and the Dockerfile in
`sandbox_images/default` is built on top with `BASE=<that tag>`; its steps are no-ops there.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlm_mcp.config import SandboxSettings
from rlm_mcp.errors import SandboxError
from rlm_mcp.sandbox.docker.docker_api import connect_sync, image_present_sync

# Versioned with the packages debootstrap includes (EXTRA_PACKAGES), so a base made without one of
# them is never built on again.
OFFLINE_BASE_TAG = "rlm-mcp-base:bookworm-0.2"
ONLINE_BASE_TAG = "debian:bookworm-slim"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Cheap, pure-Python Debian packages: regex helps the model's code; dill serializes a kept
# session's namespace inside the sandbox (engine/snapshot.py). python3 is the only must.
EXTRA_PACKAGES = ("python3-regex", "python3-dill")
_BASE_CHANGES = [
    "ENV HOME=/tmp",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "ENV LANG=C.UTF-8",
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "USER 1000:1000",
    "WORKDIR /tmp",
    'CMD ["python3"]',
]


def image_dir(name: str = "default") -> Path:
    """The folder holding the Dockerfile: a source checkout's or the installed wheel's copy."""
    here = Path(__file__).resolve()
    candidates = [
        here.parents[3] / "sandbox_images" / name,  # <repo>/rlm_mcp/sandbox/docker/image.py -> <repo>
        here.parents[2] / "sandbox_images" / name,  # wheel: rlm_mcp/sandbox_images
    ]
    for candidate in candidates:
        if (candidate / "Dockerfile").is_file():
            return candidate
    raise SandboxError(
        "The sandbox image definition (sandbox_images/default/Dockerfile) is missing from this install.",
        "Reinstall rlm-mcp.",
    )


def default_mirror() -> str:
    """The Debian mirror this machine's apt uses, else deb.debian.org."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    try:
        for line in sources.read_text().splitlines():
            if line.strip().startswith("URIs:"):
                uri = line.split(":", 1)[1].split()
                if uri:
                    return uri[0]
    except OSError:
        pass
    try:
        for line in Path("/etc/apt/sources.list").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "deb":
                urls = [p for p in parts[1:] if re.match(r"^[a-z]+://", p)]
                if urls:
                    return urls[0]
    except OSError:
        pass
    return DEFAULT_MIRROR


def build_image(
    settings: SandboxSettings,
    *,
    offline: bool,
    mirror: str | None = None,
    log: Callable[[str], None] = print,
    force: bool = False,
) -> str:
    """Build `settings.sandbox_image` and return its tag. Blocking; takes a few minutes offline."""
    client = connect_sync(timeout=600)
    tag = settings.sandbox_image
    context = image_dir()
    try:
        base = ONLINE_BASE_TAG
        if not offline and not image_present_sync(client, base) and image_present_sync(client, OFFLINE_BASE_TAG):
            # An earlier `--offline` build left its base here: build on it, without a registry,
            # so the same command works on a machine that was set up offline.
            log(f"{base} is not here; building on {OFFLINE_BASE_TAG}, made by an earlier --offline build.")
            base = OFFLINE_BASE_TAG
        elif offline:
            base = OFFLINE_BASE_TAG
            if force or not image_present_sync(client, base):
                _make_offline_base(client, base, mirror or default_mirror(), log)
            else:
                log(f"Base image {base} already present (use force to rebuild it).")
        log(f"Building {tag} from {context} on {base} ...")
        started = time.monotonic()
        _docker_build(client, context, tag, base, offline=offline, log=log)
        log(f"Built {tag} in {time.monotonic() - started:.1f} s.")
        return tag
    finally:
        client.close()


def _make_offline_base(client: Any, base: str, mirror: str, log: Callable[[str], None]) -> None:
    if shutil.which("debootstrap") is None:
        raise SandboxError(
            "debootstrap is not installed, so the offline base image cannot be made.",
            "Install it (`sudo apt-get install debootstrap`) or build online with `rlm-mcp image build`.",
        )
    with tempfile.TemporaryDirectory(prefix="rlm-mcp-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        include = ",".join(("python3", *EXTRA_PACKAGES))
        cmd = ["debootstrap", "--variant=minbase", f"--include={include}", "bookworm", str(rootfs), mirror]
        log(f"Running {' '.join(cmd)} (about a minute) ...")
        started = time.monotonic()
        _run_logged(cmd, log)
        log(f"debootstrap finished in {time.monotonic() - started:.1f} s.")
        _prepare_rootfs(rootfs)
        tarball = Path(tmp) / "rootfs.tar"
        log("Packing the root filesystem ...")
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), "."],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        repo, _, version = base.partition(":")
        log(f"Importing it as {base} ({tarball.stat().st_size / 2**20:.0f} MiB) ...")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=version or "latest", changes=_BASE_CHANGES)
        if not image_present_sync(client, base):
            raise SandboxError(f"docker import did not produce {base}.", "Check `docker images` and the daemon log.")


def _prepare_rootfs(rootfs: Path) -> None:
    """Trim caches and add the sandbox user, so the imported base needs no build step."""
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        folder = rootfs / junk
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.is_file() and entry.name not in ("lock",):
                    entry.unlink()
    passwd, group = rootfs / "etc/passwd", rootfs / "etc/group"
    if "\nsandbox:" not in "\n" + passwd.read_text():
        with passwd.open("a") as fh:
            fh.write("sandbox:x:1000:1000:rlm-mcp sandbox:/tmp:/usr/sbin/nologin\n")
    if "\nsandbox:" not in "\n" + group.read_text():
        with group.open("a") as fh:
            fh.write("sandbox:x:1000:\n")


def _run_logged(cmd: list[str], log: Callable[[str], None]) -> None:
    """Run a slow command, relaying a progress line every ~50 lines of its output."""
    tail: list[str] = []
    # `with`: the pipe is closed and the process reaped even when `log` raises.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for count, line in enumerate(proc.stdout):
            line = line.rstrip()
            tail = (tail + [line])[-20:]
            if line.startswith(("I: Retrieving", "I: Validating")) and count % 40:
                continue
            if line.startswith("I: "):
                log(f"  {line[3:]}")
    if proc.returncode != 0:
        raise SandboxError(
            f"{cmd[0]} failed (exit {proc.returncode}): " + " | ".join(tail[-5:]),
            "Check that the Debian mirror is reachable, or pass another one.",
        )


def _docker_build(
    client: Any, context: Path, tag: str, base: str, *, offline: bool, log: Callable[[str], None]
) -> None:
    stream = client.api.build(
        path=str(context),
        tag=tag,
        buildargs={"BASE": base},
        rm=True,
        forcerm=True,
        pull=False,
        decode=True,
        labels={"rlm-mcp.image": "sandbox"},
    )
    for chunk in stream:
        if "error" in chunk:
            fix = "Try `rlm-mcp image build --offline`." if not offline else "See the Docker daemon log."
            raise SandboxError(f"docker build failed: {str(chunk['error']).strip()}", fix)
        text = chunk.get("stream")
        if isinstance(text, str) and text.strip().startswith("Step "):
            log("  " + text.strip())
        elif "status" in chunk and "progress" not in chunk:
            log("  " + json.dumps(chunk)[:200])
