"""Owner liveness on one host (issue 19 item 3): who may reap a stopped sandbox."""

from __future__ import annotations

import os
import subprocess
import sys

from rlm_mcp.sandbox.liveness import LABEL_HOST, LABEL_PID, LABEL_STARTED, ProcessLiveness, process_started


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_owner_is_never_gone_however_long_it_has_been_stopped() -> None:
    liveness = ProcessLiveness()
    assert not liveness.owner_gone(liveness.stamp(), idle_s=10**9)


def test_an_exited_owner_on_this_host_is_gone_at_once() -> None:
    liveness = ProcessLiveness()
    labels = {**liveness.stamp(), LABEL_PID: str(exited_pid())}
    assert liveness.owner_gone(labels, idle_s=0)


def test_a_reused_pid_is_told_apart_by_its_start_time() -> None:
    liveness = ProcessLiveness()
    labels = dict(liveness.stamp())
    assert labels[LABEL_STARTED] == process_started(os.getpid())
    labels[LABEL_STARTED] = "1"  # this pid, but a process that started at boot: not us
    assert liveness.owner_gone(labels, idle_s=0)


def test_another_hosts_or_an_unstamped_sandbox_waits_for_the_grace_period() -> None:
    liveness = ProcessLiveness(foreign_grace_s=60)
    foreign = {**liveness.stamp(), LABEL_HOST: "some-other-host"}
    for labels in (foreign, {}):
        assert not liveness.owner_gone(labels, idle_s=59)
        assert liveness.owner_gone(labels, idle_s=60)
