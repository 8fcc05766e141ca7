"""The HTTP listening socket, bound before anything says "serving": a port already in use or an
address this machine does not have is one line naming the cause and the fix, not a traceback
after the server announced itself."""

from __future__ import annotations

import errno
import socket

from rlm_mcp.errors import BadArgumentError


def bind_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn (`Server.serve(sockets=[...])`); the caller closes it."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BadArgumentError(
            f"Cannot listen on {host}: the name does not resolve ({exc.strerror}).",
            "Give an address of this machine with --host or RLM_MCP_HOST (default 127.0.0.1).",
        ) from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise _bind_error(host, port, exc) from exc
    return sock


def _bind_error(host: str, port: int, exc: OSError) -> BadArgumentError:
    change = "choose another with --port N or RLM_MCP_PORT"
    if exc.errno == errno.EADDRINUSE:
        return BadArgumentError(
            f"Port {port} on {host} is already in use (another rlm-mcp or another server listens there).",
            f"Stop that process (`ss -ltnp 'sport = :{port}'` names it), or {change}.",
        )
    if exc.errno == errno.EACCES:
        return BadArgumentError(
            f"Not allowed to listen on port {port} on {host} (ports below 1024 need privileges).",
            f"Use a port above 1024: {change}.",
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return BadArgumentError(
            f"Cannot listen on {host}: it is not an address of this machine.",
            "Give one of this machine's addresses with --host or RLM_MCP_HOST (default 127.0.0.1).",
        )
    return BadArgumentError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}.", f"Check --host, or {change}.")
