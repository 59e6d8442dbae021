"""Shared fixtures: an isolated EDL_HOME, prepared data sets, and a job runner that cleans up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edl.launcher.local import local_job_status

from tests import durations

pytest_plugins = ["tests.plane.fixtures"]  # the real control plane: plane, plane_s3, kube, namespace

REPO = Path(__file__).resolve().parents[1]


SECONDS = pytest.StashKey[dict]()  # the tests' seconds this run orders by (tests/durations.py)
SECONDS_INPUT = "edl_test_seconds"  # ... as xdist's controller hands them to its workers


def pytest_configure(config) -> None:
    """Where every test's report arrives (xdist's controller, or a run without workers): time the tests
    into the cache, and read the seconds the workers order by, once for all of them."""
    if not hasattr(config, "workerinput"):
        path = durations.cache_path()
        config.stash[SECONDS] = durations.known(durations.load(path))
        config.pluginmanager.register(durations.Recorder(path), "edl-test-durations")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's controller gives each worker the same seconds: every worker must collect the same order."""
    seconds = node.config.stash.get(SECONDS, None)
    if seconds is not None:
        node.workerinput[SECONDS_INPUT] = seconds


def pytest_collection_modifyitems(config, items) -> None:
    """On xdist's workers, the slow tests spread over the workers' first shares, longest first, by the
    seconds the suite measured of them (why and how: ``tests/durations.py``). Every worker computes the
    same order from the same seconds, as xdist requires."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        seconds = getattr(config, "workerinput", {}).get(SECONDS_INPUT)
        if seconds is None:  # a controller that is not ours: read the cache here
            seconds = durations.known(durations.load(durations.cache_path()))
        order = durations.worksteal_order([item.nodeid for item in items], workers, seconds)
        items[:] = [items[i] for i in order]


@pytest.fixture(autouse=True)
def edl_home(tmp_path, monkeypatch):
    home = tmp_path / "edl-home"
    monkeypatch.setenv("EDL_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> Path:
    from edl.data.prepare import prepare_digits

    out = tmp_path_factory.mktemp("digits")
    prepare_digits(str(out))
    return out


# The zoo's digits model in each framework: the guarantees that do not depend on the framework are
# tested for both (``framework_digits``).
DIGITS_MODELS = {"paddle": "edl.zoo.digits", "torch": "edl.zoo.torch.digits"}


@pytest.fixture(params=sorted(DIGITS_MODELS))
def framework_digits(request) -> str:
    """``edl.zoo.digits`` and ``edl.zoo.torch.digits``, one test each."""
    return DIGITS_MODELS[request.param]


def edl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "edl", *args]


def run_edl(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(edl_cmd(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


class RunningJob:
    """``edl train`` in the background, with helpers to watch and disturb it."""

    def __init__(self, name: str, args: list[str], home: Path, log: Path, env: dict | None = None) -> None:
        self.name, self.args, self.home, self.log_path = name, args, home, log
        self.env = {**os.environ, "EDL_HOME": str(home), **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RunningJob":
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(edl_cmd("train", *self.args), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True)
        return self

    def info(self) -> dict:
        return json.loads((self.home / "jobs" / self.name / "job.json").read_text())

    def status(self) -> dict | None:
        """The master's status in its JSON form (``None`` while it cannot be read)."""
        st = local_job_status(self.name, self.home)
        return None if st is None else st.to_json()

    def wait_for(self, predicate, timeout: float = 90, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st is not None and predicate(st):
                return st
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"job ended (code {self.proc.returncode}) before {what}:\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last status {self.status()}\n{self.output()[-3000:]}")

    def wait(self, timeout: float = 180) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job did not finish in {timeout} s:\n{self.output()[-3000:]}") from None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the launcher and every process of the job."""
        pids = []
        try:
            info = self.info()
            pids = [info["master_pid"], info.get("standby_pid"), *info["trainers"].values()]
        except (OSError, ValueError, KeyError):
            pass
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in pids:
            try:
                if pid:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


@pytest.fixture
def job_runner(tmp_path, edl_home):
    jobs: list[RunningJob] = []

    def make(name: str, args: list[str], env: dict | None = None) -> RunningJob:
        j = RunningJob(name, ["--job-name", name, *args], edl_home, tmp_path / f"{name}-{len(jobs)}.log", env)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.kill()


def _start_moto(port: int) -> subprocess.Popen:
    import socket

    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


class S3Server:
    """A real S3 endpoint on loopback (moto's server mode), restartable to simulate outages."""

    def __init__(self) -> None:
        from edl.net import free_port

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = _start_moto(self.port)
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def start(self) -> None:
        self.proc = _start_moto(self.port)

    def client(self):
        from minio import Minio

        return Minio(f"127.0.0.1:{self.port}", access_key="testing", secret_key="testing", secure=False,
                     region="us-east-1")


@pytest.fixture
def s3(monkeypatch):
    server = S3Server()
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    yield server
    server.stop()
