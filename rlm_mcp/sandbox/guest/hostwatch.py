"""The host watch: a process of its own in the container that ends the kernel once the host is gone.

The kernel's reader thread ends the kernel when its stdin closes (the host died, or its stream
to the container dropped), but only when that thread can run: a cell looping in C code that
holds the GIL (`sum(range(10**15))`) keeps it from running, and the sandbox would spin at its
CPU quota until some server on the daemon reaped it. The watch is the kernel's grandchild
(reparented to the container's init, so user code's `os.wait()` never sees it), started before
any thread or user code; it waits, in `poll`, for the hang-up of the kernel's stdin without
reading it, gives the kernel's own reader `grace_s` to end it (exit status 75 tells the host which
end it was), then SIGKILLs the kernel. The kernel is the init's only child, so the container stops.

User code runs as the same user and could kill the watch; that only brings back the reaper's
cleanup, not a way out of the sandbox.

Stdlib only and import-free of the package: its source is sent ahead of kernel.py's (see
bootstrap.kernel_payload) and runs in the kernel's namespace.
"""

import os
import select
import signal
import time

HOST_GONE_GRACE_S = 2.0
_HUNG_UP = select.POLLHUP | select.POLLERR | select.POLLRDHUP


def start_host_watch(fd: int, grace_s: float = HOST_GONE_GRACE_S) -> None:
    """Start the watch of `fd` (the host's end of stdin) for this process; call it while the
    process has one thread."""
    kernel = os.getpid()
    # A pidfd names this kernel and no later process with its pid, and says when it ends. Opened
    # here, before the fork: the kernel may end (its host gone at once) before the watch runs.
    # An engine without pidfds (old gVisor): the container's end ends the watch instead.
    try:
        pidfd: int | None = os.pidfd_open(kernel)
    except OSError:
        pidfd = None
    first = os.fork()
    if first:
        if pidfd is not None:
            os.close(pidfd)  # the watch's alone
        os.waitpid(first, 0)  # it leaves at once: the watch is its child, not the kernel's
        return
    try:
        if os.fork() == 0:
            _watch(fd, kernel, pidfd, grace_s)
    finally:
        os._exit(0)


def _watch(fd: int, kernel: int, pidfd: int | None, grace_s: float) -> None:
    os.setsid()  # out of the kernel's process group: a signal meant for the kernel's group misses it
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (1, 2):  # hold no end of the kernel's output streams
        os.dup2(devnull, target)
    os.close(devnull)
    poller = select.poll()
    # No POLLIN: the frames on a pipe are the kernel's to read; a hang-up is reported regardless.
    poller.register(fd, select.POLLRDHUP)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    while True:
        events = dict(poller.poll())
        if pidfd is not None and events.get(pidfd):
            return  # the kernel ended
        mask = events.get(fd, 0)
        if mask & select.POLLNVAL:
            return  # nothing to watch: leave the kernel to its reader
        if mask & _HUNG_UP:
            break
    if pidfd is None:
        time.sleep(grace_s)
        try:
            os.kill(kernel, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    poller.unregister(fd)
    if not poller.poll(int(grace_s * 1000)):  # the kernel's reader did not end it in time
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
