"""The namespace's autoscaler Lease: who holds it, and the plan it carries while held."""

from __future__ import annotations

from edl.api.cluster import PlanLine, SizeCause, SizeReason
from edl.cluster.autoscaler_lease import PLAN_ANNOTATION, autoscaler_lease, holder_of, plan_lines

LINE = PlanLine(3, ("n0", "n1", "n1"), SizeReason(SizeCause.GROWING, "growing 1 -> 3: there is room for it"), 990.0)


def test_the_holder_holds_it_while_it_renews_and_its_plan_lapses_with_it():
    lease = autoscaler_lease("ml", "pod-a", "a", 1000.0, 30, {"edl.dev/role": "autoscaler"}, {"ml/a": LINE})
    assert holder_of(lease, 1029.0) == "pod-a" and plan_lines(lease, 1029.0) == {"ml/a": LINE}
    assert holder_of(lease, 1031.0) is None and plan_lines(lease, 1031.0) == {}  # lapsed: nobody decides
    assert holder_of(None, 1000.0) is None and plan_lines(None, 1000.0) == {}


def test_a_lease_without_a_plan_or_with_a_bad_one_carries_no_lines():
    assert plan_lines(autoscaler_lease("ml", "pod-a", "a", 1000.0, 30, {}), 1000.0) == {}  # taken, not planned yet
    bad = autoscaler_lease("ml", "pod-a", "a", 1000.0, 30, {}, {"ml/a": LINE})
    bad["metadata"]["annotations"][PLAN_ANNOTATION] = '{"lines": {"ml/a": {"size": "x"}}}'
    assert plan_lines(bad, 1000.0) == {} and holder_of(bad, 1000.0) == "pod-a"
    assert holder_of({"spec": {"holderIdentity": "pod-a", "renewTime": "not a time"}}, 1000.0) is None


def test_the_plan_names_each_node_once_and_goes_without_nodes_when_too_large(monkeypatch):
    import json

    from edl.cluster import autoscaler_lease as al

    lease = autoscaler_lease("ml", "pod-a", "a", 1000.0, 30, {}, {"ml/a": LINE})
    assert json.loads(lease["metadata"]["annotations"][PLAN_ANNOTATION])["lines"]["ml/a"]["nodes"] == [["n0", 1], ["n1", 2]]
    monkeypatch.setattr(al, "PLAN_BYTES", 100)
    lines = plan_lines(autoscaler_lease("ml", "pod-a", "a", 1000.0, 30, {}, {"ml/a": LINE}), 1000.0)
    assert lines["ml/a"].nodes == () and lines["ml/a"].size == 3 and lines["ml/a"].at == 990.0


def test_a_following_sidecar_decodes_its_own_line_only():
    from edl.cluster.autoscaler_lease import plan_line

    other = PlanLine(1, (), SizeReason(SizeCause.AT_MAX, "at its maximum of 1 trainers"))
    lease = autoscaler_lease("ml", "pod-a", "a", 1000.0, 30, {}, {"ml/a": LINE, "ml/b": other})
    assert plan_line(lease, "ml/a", 1001.0) == LINE and plan_line(lease, "ml/b", 1001.0) == other
    assert plan_line(lease, "ml/c", 1001.0) is None  # not planned yet
    assert plan_line(lease, "ml/a", 1031.0) is None and plan_line(None, "ml/a", 1001.0) is None  # lapsed, none
    lease["metadata"]["annotations"][PLAN_ANNOTATION] = '{"lines": {"ml/a": {"size": "x"}, "ml/b": ' + \
        lease["metadata"]["annotations"][PLAN_ANNOTATION].split('"ml/b":', 1)[1]
    assert plan_line(lease, "ml/a", 1001.0) is None and plan_line(lease, "ml/b", 1001.0) == other  # one bad line
