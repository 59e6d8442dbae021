"""``edl master`` and ``edl trainer`` as a container's first process (PID 1), where the kernel drops any
signal the process has no handler for: a pod deleted while they still import must not wait out its grace
period (a real kubelet's SIGTERM would be ignored)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                 reason="needs root and unshare for a PID namespace")]

SCRIPT = """
import time
{setup}
print("ready", flush=True)
time.sleep(30)
"""


def as_init(setup: str) -> subprocess.Popen:
    """Python as PID 1 of a new PID namespace, ``setup`` run first; its host PID is the child of unshare's fork."""
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c",
                             SCRIPT.format(setup=setup)], stdout=subprocess.PIPE, text=True)


def init_pid(unshare: subprocess.Popen) -> int:
    children = open(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read().split()
    return int(children[0])


@pytest.mark.parametrize("setup,ends", [
    ("from edl.procs import end_on_sigterm_as_init; end_on_sigterm_as_init()", True),
    ("", False),  # the kernel's rule itself: without a handler, PID 1 ignores SIGTERM
])
def test_sigterm_ends_an_init_process_that_has_not_set_its_own_handler_yet(setup, ends):
    proc = as_init(setup)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.kill(init_pid(proc), signal.SIGTERM)
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        assert (code is not None) == ends
        if ends:
            assert code == 143
    finally:
        proc.kill()
        proc.wait()
