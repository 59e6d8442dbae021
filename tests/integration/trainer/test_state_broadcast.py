"""Three real processes over Gloo: rank 0's model and optimizer state reach every rank, whatever it held.

Rank 0 trained three steps; rank 1 is a fresh replica whose optimizer has made no state yet (a
joiner); rank 2 trained on other data (its optimizer state exists, with other values). After
``Replica.broadcast`` all three must hold rank 0's parameters and optimizer state bit for bit,
and take the same next step. The zoo's mlp has tensors both above and below the size at which
they travel in place rather than packed. For both frameworks, through the seam only.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.trainer.ranks import free_port, run_ranks

pytestmark = pytest.mark.timeout(120)

WORKER = r"""
import sys
import numpy as np
from edl.frameworks import load
from edl.modeldef import load_model_def

rank, port, out, framework, model_def = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
fw = load(framework)
replica = fw.replica(load_model_def(model_def), 3, 0.01, None)
alone = fw.group("127.0.0.1", 0, 0, 1, 0, "gloo")

def step(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    y = rng.integers(0, 10, 16).astype(np.int64)
    replica.backward(x, y)
    replica.all_reduce(alone, np.zeros(0, np.float32))
    replica.end_step(16)

if rank == 0:
    for s in range(3):
        step(s)
elif rank == 2:
    for s in range(5):
        step(100 + s)
group = fw.group("127.0.0.1", port, rank, 3, 1, "gloo")
got = replica.broadcast(group, 7 if rank == 0 else -1)
params, opt_arrays, extra = replica.snapshot()
step(1000)  # the same next step everywhere
after, _, _ = replica.snapshot()
np.savez(out, step=np.array(got), **{"p/" + k: v for k, v in params.items()},
         **{"o/" + k: v for k, v in opt_arrays.items()}, **{"next/" + k: v for k, v in after.items()})
group.close()
"""

MODELS = {"paddle": "edl.zoo.mlp", "torch": "edl.zoo.torch.mlp"}


@pytest.mark.parametrize("framework", sorted(MODELS))
def test_every_rank_takes_rank0s_state_in_place_fresh_or_trained(tmp_path, framework):
    from edl.frameworks.statecast import SMALL_BYTES

    port = free_port()
    outs = [tmp_path / f"rank{r}.npz" for r in range(3)]
    run_ranks(WORKER, 3, lambda r: [str(r), str(port), str(outs[r]), framework, MODELS[framework]])
    ranks = [dict(np.load(o)) for o in outs]
    assert [int(r["step"]) for r in ranks] == [7, 7, 7]
    keys = [k for k in ranks[0] if k != "step"]
    assert any(k.startswith("o/") for k in keys), "the optimizer's state travelled"
    sizes = [ranks[0][k].nbytes for k in keys if not k.startswith("next/")]
    assert min(sizes) < SMALL_BYTES <= max(sizes), "both ways of sending are exercised"
    for r in ranks[1:]:
        assert set(r) == set(ranks[0])
        for k in keys:
            np.testing.assert_array_equal(r[k], ranks[0][k], err_msg=k)
    assert not np.array_equal(ranks[0]["next/net.0.weight"], ranks[0]["p/net.0.weight"])  # the step moved it

