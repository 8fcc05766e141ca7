"""The REPL kernel that runs INSIDE the sandbox container (stdlib only, Python 3.11).

This file is not imported by the host: its source is sent over the container's stdin by the
bootstrap (see bootstrap.py) and exec'd there. It talks frames (4-byte big-endian length +
UTF-8 JSON) on private copies of the original stdin/stdout; fd 0 becomes /dev/null and fds
1/2 become capture pipes, so user output cannot corrupt the protocol by accident. When `init`
offers the fast channel (fastchan.py) and it connects, frames go both ways over that socket
instead; stdin is read for the kernel's whole life either way (its EOF: the host is gone).

Threads: user code runs on the main thread (SIGINT, our timeout tool, is delivered only
there); a reader thread takes host frames; two threads drain the fd-level capture pipes.
"""

import fcntl
import json
import linecache
import os
import queue
import signal
import struct
import sys
import threading
import time

if "read_answer" not in globals():
    # Imported on the host (tests, linters). In the container, bootstrap.kernel_payload() has
    # already run answer_rules.py's source ahead of this file.
    from rlm_mcp.sandbox.guest.answer_rules import read_answer
if "open_fast_channel" not in globals():
    from rlm_mcp.sandbox.guest.fastchan import open_fast_channel
if "start_host_watch" not in globals():
    from rlm_mcp.sandbox.guest.hostwatch import start_host_watch
if "Capture" not in globals():
    from rlm_mcp.sandbox.guest.capture import Capture, TextSink, clip, drain_pipe, read_pipe
if "reap_zombies" not in globals():
    from rlm_mcp.sandbox.guest.children import reap_strays, reap_zombies
if "encode_frame" not in globals():
    from rlm_mcp.sandbox.guest.frames import Waiter, encode_frame, fill, read_payload
if "cell_error" not in globals():
    from rlm_mcp.sandbox.guest.errors import cell_error, cell_error_as_trained
if "make_namespace" not in globals():
    from rlm_mcp.sandbox.guest.namespace import list_variables, make_namespace


class Kernel:
    def __init__(self):
        self.pid = os.getpid()
        # Before any thread (fork) and before fd 0 moves: the kernel's reader cannot end it while
        # a cell holds the GIL in C code; the watch, a process of its own, can (hostwatch.py).
        start_host_watch(0)
        # Private protocol fds: the original stdin/stdout, moved out of user reach.
        self.proto_in = os.dup(0)
        self.proto_out = os.dup(1)
        for fd in (self.proto_in, self.proto_out):
            try:  # bigger pipes: a large context or result crosses in fewer wake-ups
                fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ (Linux); refused where not a pipe
            except OSError:
                pass
        self.diag = os.dup(2)
        self.chan_sock = None  # the fast channel's socket, once connected (kept open for life)
        for fd in (self.proto_in, self.proto_out, self.diag):
            os.set_inheritable(fd, False)
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        os.set_inheritable(self.devnull, False)
        self.out_cap = Capture(1 << 20)
        self.err_cap = Capture(1 << 20)
        self.pipes = {}
        # Bytes leave a capture pipe only under this lock, straight into the capture, so at
        # the end of a cell every byte is either still in the pipe or already captured.
        self.capture_lock = threading.Lock()
        for fd, cap in ((1, self.out_cap), (2, self.err_cap)):
            r, w = os.pipe()
            os.set_inheritable(r, False)
            os.set_inheritable(w, False)
            os.set_blocking(r, False)
            self.pipes[fd] = (r, w)
            threading.Thread(
                target=drain_pipe, args=(r, cap, self.capture_lock), daemon=True, name=f"capture-{fd}"
            ).start()
        # One stdin/stdout/stderr object each for the kernel's whole life: a thread of user code
        # may be inside print() holding only a borrowed reference to sys.stdout, so replacing the
        # object per cell freed it under that thread (SIGSEGV). Objects user code installed and
        # we replace are kept alive too, for the same reason.
        self.stdin_obj = open(os.devnull)  # noqa: SIM115 - sys.stdin for the kernel's whole life
        self.out_sink = TextSink(self.out_cap, 1)
        self.err_sink = TextSink(self.err_cap, 2)
        self.retired = []
        self._heal_fds()
        self.write_lock = threading.Lock()
        # SimpleQueue: put and get in C, the main thread's wake-up one lock release (queue.Queue
        # runs a Python Condition on both sides of every frame the main thread handles).
        self.tasks = queue.SimpleQueue()
        self.waiters = {}
        self.waiters_lock = threading.Lock()
        self.next_id = 0
        self.in_cell = False
        self.interrupted = False
        self.show_vars_from = None  # a training cell's starting names (SHOW_VARS lists those)
        self.main_ident = threading.main_thread().ident or 0  # SIGINT goes to the thread running cells
        self.max_batch = 512
        self.answer_max = 8 << 20
        self.ns = {}
        self.contexts = {}
        os.register_at_fork(after_in_child=self._after_fork_child)

    # -- fds -------------------------------------------------------------------------------
    def _heal_fds(self):
        """Point fd 0 at /dev/null and fds 1/2 at the capture pipes (again, if user code moved them)."""
        # No open() here: user code may hold every fd the limit allows (dup2 needs none).
        os.dup2(self.devnull, 0)
        os.dup2(self.pipes[1][1], 1)
        os.dup2(self.pipes[2][1], 2)
        for name, obj in (("stdin", self.stdin_obj), ("stdout", self.out_sink), ("stderr", self.err_sink)):
            for attr in (name, f"__{name}__"):
                current = getattr(sys, attr, None)
                if current is not obj:
                    if current is not None and len(self.retired) < 64:
                        self.retired.append(current)
                    setattr(sys, attr, obj)

    def _on_sigint(self, signum, frame):
        # Runs on the main thread between bytecodes: only user code may be interrupted, so a
        # late signal can never cut a frame the kernel is writing in half.
        if self.in_cell:
            raise KeyboardInterrupt("cell interrupted")

    def _after_fork_child(self):
        # A forked child (os.fork, multiprocessing) must never speak the protocol.
        fds = {self.proto_in, self.proto_out}
        if self.chan_sock is not None:
            fds.add(self.chan_sock.detach())
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.proto_in = self.proto_out = -1
        self.chan_sock = None

    def _settle_capture(self):
        """Take what user code wrote to fds 1/2 into the captures (nothing can be in flight)."""
        with self.capture_lock:
            read_pipe(self.pipes[1][0], self.out_cap)
            read_pipe(self.pipes[2][0], self.err_cap)

    # -- protocol --------------------------------------------------------------------------
    def send(self, obj):
        frame = encode_frame(obj)
        with self.write_lock:
            if self.proto_out < 0:
                raise RuntimeError("this process is a fork of the kernel and has no host connection")
            view = memoryview(frame)
            try:
                while view:
                    n = os.write(self.proto_out, view)
                    view = view[n:]
            except OSError:
                os._exit(70)  # the host is gone: nothing left to do

    def reader(self, fd):
        """Take the host's frames from `fd` (stdin's copy, or the fast channel's socket)."""
        buf = bytearray()
        try:
            while True:
                fill(fd, buf, 4)
                (size,) = struct.unpack_from(">I", buf)
                fill(fd, buf, 4 + size)
                msg = json.loads(buf[4 : 4 + size])
                del buf[: 4 + size]
                kind = msg.get("type")
                if kind == "load_context":
                    msg["raw"] = read_payload(fd, buf, int(msg["bytes"]))
                if kind == "lm_result":
                    with self.waiters_lock:
                        waiter = self.waiters.pop(msg.get("id"), None)
                    if waiter is not None:
                        waiter.answer(msg)
                elif kind == "interrupt":
                    if self.in_cell:
                        self.interrupted = True
                        signal.pthread_kill(self.main_ident, signal.SIGINT)
                else:
                    self.tasks.put(msg)
        except EOFError:
            # stdin (or the channel) closed: the host died or its stream dropped (75 tells the host which).
            os._exit(75)
        except BaseException:
            # the fds were destroyed: end the kernel.
            os._exit(0)

    # -- sub-LM calls ----------------------------------------------------------------------
    def lm_call(self, kind, prompts, model):
        if model is not None and not isinstance(model, str):
            raise TypeError("model must be a str or None")
        prompts = [
            p if isinstance(p, str) else json.dumps(p, default=str) if isinstance(p, (list, dict)) else str(p)
            for p in prompts
        ]
        if len(prompts) > self.max_batch:
            raise ValueError(f"at most {self.max_batch} prompts per batched call (got {len(prompts)})")
        if not prompts:
            return []
        waiter = Waiter()
        with self.waiters_lock:
            self.next_id += 1
            rid = self.next_id
            self.waiters[rid] = waiter
        # `main`: the cell's own code waits (the host pauses the cell clock only for that).
        main = threading.current_thread() is threading.main_thread()
        self.send({"type": "lm_request", "id": rid, "kind": kind, "prompts": prompts, "model": model, "main": main})
        msg = waiter.wait()
        if msg.get("error"):
            raise RuntimeError(str(msg["error"]))
        results = msg.get("results")
        if not isinstance(results, list) or len(results) != len(prompts):
            raise RuntimeError("the host answered a sub-call with a malformed result")
        return [str(r) for r in results]

    # -- tasks -----------------------------------------------------------------------------
    def handle_init(self, msg):
        cap = int(msg.get("output_bytes") or (1 << 20))
        self.out_cap.resize(cap)
        self.err_cap.resize(cap)
        self.max_batch = int(msg.get("max_batch") or 512)
        self.answer_max = int(msg.get("answer_max_bytes") or (8 << 20))
        self.ns = make_namespace(self)
        self._heal_fds()
        # Whether a kept session's namespace can be snapshotted here (dill in the image): the host
        # refuses keep_session before a run when it cannot.
        import importlib.util

        snapshots = importlib.util.find_spec("dill") is not None
        ready = {"type": "ready", "id": msg.get("id"), "pid": os.getpid(), "python": sys.version.split()[0]}
        channel, why = self._open_channel(msg)
        self.send({**ready, "snapshots": snapshots, "channel": channel, "channel_error": why})

    def _open_channel(self, msg):
        """Connect the fast channel `init` offers; from the `ready` frame on, write there."""
        path, token = msg.get("channel_path"), msg.get("channel_token")
        if not isinstance(path, str) or not isinstance(token, str):
            return "attach", None
        sock, ok, why = open_fast_channel(path, token, float(msg.get("channel_timeout_s") or 2.0))
        self.chan_sock = sock
        if not ok or sock is None:
            return "attach", why
        fd = sock.fileno()
        threading.Thread(target=self.reader, args=(fd,), daemon=True, name="chan-reader").start()
        with self.write_lock:
            self.proto_out = fd
        return "socket", None

    def handle_load(self, msg):
        idx = int(msg["index"])
        raw = msg.pop("raw")
        text = raw.decode("utf-8", "replace")
        del raw
        try:
            value = json.loads(text) if msg.get("format") == "json" else text
            error = None
        except ValueError as exc:
            value, error = text, f"context_{idx} is not valid JSON ({exc}); loaded as text"
        del text
        self.ns[f"context_{idx}"] = value
        if idx == 0:
            self.ns["context"] = value
        self.send({"type": "context_loaded", "id": msg.get("id"), "index": idx, "error": error})

    def handle_exec(self, msg):
        self.cell_no = getattr(self, "cell_no", 0) + 1
        filename = f"<cell-{self.cell_no}>"
        code = msg.get("code") or ""
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        self._heal_fds()
        self._reap_zombies()
        self._settle_capture()
        self.out_cap.take()  # output printed between cells (background threads) is not this cell's
        self.err_cap.take()
        error = trained_error = None
        variables_at_start = self._variables()  # what a cell that raises reports, as in training
        # Training's worker ran each cell on a copy of the namespace, kept only if the cell ended
        # without an exception, and its SHOW_VARS() saw the namespace as the cell found it: with
        # `training_cell`, a raising cell's bindings are undone and SHOW_VARS() lists those names.
        snapshot = dict(self.ns) if msg.get("training_cell") else None
        self.show_vars_from = snapshot
        started = time.perf_counter()
        self.interrupted = False
        try:
            self.in_cell = True
            try:
                exec(compile(code, filename, "exec"), self.ns)
            finally:
                self.in_cell = False
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: report, never end
            self.in_cell = False
            error = cell_error(exc, 2 * self.out_cap.half)
            trained_error = cell_error_as_trained(exc, filename, 2 * self.out_cap.half)
            del exc  # its traceback holds the cell's frames: drop them before restoring
            if snapshot is not None and not self.interrupted:
                self.ns.clear()
                self.ns.update(snapshot)
        snapshot = self.show_vars_from = None
        duration = time.perf_counter() - started
        if os.getpid() != self.pid:
            os._exit(0)  # a forked child finished the cell: it must not answer the host
        interrupted = self.interrupted
        if interrupted:
            self._reap_strays()
        self._reap_zombies()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        self._settle_capture()
        try:
            answer, variables = self._answer(), self._variables()
        except BaseException as exc:  # never let a result-building bug end the kernel
            answer, variables = None, []
            error = (error or "") + f"\n(the kernel could not read the namespace: {type(exc).__name__})"
        result = {
            "type": "exec_result",
            "id": msg.get("id"),
            "stdout": self.out_cap.take(),
            "stderr": self.err_cap.take(),
            "error": error,
            "answer": answer,
            "variables": variables,
            "trained_error": trained_error,
            "variables_at_start": variables_at_start if error else None,
            "duration": duration,
            "interrupted": interrupted,
        }
        self.send(result)

    def _reap_zombies(self):
        reap_zombies(self.pid)

    def _reap_strays(self):
        reap_strays()

    def _answer(self):
        return read_answer(self.ns, self.answer_max)

    def _variables(self):
        return list_variables(self.ns)

    def main(self):
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        threading.Thread(target=self.reader, args=(self.proto_in,), daemon=True, name="proto-reader").start()
        while True:
            msg = None
            try:
                msg = self.tasks.get()
                kind = msg.get("type")
                if kind == "exec":
                    self.handle_exec(msg)
                elif kind == "load_context":
                    self.handle_load(msg)
                elif kind == "init":
                    self.handle_init(msg)
                elif kind == "shutdown":
                    os._exit(0)
                else:
                    self.send({"type": "log", "id": msg.get("id"), "message": f"unknown frame {kind!r}"})
            except KeyboardInterrupt:
                # A late interrupt landed in kernel code between cells: ignore it.
                continue
            except MemoryError:
                self.send({"type": "log", "id": 0, "message": "kernel out of memory"})
                os._exit(71)
            except Exception as exc:
                # The kernel's own bookkeeping failed (e.g. no fd left for it): say so, keep serving.
                self._report_failure(msg, exc)

    def _report_failure(self, msg, exc):
        text = f"the sandbox kernel could not handle this request: {type(exc).__name__}: {clip(str(exc), 2000)}"
        if isinstance(msg, dict) and msg.get("type") == "exec":
            self.send(
                {
                    "type": "exec_result",
                    "id": msg.get("id"),
                    "stdout": "",
                    "stderr": "",
                    "error": text,
                    "answer": None,
                    "variables": [],
                    "duration": 0.0,
                }
            )
        else:
            self.send({"type": "log", "id": 0, "message": text})


if __name__ == "__rlm_kernel__":
    Kernel().main()
