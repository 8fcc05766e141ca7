"""The Docker backend: the only code that talks to a Docker engine (docs/architecture.md).

Owns the Docker client and the one recognition of Docker failures (`faults.py`, `docker_api.py`),
the hardened container configuration, the image, CPU quota updates, and `KernelContainer`: a
container whose attach stream carries the kernel's framed protocol.
Must not know about runs, prompts or the engine.
"""
