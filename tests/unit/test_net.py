"""``edl.net``: a port kept for a later server lies outside the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

from edl import net


def test_a_port_to_keep_is_free_and_outside_the_ephemeral_range():
    low, high = net.ephemeral_range()
    rng = random.Random(0)
    for _ in range(50):
        port = net.port_to_keep(rng=rng)
        assert net.KEPT_PORT_FLOOR <= port < low or high < port <= 65535
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free: a server can listen there


def test_a_taken_port_is_passed_over(monkeypatch):
    monkeypatch.setattr(net, "ephemeral_range", lambda: (net.KEPT_PORT_FLOOR + 2, 65535))  # two candidates
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        try:
            taken.bind(("127.0.0.1", net.KEPT_PORT_FLOOR))
        except OSError:
            return  # something on this machine listens there already: the case holds as it is
        taken.listen()
        ports = {net.port_to_keep(rng=random.Random(seed)) for seed in range(20)}
    assert net.KEPT_PORT_FLOOR not in ports


def test_with_no_port_outside_the_ephemeral_range_any_free_port_will_do(monkeypatch):
    monkeypatch.setattr(net, "ephemeral_range", lambda: (1024, 65535))
    assert 0 < net.port_to_keep() <= 65535
