"""CPU-only trainers leave the cores of GPU nodes to the GPU jobs (generated scenario 14 was 2x slower)."""

from __future__ import annotations

from edl.api.cluster import JobDemand, Node, Resources, Snapshot
from edl.autoscale.accounting import capacity
from edl.autoscale.policy import get_policy

CPU_TRAINER = Resources(cpu=8, memory=8)
GPU_TRAINER = Resources(cpu=4, memory=4, gpu=1)
NODES = (Node("a-gpu", Resources(16, 64, 4)), Node("b-cpu", Resources(32, 64, 0)))


def test_a_pod_without_gpus_goes_to_a_gpu_node_only_when_nothing_else_holds_it():
    cap = capacity(Snapshot(NODES, (), ()))
    # Best fit alone would pick the smaller GPU node first.
    assert [cap.place(CPU_TRAINER) for _ in range(5)] == [1, 1, 1, 1, 0]
    assert cap.place(GPU_TRAINER) == 0  # what the CPU trainers left there


def test_edl_sizes_gpu_jobs_with_the_cores_of_the_gpu_nodes():
    cpu_job = JobDemand("cpu", 1, 10, 1, CPU_TRAINER)
    gpu_job = JobDemand("gpu", 1, 4, 1, GPU_TRAINER)
    plan = get_policy("edl").decide(Snapshot(NODES, (), (cpu_job, gpu_job)))
    assert plan["gpu"] == 4  # all four GPUs, with the 16 cores of their node
    assert plan["cpu"] == 4  # the CPU job fills the CPU node
