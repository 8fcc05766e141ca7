"""The sandbox layer: hardened Docker containers running a REPL kernel (see DESIGN.md §3)."""

from rlm_mcp.sandbox.image import build_image, image_dir, image_present
from rlm_mcp.sandbox.manager import SandboxManager
from rlm_mcp.sandbox.session import DockerSandbox

__all__ = ["SandboxManager", "DockerSandbox", "build_image", "image_dir", "image_present"]
