"""Simulation scenarios: a YAML file (or a built-in name) validated into dataclasses.

A malformed scenario is a ``UserError`` that names the field, e.g.
``scenario jobs[0].trainer.cpu: must be a number > 0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from edl.api.cluster import Resources
from edl.errors import UserError

BUILT_IN = ("seed-case1", "seed-case2")


@dataclass(frozen=True)
class NodeGroup:
    count: int
    allocatable: Resources


@dataclass(frozen=True)
class Service:
    name: str
    priority: int
    pod: Resources
    startup_s: float
    replicas: tuple[tuple[float, int], ...]  # (time, count), sorted
    termination_s: float = 1.0

    def target(self, t: float) -> int:
        n = 0
        for at, count in self.replicas:
            if at <= t:
                n = count
        return n


@dataclass(frozen=True)
class FixedPods:
    role: str
    count: int
    pod: Resources


@dataclass(frozen=True)
class ScenarioJob:
    name: str
    submit_at: float
    priority: int
    fixed_pods: tuple[FixedPods, ...]
    trainer: Resources
    min: int
    max: int
    static: int
    work: float | None  # samples; None = endless
    per_trainer: float  # samples/s of one trainer
    efficiency: float  # each extra trainer adds efficiency**(n-1) of one
    rescale_cost_s: float
    startup_s: float
    termination_s: float = 30.0  # a deleted trainer pod's grace period (a Job controller scale-down)
    drain_s: float = 1.0  # with edl's launcher: drained at a step boundary, then deleted

    def throughput(self, n: int) -> float:
        return sum(self.per_trainer * self.efficiency ** k for k in range(max(0, n)))


@dataclass(frozen=True)
class Scenario:
    name: str
    duration_s: float
    period_s: float
    offpeak: tuple[float, float] | None
    nodes: tuple[NodeGroup, ...]
    services: tuple[Service, ...]
    jobs: tuple[ScenarioJob, ...]
    tick_s: float = 1.0
    preemption: bool = True  # priority preemption by the scheduler (Kubernetes 1.6 had none)
    scoring: str = "spread"  # kube-scheduler's LeastAllocated ("spread") or MostAllocated ("pack")
    nodes_to_score_percent: int = 0  # kube-scheduler's percentageOfNodesToScore (0: its adaptive default)
    meta: dict = field(default_factory=dict, compare=False)


class _Reader:
    def __init__(self, data: Any, path: str) -> None:
        self.data, self.path = data, path

    def fail(self, key: str, why: str) -> UserError:
        return UserError(f"scenario {self.path}{'.' if self.path else ''}{key}: {why}")

    def sub(self, key: str) -> "_Reader":
        return _Reader(self.data.get(key), f"{self.path}.{key}" if self.path else key)

    def number(self, key: str, default: Any = ..., positive: bool = False, minimum: float | None = None) -> float:
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "is required")
            return default
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(key, f"must be a number, not {v!r}")
        if positive and v <= 0:
            raise self.fail(key, "must be a number > 0")
        if minimum is not None and v < minimum:
            raise self.fail(key, f"must be ≥ {minimum}")
        return v

    def integer(self, key: str, default: Any = ..., minimum: int = 0) -> int:
        v = self.number(key, default, minimum=minimum)
        if v is not None and int(v) != v:
            raise self.fail(key, f"must be a whole number, not {v!r}")
        return v if v is None else int(v)

    def items(self, key: str, required: bool = True) -> list["_Reader"]:
        v = self.data.get(key)
        if v is None and not required:
            return []
        if not isinstance(v, list):
            raise self.fail(key, "must be a list")
        out = []
        for i, item in enumerate(v):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}]", "must be a mapping")
            out.append(_Reader(item, f"{self.path + '.' if self.path else ''}{key}[{i}]"))
        return out

    def resources(self, key: str) -> Resources:
        r = self.sub(key)
        if not isinstance(r.data, dict):
            raise self.fail(key, "must be a mapping with cpu and memory_gi")
        return Resources(r.number("cpu", positive=True), r.number("memory_gi", 0.0, minimum=0),
                         r.number("gpu", 0.0, minimum=0))


def _priority(r: _Reader, priorities: dict[str, int], key: str = "priority") -> int:
    v = r.data.get(key, 0)
    if isinstance(v, str):
        if v not in priorities:
            raise r.fail(key, f"unknown priority class {v!r} (declared: {', '.join(priorities) or 'none'})")
        return priorities[v]
    if isinstance(v, bool) or not isinstance(v, int):
        raise r.fail(key, f"must be a priority class name or an integer, not {v!r}")
    return v


def parse(data: Any, source: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise UserError(f"{source}: a scenario must be a YAML mapping")
    r = _Reader(data, "")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise r.fail("name", "is required (a string)")
    priorities = data.get("priorities", {}) or {}
    if not isinstance(priorities, dict) or not all(isinstance(v, int) for v in priorities.values()):
        raise r.fail("priorities", "must map class names to integers")
    offpeak = data.get("offpeak")
    if offpeak is not None:
        if not (isinstance(offpeak, list) and len(offpeak) == 2 and all(isinstance(x, (int, float)) for x in offpeak)
                and offpeak[0] < offpeak[1]):
            raise r.fail("offpeak", "must be [start, end] with start < end")
        offpeak = (float(offpeak[0]), float(offpeak[1]))
    nodes = tuple(NodeGroup(n.integer("count", minimum=1),
                            Resources(n.number("cpu", positive=True), n.number("memory_gi", positive=True),
                                      n.number("gpu", 0.0, minimum=0)))
                  for n in r.items("nodes"))
    if not nodes:
        raise r.fail("nodes", "needs at least one node group")
    services = []
    for s in r.items("services", required=False):
        reps = s.data.get("replicas")
        if not isinstance(reps, list) or not reps or not all(
                isinstance(x, list) and len(x) == 2 and isinstance(x[0], (int, float)) and isinstance(x[1], int)
                and x[1] >= 0 for x in reps):
            raise s.fail("replicas", "must be a list of [time, count] pairs")
        sname = s.data.get("name")
        if not isinstance(sname, str):
            raise s.fail("name", "is required (a string)")
        services.append(Service(sname, _priority(s, priorities), s.resources("pod"), s.number("startup_s", 2.0, minimum=0),
                                tuple(sorted((float(a), int(b)) for a, b in reps)),
                                s.number("termination_s", 1.0, minimum=0)))
    jobs = []
    for j in r.items("jobs"):
        jname = j.data.get("name")
        if not isinstance(jname, str):
            raise j.fail("name", "is required (a string)")
        count = j.integer("count", 1, minimum=1)
        lo, hi = j.integer("min", minimum=1), j.integer("max", minimum=1)
        if lo > hi:
            raise j.fail("min", f"{lo} is greater than max {hi}")
        static = j.integer("static", hi, minimum=1)
        fixed = tuple(FixedPods(str(f.data.get("role", "fixed")), f.integer("count", minimum=0),
                                Resources(f.number("cpu", positive=True), f.number("memory_gi", 0.0, minimum=0),
                                          f.number("gpu", 0.0, minimum=0)))
                      for f in j.items("fixed_pods", required=False))
        tp = j.sub("throughput")
        per, eff = 1.0, 1.0
        if tp.data is not None:
            if not isinstance(tp.data, dict):
                raise j.fail("throughput", "must be a mapping with per_trainer and efficiency")
            per, eff = tp.number("per_trainer", positive=True), tp.number("efficiency", 1.0, positive=True)
        work = j.data.get("work")
        if work is not None and (isinstance(work, bool) or not isinstance(work, (int, float)) or work <= 0):
            raise j.fail("work", "must be a number of samples > 0, or null")
        for k in range(count):
            jobs.append(ScenarioJob(
                name=jname if count == 1 else f"{jname}-{k:02d}",
                submit_at=j.number("submit_at", 0.0, minimum=0) + k * j.number("submit_every", 0.0, minimum=0),
                priority=_priority(j, priorities), fixed_pods=fixed, trainer=j.resources("trainer"),
                min=lo, max=hi, static=static, work=None if work is None else float(work),
                per_trainer=per, efficiency=eff, rescale_cost_s=j.number("rescale_cost_s", 2.0, minimum=0),
                startup_s=j.number("startup_s", 2.0, minimum=0),
                termination_s=j.number("termination_s", 30.0, minimum=0), drain_s=j.number("drain_s", 1.0, minimum=0)))
    preemption = data.get("preemption", True)
    if not isinstance(preemption, bool):
        raise r.fail("preemption", "must be true or false")
    scoring = data.get("scoring", "spread")
    if scoring not in ("spread", "pack"):
        raise r.fail("scoring", f"must be spread or pack, not {scoring!r}")
    percent = r.number("nodes_to_score_percent", 0, minimum=0)
    if percent > 100 or percent != int(percent):
        raise r.fail("nodes_to_score_percent", f"must be a whole number 0..100, not {percent!r}")
    return Scenario(name, r.number("duration_s", positive=True), r.number("period_s", 5.0, positive=True), offpeak,
                    nodes, tuple(services), tuple(jobs), r.number("tick_s", 1.0, positive=True), preemption,
                    scoring, int(percent))


def load(name_or_path: str) -> Scenario:
    if name_or_path in BUILT_IN:
        text = resources.files("edl.sim.scenarios").joinpath(f"{name_or_path}.yaml").read_text()
        source = name_or_path
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise UserError(f"--scenario {name_or_path!r}: no such file (built in: {', '.join(BUILT_IN)})")
        text, source = path.read_text(), str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"{source}: not valid YAML: {str(e).splitlines()[0]}") from e
    return parse(data, source)
