"""Small network helpers shared by the launcher and trainers."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default ip_local_port_range, where /proc cannot be read.
EPHEMERAL_DEFAULT = (32768, 60999)
# Below this, ports belong to services (the master's 8470, MinIO's 9000, ...): a port kept for later is not.
KEPT_PORT_FLOOR = 10000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now (another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections and ``bind(0)`` (``ip_local_port_range``)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def port_to_keep(host: str = "127.0.0.1", rng: random.Random | None = None, tries: int = 64) -> int:
    """A TCP port free now, for a server that starts later (a trainer's store, for the generation it may
    lead): outside the kernel's ephemeral range, so no outgoing connection of this host takes it meanwhile,
    as one of ``free_port`` can be (Gloo's pairs, S3 and the master's connections come from that range;
    Paddle's store aborts the trainer when its port is taken). Where no such port is free: ``free_port``."""
    low, high = ephemeral_range()
    spans = [r for r in (range(KEPT_PORT_FLOOR, low), range(high + 1, 65536)) if r]
    rng = rng or random.Random()
    for _ in range(tries if spans else 0):
        port = rng.choice(rng.choices(spans, weights=[len(r) for r in spans])[0])  # uniform over both spans
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    return free_port(host)
