"""The sandbox layer: isolated REPL kernels for runs (docs/architecture.md, "How a backend plugs in").

Owns the generic kernel sandbox over a `KernelChannel` (session.py: cells, timeouts, the sub-LM
bridge; recovery.py; the warm pool, slots, CPU shares, owner-liveness reaping; manager.py, the
engine's `SandboxFactory`), the framed protocol's checks (frames.py), the code that runs inside
(guest/) and the backends: Docker in docker/ (the only code here that imports docker-py).
Must not know about prompts or MCP. A new backend (Kubernetes pods, another runtime) is a new
package here implementing `rlm_mcp.ports.kernel.SandboxBackend` and `KernelChannel`.
"""

from rlm_mcp.sandbox.docker.image import build_image, image_dir
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.sandbox.session import KernelSandbox

__all__ = ["SandboxManager", "KernelSandbox", "build_image", "image_dir"]
