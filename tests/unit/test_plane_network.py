"""The real nodes' network and configuration, the parts that decide without running anything: which
addresses a plane owns, what a node gives pods, which processes and cgroups a node's teardown finds."""

from __future__ import annotations

import ipaddress
import subprocess
import sys

import pytest
import yaml

from tests.plane import cluster, network, node
from tests.plane.cluster import node_size_problem


def test_a_planes_addresses_all_lie_in_its_blackholed_range_and_never_overlap_another_planes():
    a, b = network.PlaneNet(40), network.PlaneNet(60)
    for net in (a, b):
        owned = ipaddress.ip_network(net.cidr)
        addresses = [net.host_ip, net.kubernetes_service_ip, net.dns_service_ip, net.node_ip(0), net.node_ip(5)]
        assert all(ipaddress.ip_address(x) in owned for x in addresses)
        ranges = [net.service_cidr, net.pod_cidr(0), net.pod_cidr(5)]
        assert all(ipaddress.ip_network(r).subnet_of(owned) for r in ranges)
        pods = [ipaddress.ip_network(net.pod_cidr(i)) for i in range(8)]
        assert not any(p.overlaps(q) for i, p in enumerate(pods) for q in pods[i + 1:])
        assert not any(p.overlaps(ipaddress.ip_network(net.service_cidr)) for p in pods)
        assert ipaddress.ip_address(net.node_ip(0)) in ipaddress.ip_network(f"{net.host_ip}/24", strict=False)
    assert not ipaddress.ip_network(a.cidr).overlaps(ipaddress.ip_network(b.cidr))
    assert a.owns("10.40.3.7") and not a.owns("10.60.3.7")
    assert len({a.bridge, a.veth(0), a.veth(1), a.netns(0)}) == 4 and all(len(x) <= 15 for x in (a.bridge, a.veth(9)))


@pytest.mark.parametrize("base", [0, 250, -1])
def test_a_base_outside_the_usable_range_is_refused(base):
    with pytest.raises(network.NetworkError, match=str(base)):
        network.PlaneNet(base)


def test_a_node_reserves_what_it_does_not_give_pods(tmp_path):
    spec = node.NodeSpec("n", 0, cpu="500m", memory="1Gi")
    n = real_node(tmp_path, spec)
    reserved = n._reserved()
    cores, total = node.machine_capacity()
    assert reserved["cpu"] == f"{cores * 1000 - 500}m"
    assert int(reserved["memory"]) == total - 2**30


@pytest.mark.parametrize("cpu,memory,culprit", [("64", "1Gi", "--cpu 64"), ("0", "1Gi", "--cpu 0"),
                                                ("1", "lots", "--memory lots"), ("1", "100Ti", "--memory 100Ti"),
                                                ("two", "1Gi", "--cpu two")])
def test_dev_cluster_names_a_node_size_this_machine_cannot_give(cpu, memory, culprit):
    problem = node_size_problem(cpu, memory)
    assert problem is not None and problem.startswith(culprit)


def test_dev_cluster_takes_a_node_size_this_machine_has():
    assert node_size_problem("1", "1Gi") is None


def test_dev_cluster_refuses_a_node_grace_no_kubelet_could_keep(capsys):
    with pytest.raises(SystemExit) as e:
        cluster.main(["up", "--node-grace", "1"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("--node-grace must be at least 2 seconds (got 1)")


def test_a_nodes_lease_is_the_planes_grace(tmp_path):
    n = real_node(tmp_path, lease_s=20)
    n._write_configs()
    assert yaml.safe_load((tmp_path / "kubelet.yaml").read_text())["nodeLeaseDurationSeconds"] == 20


def test_a_nodes_teardown_finds_the_processes_that_name_it_and_nothing_else(tmp_path):
    marker = str(tmp_path / "containerd.sock")
    proc = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)", marker],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        assert node.processes_naming(marker) == [proc.pid]
        assert node.processes_naming(marker + "-other") == []
    finally:
        proc.kill()
        proc.wait()


def test_the_containerd_configuration_names_only_the_nodes_own_places(tmp_path):
    import tomllib

    real_node(tmp_path)._write_configs()
    cfg = tomllib.loads((tmp_path / "containerd.toml").read_text())
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    paths = [cfg["root"], cfg["state"], cfg["grpc"]["address"], cfg["ttrpc"]["address"],
             cri["containerd"]["runtimes"]["runc"]["options"]["Root"], cri["cni"]["conf_dir"],
             cri["registry"]["config_path"], cfg["proxy_plugins"]["edl"]["address"]]
    assert all(p.startswith(str(tmp_path)) for p in paths)
    assert cri["sandbox_image"] == "reg:5000/edl-pause:1.0" and cri["restrict_oom_score_adj"] is True
    assert cri["netns_mounts_under_state_dir"] is True
    # The snapshotter finds a layer by the digest the CRI plugin passes only with annotations on.
    assert cri["containerd"]["snapshotter"] == "edl" and cri["containerd"]["disable_snapshot_annotations"] is False


def real_node(tmp_path, spec: node.NodeSpec | None = None, lease_s: int = 6) -> node.RealNode:
    """A node's configuration writer, with every path under ``tmp_path`` (nothing is started)."""
    return node.RealNode(spec or node.NodeSpec("n", 0, cpu="1", memory="1Gi"), tmp_path, network.PlaneNet(40),
                         ca=tmp_path, kubeconfig=tmp_path, proxy_kubeconfig=tmp_path, serving=(tmp_path, tmp_path),
                         registry="r:1", pause_image="reg:5000/edl-pause:1.0", bin_dir=tmp_path,
                         snapshotter=tmp_path / "edl-snapshotter", layers=tmp_path / "layers", logs=tmp_path,
                         lease_s=lease_s)


def test_the_machine_lock_is_one_holders_at_a_time_and_a_waiter_gives_up_naming_who_held_it(tmp_path):
    from tests.plane.procs import machine_lock

    lock = tmp_path / "dir" / ".lock"
    with machine_lock(lock):
        with pytest.raises(RuntimeError, match="another plane's pre-pull held .*dir/.lock for over 0 s"):
            with machine_lock(lock, 0.2, "another plane's pre-pull"):
                pass
    with machine_lock(lock, 0.2):  # let go: the next holder gets it at once
        pass
