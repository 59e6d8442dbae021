"""One ``edl train`` per job on a machine: the lock on the job's directory (``hold_job``), held while the
launcher lives, refuses a second one at once, naming the first."""

from __future__ import annotations

import os

import pytest

from edl.errors import UserError
from edl.launcher.local import hold_job


def test_a_second_launcher_of_a_job_is_refused_naming_the_first_and_may_start_once_it_ended(tmp_path):
    first = hold_job("j", tmp_path / "j")
    with pytest.raises(UserError, match=rf"job 'j' is already running on this machine: its edl train is pid {os.getpid()}"):
        hold_job("j", tmp_path / "j")
    hold_job("k", tmp_path / "k").close()  # another job: its own directory
    first.close()  # the first launcher ended (its process gone, however)
    again = hold_job("j", tmp_path / "j")
    again.close()
