"""The pods of a cluster kept summed as they change: what a decision reads instead of every pod.

A sidecar on a cluster of 150,000 pods decides every few seconds, while only a few pods change
between two decisions. The observer (the sidecar's informer, the simulator) hands each change to a
``PodLedger``, which moves that pod's requests between the sums the policy reads (``PodTotals``):
the load per node of the pods other than trainers, the pods waiting for a node, each job's
trainers. Sums are kept in exact integer units, so that a week of adding and removing pods
leaves no rounding behind.
"""

from __future__ import annotations

from collections import Counter

from edl.api.cluster import Pod, PodPhase, PodTotals, units

_ZERO = (0, 0, 0)


def _plus(a: tuple[int, int, int], b: tuple[int, int, int], sign: int) -> tuple[int, int, int]:
    return a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2]


class PodLedger:
    """Live pods by name, summed as ``PodTotals`` reads them; ``put`` and ``remove`` cost one pod."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every pod (the observer lists the cluster again)."""
        self._pods: dict[str, Pod] = {}
        self._load: dict[str, tuple[int, int, int]] = {}
        self._requested = _ZERO
        self._waiting: dict[str, Pod] = {}
        self._trainers: dict[str, dict[str, Pod]] = {}
        self._shapes: Counter[float] = Counter()
        self._frozen: dict[str, tuple[Pod, ...]] = {}  # each job's trainers as last handed out
        self._waiting_frozen: tuple[Pod, ...] | None = None

    def __len__(self) -> int:
        return len(self._pods)

    def put(self, name: str, pod: Pod | None) -> None:
        """The pod ``name`` is now ``pod`` (``None``: gone)."""
        old = self._pods.pop(name, None)
        if old is not None:
            self._count(name, old, -1)
        if pod is not None and not pod.phase.terminated:
            self._pods[name] = pod
            self._count(name, pod, 1)

    def remove(self, name: str) -> None:
        self.put(name, None)

    def _count(self, name: str, p: Pod, sign: int) -> None:
        if p.role == "trainer" and p.job is not None:
            mine = self._trainers.setdefault(p.job, {})
            if sign > 0:
                mine[name] = p
            else:
                del mine[name]
                if not mine:
                    del self._trainers[p.job]
            self._frozen.pop(p.job, None)
            return
        if p.phase is PodPhase.PENDING and p.node is None:
            if sign > 0:
                self._waiting[name] = p
            else:
                del self._waiting[name]
            self._waiting_frozen = None
            return
        u = units(p.requests)
        self._requested = _plus(self._requested, u, sign)
        if p.node is not None:
            load = _plus(self._load.get(p.node, _ZERO), u, sign)
            if load == _ZERO:
                self._load.pop(p.node, None)
            else:
                self._load[p.node] = load
        if p.job is not None:
            self._shapes[p.requests.cpu] += sign
            if self._shapes[p.requests.cpu] <= 0:
                del self._shapes[p.requests.cpu]

    def pods(self) -> tuple[Pod, ...]:
        return tuple(self._pods.values())

    def totals(self) -> PodTotals:
        """The sums as they are now, to read while the ledger changes on (a copy: about the nodes with
        load and the jobs' trainers, each job's copied again only when it changed)."""
        for job, pods in self._trainers.items():
            if job not in self._frozen:
                self._frozen[job] = tuple(pods.values())
        if self._waiting_frozen is None:
            self._waiting_frozen = tuple(self._waiting.values())
        return PodTotals(dict(self._load), self._requested, self._waiting_frozen,
                         {job: self._frozen[job] for job in self._trainers}, frozenset(self._shapes))
