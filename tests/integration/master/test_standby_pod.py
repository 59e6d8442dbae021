"""A spare master as it runs in a pod (``edl master --standby http``), with real processes: it answers its
readiness but nothing a trainer asks until the launcher wakes it with the job token; a master stopped
mid-run (its pod deleted: SIGTERM) hands the run lock over as it ends, and the woken spare serves the job
from its checkpoint without fencing it; a spare whose job its launcher abandoned ends with it."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from edl.api.spec import JobSpec
from edl.errors import UserError
from edl.jobargs import spec_to_argv
from edl.masterlink import HttpMaster
from edl.net import free_port
from edl.storage.claim import FENCE_S, LOCK_KEY, POD_UID_ENV, LockRecord
from edl.storage.store import open_store
from tests.conftest import edl_cmd
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(120)
TOKEN = "one-run"


def test_a_spare_woken_over_http_takes_the_lock_its_stopped_predecessor_handed_over(digits, tmp_path):
    spec = JobSpec(job="spare", model_def="edl.zoo.digits", data=str(digits), epochs=50, batch_size=16,
                   min_trainers=1, max_trainers=2, trainers=1, checkpoint_uri=str(tmp_path / "ckpt"),
                   launcher_timeout_s=10)  # no launcher beats here: each master ends the job 10 s after it starts
    ports = {"serving": free_port(), "spare": free_port(), "next": free_port()}
    procs: dict[str, subprocess.Popen] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ports}

    def start(name: str, *extra: str) -> None:
        procs[name] = subprocess.Popen(edl_cmd("master", *spec_to_argv(spec), "--port", str(ports[name]), *extra),
                                       env={**os.environ, "EDL_TOKEN": TOKEN, POD_UID_ENV: f"pod-{name}"},
                                       stdout=subprocess.DEVNULL, stderr=logs[name].open("w"))

    def link(name: str, token: str = TOKEN) -> HttpMaster:
        return HttpMaster(f"127.0.0.1:{ports[name]}", token, give_up_s=0)

    try:
        start("serving")
        start("spare", "--standby", "http")
        wait_for(link("serving").healthy, 60, "the serving master", detail=logs["serving"].read_text)
        spare_url = f"http://127.0.0.1:{ports['spare']}"
        wait_for(lambda: _answers(f"{spare_url}/healthz"), 60, "the spare's readiness", detail=logs["spare"].read_text)
        assert not link("spare").healthy()  # ready as a spare, not as a master: the launcher does not take it for one
        assert httpx.get(f"{spare_url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 503
        with pytest.raises(UserError, match="refused our job token"):
            link("spare", "not-the-token").wake_standby()
        held = open_store(spec.checkpoint_uri).get(LOCK_KEY)
        assert not LockRecord.from_bytes(held).released

        procs["serving"].send_signal(signal.SIGTERM)  # its pod deleted
        assert procs["serving"].wait(30) == 143  # as SIGTERM's own exit, once it has handed the lock over
        lock = LockRecord.from_bytes(open_store(spec.checkpoint_uri).get(LOCK_KEY))
        assert lock.released and lock.holder.pod == "pod-serving"  # handed over: the run goes on

        link("spare").wake_standby(FENCE_S)
        wait_for(link("spare").healthy, 60, "the woken spare serving", detail=logs["spare"].read_text)
        log = logs["spare"].read_text()
        assert "master up:" in log and "since the standby was woken" in log, log
        assert "fence" not in log and "previous master" not in log, log  # its predecessor handed the lock over
        lock = LockRecord.from_bytes(open_store(spec.checkpoint_uri).get(LOCK_KEY))
        assert lock.holder.pod == "pod-spare" and not lock.released

        # The next spare asks the serving master how the job is: abandoned by its launcher, it ends too.
        start("next", "--standby", "http", "--serving-master", f"127.0.0.1:{ports['spare']}")
        assert procs["next"].wait(60) == 0
        assert "not needed (the job is over, or its launcher is gone)" in logs["next"].read_text()
    finally:
        for p in procs.values():
            p.kill()
            p.wait(10)


def _answers(url: str) -> bool:
    try:
        r = httpx.get(url, timeout=2)
    except httpx.TransportError:
        return False
    return r.status_code == 200 and r.json().get("standby") is True
