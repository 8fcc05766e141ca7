"""The bootstrap: the container's command, which reads the kernel source from stdin and runs it.

It reads a decimal length line and then exactly that many bytes with `os.read(0, ...)`;
`sys.stdin` is never touched, because its buffer would read ahead and swallow the frames that
follow the source. So any image with python3 (3.11+) can be a sandbox image.
"""

from __future__ import annotations

import functools
from importlib import resources

# Kept tiny and dependency-free; it exits with status 3 if stdin closes early.
BOOTSTRAP = (
    "import os\n"
    "b=b''\n"
    "while not b.endswith(b'\\n'):\n"
    " c=os.read(0,1)\n"
    " if not c: raise SystemExit(3)\n"
    " b+=c\n"
    "n=int(b)\n"
    "s=bytearray()\n"
    "while len(s)<n:\n"
    " c=os.read(0,n-len(s))\n"
    " if not c: raise SystemExit(3)\n"
    " s+=c\n"
    "exec(compile(bytes(s),'<rlm-kernel>','exec'),{'__name__':'__rlm_kernel__'})\n"
)


def command() -> list[str]:
    """The container command: isolated mode (no PYTHON* env, no user site), no .pyc writes."""
    return ["python3", "-I", "-B", "-c", BOOTSTRAP]


@functools.cache
def kernel_payload() -> bytes:
    """What the host writes first on the container's stdin: length line + kernel source, which
    starts with the answer rules (answer_rules.py, shared with the host's tests), the fast
    channel's kernel end (fastchan.py), the host watch (hostwatch.py), the output capture
    (capture.py), the reaping of the kernel's children (children.py), the frames' bytes (frames.py),
    a cell's error text (errors.py) and the cell namespace (namespace.py)."""
    package = resources.files("rlm_mcp.sandbox.guest")
    source = b"\n".join(
        package.joinpath(name).read_bytes()
        for name in (
            "answer_rules.py",
            "fastchan.py",
            "hostwatch.py",
            "capture.py",
            "children.py",
            "frames.py",
            "errors.py",
            "namespace.py",
            "kernel.py",
        )
    )
    return b"%d\n" % len(source) + source
