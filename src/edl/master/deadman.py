"""The dead-man switch: a job whose launcher has gone silent ends itself.

The launcher (``edl train``, ``edl launch``) beats the master every poll. A launcher killed
without its cleanup (SIGKILL, a KFP terminate that takes its process tree, a lost node) beats
no more, and on Kubernetes nothing may delete what it created: the garbage collector follows
owners, and a step's pod that failed stays. So the master watches the beats: no beat for
``timeout_s`` after the last one (or after the master's own start, so that a restarted master,
or a retried launcher adopting the job, gets the full timeout) abandons the job. Trainers are
told on their next exchange and leave; the master serves ``linger_s`` more (long enough for
every trainer's next heartbeat and the sidecar's next look), then exits.

Pure and clock-injected: ``Job`` holds one and passes ``now``; states move
``WATCHING -> ABANDONED -> OVER``, never back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

LINGER_S = 10.0  # serving on after the abandonment, so that trainers and the sidecar hear of it


class LauncherState(str, Enum):
    WATCHING = "watching"  # beats come (or the timeout since the last one has not passed)
    ABANDONED = "abandoned"  # silent past the timeout: everyone is told to leave
    OVER = "over"  # abandoned ``linger_s`` ago: the master exits


@dataclass
class DeadMan:
    timeout_s: float
    last_beat: float  # the last beat, or the master's start
    linger_s: float = LINGER_S
    abandoned_at: float | None = None

    def beat(self, now: float) -> None:
        """The launcher is alive. Too late once abandoned: trainers are already leaving."""
        if self.abandoned_at is None:
            self.last_beat = max(self.last_beat, now)

    def silent_s(self, now: float) -> float:
        return now - self.last_beat

    def state(self, now: float) -> LauncherState:
        """Where the switch stands at ``now``; the first look past the timeout abandons the job."""
        if self.abandoned_at is None:
            if self.silent_s(now) < self.timeout_s:
                return LauncherState.WATCHING
            self.abandoned_at = now
        return LauncherState.OVER if now - self.abandoned_at >= self.linger_s else LauncherState.ABANDONED

    @property
    def abandoned(self) -> bool:
        return self.abandoned_at is not None
