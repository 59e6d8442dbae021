"""A loopback TCP proxy for tests that must see or steer what edl's own clients send, unchanged."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forwards each connection to the port ``upstream`` names when it is opened (set it to steer new
    connections, as a Service's connection tracking keeps open ones where they were), and counts the
    bytes that come back from upstream (responses: headers and bodies)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(("127.0.0.1", self.upstream), timeout=30)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(65536):
                if count:
                    with self._lock:
                        self.received += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def take(self) -> int:
        """Bytes received since the last call."""
        with self._lock:
            n, self.received = self.received, 0
            return n

    def close(self) -> None:
        self.listener.close()
