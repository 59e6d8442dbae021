"""Real processes for the collective tests: one Python process per rank, each running the test's script."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, world: int, argv: Callable[[int], list[str]], timeout: float = 100) -> list[str]:
    """Run ``script`` once per rank with ``argv(rank)``; answers each rank's output (stdout, then stderr).
    Every rank must exit 0; every process is gone when this returns."""
    procs = [subprocess.Popen([sys.executable, "-c", script, *argv(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, (_, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}: {err[-2000:]}"
    return [out + err for out, err in outs]
