"""Processes on this machine: whether one has ended (a zombie has; a stopped one has not), which process a
pid is, and the exit code one leaves for a launcher that adopted it."""

from __future__ import annotations

import signal
import subprocess
import sys

from edl.procs import EXIT_FILE_ENV, ended, record_exit, recorded_exit, same_process, start_ticks, wait_ended


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


def test_a_pid_is_the_same_process_only_with_its_start_and_only_while_it_runs():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = start_ticks(child.pid)
        assert ticks is not None and same_process(child.pid, ticks)
        assert not same_process(child.pid, ticks + 1)  # another process that got the pid later
        assert not same_process(child.pid, None) and not same_process(None, ticks)
        child.kill()
        assert wait_ended(child.pid, 10)
        assert not same_process(child.pid, ticks) and start_ticks(child.pid) is None  # killed, not reaped: ended
    finally:
        child.kill()
        child.wait()


def test_an_exit_code_is_left_where_the_environment_says_and_read_back(tmp_path, monkeypatch):
    path = tmp_path / "t1.exit"
    assert recorded_exit(path) is None  # none left: killed, or still running
    monkeypatch.delenv(EXIT_FILE_ENV, raising=False)
    record_exit(3)
    assert not path.exists()
    monkeypatch.setenv(EXIT_FILE_ENV, str(path))
    record_exit(3)
    assert recorded_exit(path) == 3
    path.write_text("garbage")
    assert recorded_exit(path) is None
