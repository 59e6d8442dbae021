"""When a node counts as lost: not Ready past a deadline counted from first sight on the launcher's clock."""

from __future__ import annotations

from edl.cluster.node_loss import GONE, judge_nodes


def test_a_node_not_ready_past_the_deadline_from_first_sight_is_lost():
    v = judge_nodes({"a": "True", "b": "Unknown"}, {}, now=100.0, timeout_s=60)
    assert v.not_ready_since == {"b": 100.0} and v.lost == {}
    v = judge_nodes({"a": "True", "b": "Unknown"}, v.not_ready_since, now=159.0, timeout_s=60)
    assert v.lost == {}
    v = judge_nodes({"a": "True", "b": "Unknown"}, v.not_ready_since, now=160.0, timeout_s=60)
    assert v.lost == {"b": "Unknown"} and v.not_ready_since == {"b": 100.0}


def test_a_node_ready_again_starts_afresh_and_one_not_seen_this_round_keeps_its_clock():
    v = judge_nodes({"b": "False", "c": GONE}, {}, now=0.0, timeout_s=60)
    v = judge_nodes({"b": "True"}, v.not_ready_since, now=30.0, timeout_s=60)  # c not looked at this round
    assert v.not_ready_since == {"c": 0.0}
    v = judge_nodes({"b": "False", "c": GONE}, v.not_ready_since, now=61.0, timeout_s=60)
    assert v.lost == {"c": GONE} and v.not_ready_since == {"b": 61.0, "c": 0.0}
