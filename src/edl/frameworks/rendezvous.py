"""The rendezvous' sockets, framework-neutral: waiting for rank 0's store, and Nagle's algorithm off."""

from __future__ import annotations

import os
import socket
import time

from edl.errors import CollectiveError


def store_sockets(host: str, port: int) -> list[int]:
    """This process's file descriptors of TCP connections to the store at ``host:port``."""
    peer = (socket.gethostbyname(host), port)
    out: list[int] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out  # no /proc (not Linux): the group still forms, with Nagle's delays
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))  # a second descriptor of the same socket
        except OSError:
            continue  # closed meanwhile, or not ours to read
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET and s.getpeername() == peer:
                out.append(int(name))
        except OSError:
            pass  # not connected
        finally:
            s.close()  # closes the duplicate only
    return out


def no_delay(fds: list[int]) -> None:
    """Turn Nagle's algorithm off on these TCP sockets."""
    for fd in fds:
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # closed since it was found
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # no longer a TCP socket: the number was reused
        finally:
            s.close()


def wait_listening(host: str, port: int, deadline: float) -> None:
    """Wait for rank 0's store to listen: Paddle's store client retries every 3 s when the server is
    not up yet (PyTorch's backs off too); probing the port ourselves keeps the rendezvous in the tens
    of milliseconds."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise CollectiveError(f"rendezvous {host}:{port} did not come up")
