"""A container registry on loopback: Debian's ``docker-registry`` (the CNCF Distribution server)
over one storage directory in the build cache.

The image build (``images.py``) pushes into the storage through a writable registry; each plane
then serves it read-only on its own port (several planes may share the storage), so the images
are built once and pulled by every plane's kubelets. Plain HTTP: a registry on 127.0.0.0/8 is
one that Docker and containerd treat as insecure by default, and so does the kubelet here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.plane.procs import free_port, stop_pid, wait_until_answers


class RegistryError(RuntimeError):
    pass


def registry_binary() -> str:
    found = shutil.which("docker-registry")
    if found is None:
        raise RegistryError("docker-registry is not installed (Debian's docker-registry package; ./dev installs it)")
    return found


def write_config(storage: Path, path: Path, read_only: bool, addr: str = "127.0.0.1:0") -> Path:
    """The registry's configuration over ``storage``, written to ``path``."""
    cfg = {"version": 0.1, "log": {"level": "error", "accesslog": {"disabled": True}},
           "storage": {"filesystem": {"rootdirectory": str(storage)},
                       # Purging uploads writes to the storage: never from a read-only server.
                       "maintenance": {"uploadpurging": {"enabled": False}, "readonly": {"enabled": read_only}}},
           "http": {"addr": addr}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def garbage_collect(storage: Path, log_dir: Path) -> None:
    """Delete the blobs no tag reaches any more (with no writable registry serving ``storage``)."""
    config = write_config(storage, log_dir / "garbage-collect.yaml", read_only=False)
    subprocess.run([registry_binary(), "garbage-collect", "--delete-untagged", str(config)], capture_output=True)


class Registry:
    """``docker-registry serve`` on ``ADDRESS:PORT`` (loopback unless told: a plane's registry is on its
    bridge, where its nodes pull) over ``storage``; ``host`` is what image names use."""

    def __init__(self, storage: Path, log_dir: Path, *, read_only: bool, port: int | None = None,
                 address: str = "127.0.0.1") -> None:
        self.storage = storage
        self.log_dir = log_dir
        self.read_only = read_only
        self.port = port or free_port()
        self.host = f"{address}:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30) -> "Registry":
        self.storage.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        config = write_config(self.storage, self.log_dir / f"registry-{self.port}.yaml", self.read_only, self.host)
        log_path = self.log_dir / f"registry-{self.port}.log"
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen([registry_binary(), "serve", str(config)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_until_answers(self.proc, f"http://{self.host}/v2/", timeout_s, "docker-registry", log_path, RegistryError)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc.pid, 5)
            self.proc = None

    def __enter__(self) -> "Registry":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
