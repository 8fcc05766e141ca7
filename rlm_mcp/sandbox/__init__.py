"""The sandbox layer: hardened Docker containers running a REPL kernel (DESIGN §3).

Owns the image, hardening, the warm pool, the in-container kernel and its framed stdio
protocol, context loading, per-cell timeouts, orphan reaping, and the one mapping of Docker
failures to user-facing errors (`docker_api.docker_errors`).
Must not know about prompts or MCP. A new backend (Kubernetes pods, remote engines) is a new
factory here whose sandboxes satisfy the engine's `Sandbox` protocol (rlm_mcp/ports/).
"""

from rlm_mcp.sandbox.docker.image import build_image, image_dir
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.sandbox.session import KernelSandbox

__all__ = ["SandboxManager", "KernelSandbox", "build_image", "image_dir"]
