"""Two real trainer processes over Gloo: the fused all-reduce trains exactly as the unfused one did.

Each process steps two replicas of the same model on its own batches: one the way the
trainer does (gradients in flat buckets, each bucket handed by backward's hooks to the
collectives' thread as soon as its gradients are done, the slots riding in the last,
small buckets so that the model has three), one the way edl did before, one all-reduce
per parameter and one for the slots. With two ranks every element's sum is one float
addition, whatever the buckets, so the models must agree bit for bit, across both paths
and both ranks.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.trainer.ranks import free_port, run_ranks

pytestmark = pytest.mark.timeout(120)

WORKER = r"""
import sys
import numpy as np
import paddle
from edl.modeldef import load_model_def
from edl.frameworks.paddle.group import PaddleGroup as Group
from edl.trainer.collective import Runner
from edl.frameworks.paddle.replica import PaddleReplica as Replica
from edl.trainer.slots import decode_sums, own_slots

rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
md = load_model_def("edl.zoo.digits")
rng = np.random.default_rng(100 + rank)
rows = [12, 5, 0, 9, 12]  # rank 1 has no data at step 3; rank 0 neither (a round nobody trains in)
batches = [(rng.standard_normal((n, 64)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)) for n in rows]
batches[2] = None
if rank == 1:
    batches[1] = None
fused, plain = Replica(md, 3, 0.01, bucket_bytes=16384, first_bytes=1024), Replica(md, 3, 0.01)
runner = Runner()
init = {k: v.numpy().copy() for k, v in fused.model.state_dict().items()}
group = Group("127.0.0.1", port, rank, 2, 1)
samples = []
for batch in batches:
    count = 0 if batch is None else len(batch[1])
    slots = own_slots(2, rank, None, count, float(count), False, False)
    fused.begin_step(group, len(slots), runner.submit)
    if batch is not None:
        fused.backward(*batch)
        assert len(fused._flats) == 3 and len(fused._sent) == 2, "buckets sent during backward"
    sums = decode_sums(runner.wait(fused.reduce_rest(group, slots, runner.submit), lambda: False), ("a", "b"))
    fused.end_step(sums.samples)
    samples.append(sums.samples)
    # The unfused path, as edl did it before buckets.
    if batch is not None:
        md_loss = md.loss(plain.model(paddle.to_tensor(batch[0])), paddle.to_tensor(batch[1]))
        (md_loss * count).backward()
    for p in plain.params:
        if p.grad is None:
            p._set_grad_ivar(paddle.zeros(p.shape, p.dtype))
        group.all_reduce_sum(p.grad)
    t = paddle.to_tensor(slots)
    group.all_reduce_sum(t)
    if sums.samples:
        with paddle.no_grad():
            for p in plain.params:
                p.grad.scale_(1.0 / sums.samples)
        plain.opt.step()
    plain.opt.clear_grad()
np.savez(out, samples=np.array(samples), **{"init/" + k: v for k, v in init.items()},
         **{"fused/" + k: v.numpy() for k, v in fused.model.state_dict().items()},
         **{"plain/" + k: v.numpy() for k, v in plain.model.state_dict().items()})
group.close()
"""


def test_two_ranks_fused_all_reduce_equals_the_per_parameter_one(tmp_path):
    port = free_port()
    outs = [tmp_path / f"rank{r}.npz" for r in range(2)]
    run_ranks(WORKER, 2, lambda r: [str(r), str(port), str(outs[r])])
    ranks = [dict(np.load(o)) for o in outs]
    assert list(ranks[0]["samples"]) == [24, 5, 0, 18, 24]  # the slots' counts, summed exactly
    names = [k.removeprefix("fused/") for k in ranks[0] if k.startswith("fused/")]
    assert names
    assert any(not np.array_equal(ranks[0]["fused/" + k], ranks[0]["init/" + k]) for k in names)  # it trained
    for r in ranks:
        for k in names:
            np.testing.assert_array_equal(r["fused/" + k], r["plain/" + k], err_msg=k)
            np.testing.assert_array_equal(r["fused/" + k], ranks[0]["fused/" + k], err_msg=k)
