"""A trainer that registers again (its master restarted) reaches the master the address leads to
now with every link, not the old master over a kept-alive connection. Two real masters of one run
(one token) behind a TCP proxy that, like a Service's connection tracking, sends each new
connection to its current endpoint and keeps an open one where it was; the client is edl's own."""

from __future__ import annotations

import os
import subprocess

import pytest

from edl.api.spec import JobSpec
from edl.jobargs import spec_to_argv
from edl.masterlink import HttpMaster
from edl.net import free_port
from tests.conftest import edl_cmd
from tests.proxy import TcpProxy
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(120)
TOKEN = "one-run"


@pytest.fixture
def two_masters(digits, tmp_path):
    """Two masters of one job and token, each on its own checkpoint prefix (so both serve)."""
    procs, ports = [], []
    for i in range(2):
        spec = JobSpec(job="reconnect", model_def="edl.zoo.digits", data=str(digits), epochs=50, batch_size=16,
                       min_trainers=1, max_trainers=2, trainers=1, checkpoint_uri=str(tmp_path / f"ckpt{i}"),
                       launcher_timeout_s=600)
        ports.append(free_port())
        procs.append(subprocess.Popen(edl_cmd("master", *spec_to_argv(spec), "--port", str(ports[-1])),
                                      env={**os.environ, "EDL_TOKEN": TOKEN}, stdout=subprocess.DEVNULL,
                                      stderr=open(tmp_path / f"master{i}.log", "w")))
    try:
        for port in ports:
            wait_for(HttpMaster(f"127.0.0.1:{port}", TOKEN, give_up_s=0).healthy, 60, f"the master on {port}")
        yield ports
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_after_registering_again_every_link_reaches_the_master_the_address_leads_to_now(two_masters):
    old, new = two_masters
    service = TcpProxy(old)
    try:
        address = f"127.0.0.1:{service.port}"
        joining = HttpMaster(address, TOKEN, give_up_s=10)
        heartbeat = HttpMaster(address, TOKEN, timeout_s=10, give_up_s=0)  # another thread's link, in a trainer

        def beat():
            return heartbeat.heartbeat("t1", generation=0, step=0, safe_cursor=None, loss=None, wait_s=0.0)

        first = joining.register("t1", os.getpid(), "127.0.0.1", free_port())
        assert beat().master_uid == first.master_uid  # both links now keep a connection to the old master
        service.upstream = new  # the master was replaced: the Service leads to its successor
        again = joining.register("t1", os.getpid(), "127.0.0.1", free_port())
        assert again.master_uid != first.master_uid, "registered again with the old master"
        assert beat().master_uid == again.master_uid, "the heartbeat still reached the old master"
    finally:
        service.close()
