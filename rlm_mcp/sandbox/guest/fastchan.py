"""The kernel's end of the fast channel (the host's end and the ordering: rlm_mcp/sandbox/docker/fastchan.py).

Stdlib only and import-free of the package: its source is sent ahead of kernel.py's (see
bootstrap.kernel_payload) and runs in the kernel's namespace.
"""

import socket


def open_fast_channel(path: str, token: str, timeout: float) -> tuple[socket.socket | None, bool, str | None]:
    """Connect to the host's socket at `path`, present `token` and wait for the host's one-byte
    acknowledgement, all within about `timeout` seconds.

    Returns (sock, ok, why): ok True when the host accepted (frames go over `sock` from now on);
    else `why` says what failed, and `sock`, when the connection was made, must be kept open
    but unused for the kernel's life (closing it would tell the host the kernel ended).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except OSError as exc:
        sock.close()
        return None, False, f"could not connect to {path}: {exc}"
    try:
        sock.sendall(token.encode("ascii"))
        ack = sock.recv(1)
    except OSError as exc:
        return sock, False, f"no acknowledgement from the host: {exc}"
    if ack != b"\x01":
        return sock, False, "the host refused the connection"
    sock.settimeout(None)
    return sock, True, None
