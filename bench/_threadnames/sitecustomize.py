"""Measurement only (``bench/overhead.py`` puts this directory first on the contenders' PYTHONPATH): each
Python thread gets its name as its OS thread name, so that ``/proc/PID/task/TID/comm`` tells the threads
of a trainer apart (the heartbeat, the prefetch, the collectives) when their CPU time is read."""

import ctypes
import threading

_PR_SET_NAME = 15

try:
    _libc = ctypes.CDLL("libc.so.6")
except OSError:  # not Linux: the threads keep the process's name
    _libc = None

if _libc is not None:
    _bootstrap = threading.Thread._bootstrap_inner

    def _named(self: threading.Thread) -> None:
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(self.name[:15].encode()), 0, 0, 0)
        _bootstrap(self)

    threading.Thread._bootstrap_inner = _named  # type: ignore[method-assign]
