"""A real S3 server for the plane's tests and ``./dev cluster``: MinIO, built from its Go module
(``tools/minio``, see ``build.py``), on this machine only, with its data in a throwaway directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.plane import build
from tests.plane.procs import free_port, stop_pid, wait_until_answers

ACCESS_KEY = "edl-test"
SECRET_KEY = "edl-test-secret"  # MinIO wants at least 8 characters
REGION = "us-east-1"


class MinioServer:
    """``minio server`` on ``address`` (loopback, or a plane's bridge where its real nodes' pods reach
    it); ``stop()``/``start()`` make an outage on the same port."""

    def __init__(self, root: Path, port: int | None = None, address: str = "127.0.0.1") -> None:
        self.root = root
        self.port = port or free_port()
        self.address = address
        self.endpoint = f"http://{address}:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                    "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "MinioServer":
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        log = (self.root / "minio.log").open("ab")
        env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
               "MINIO_REGION": REGION, "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CI_CD": "1"}
        self.proc = subprocess.Popen([str(build.MINIO.path()), "server", str(self.root / "data"), "--quiet",
                                      "--address", f"{self.address}:{self.port}"],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        log.close()
        wait_until_answers(self.proc, f"{self.endpoint}/minio/health/ready", timeout_s, "minio",
                           self.root / "minio.log")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc.pid, 10)
            self.proc = None

    def client(self):
        from minio import Minio

        return Minio(f"{self.address}:{self.port}", access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False,
                     region=REGION)
