"""The kernel's children: zombies of `os.fork()` in user code reaped, strays killed after a timeout.

Stdlib only and import-free of the package: its source is sent ahead of kernel.py's (see
bootstrap.kernel_payload) and runs in the kernel's namespace.
"""

import gc
import os
import signal
import sys


def tracked_child_pids() -> set[int]:
    # Children a live subprocess/multiprocessing Popen will wait for: never reaped here, or
    # its wait() would lose the exit status. Only looked up when there are zombies.
    types: list[type] = []
    for module, name in (("subprocess", "Popen"), ("multiprocessing.popen_fork", "Popen")):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            types.append(cls)
    pids: set[int] = set()
    if not types:
        return pids
    classes = tuple(types)
    for obj in gc.get_objects():
        try:
            if isinstance(obj, classes) and getattr(obj, "returncode", 0) is None:
                pid = getattr(obj, "pid", None)
                if isinstance(pid, int):
                    pids.add(pid)
        except BaseException:
            continue
    return pids


def reap_zombies(kernel: int) -> None:
    """Reap exited children of the kernel that nobody waits for (os.fork() in user code).

    tini (the container's init) reaps only orphans; a zombie child of the kernel holds a pid
    until the kernel waits for it, and ~120 of them left no pid for a thread. Never raises:
    with every fd taken the scan is skipped until fds are free again.
    """
    try:
        # One syscall answers the common case: no exited child at all (nothing is reaped).
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return
    except ChildProcessError:
        return  # no children
    except BaseException:
        pass  # scan below
    try:
        zombies = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 1 and fields[0] == b"Z" and int(fields[1]) == kernel:
                zombies.append(int(entry))
        if not zombies:
            return
        tracked = tracked_child_pids()
        for pid in zombies:
            if pid not in tracked:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
    except BaseException:
        pass


def reap_strays() -> None:
    # After a timeout, stray processes (fork loops, background children) would keep eating
    # the CPU and pids: kill every other process this user owns here (never init, never us).
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
