"""Whether a process has ended: a zombie (killed, not yet reaped) has; a stopped one has not."""

from __future__ import annotations

import signal
import subprocess
import sys

from edl.procs import ended, wait_ended


def test_a_killed_process_has_ended_before_it_is_reaped_and_a_stopped_one_has_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.send_signal(signal.SIGSTOP)
        assert not wait_ended(child.pid, 0.3)  # stopped, not ended
        child.send_signal(signal.SIGKILL)
        assert wait_ended(child.pid, 10)
        assert child.returncode is None  # nobody waited for it yet: a zombie, ended all the same
    finally:
        child.kill()
        child.wait()
    assert ended(child.pid)  # reaped: no such process
