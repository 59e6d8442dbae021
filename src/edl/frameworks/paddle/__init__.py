"""PaddlePaddle behind ``edl.api.framework``: dynamic-graph replicas, Gloo/NCCL groups from ``paddle.base.core``."""

from __future__ import annotations

import numpy as np

from edl.api.framework import Group, Replica
from edl.modeldef import ModelDef


class Paddle:
    name = "paddle"

    def replica(self, md: ModelDef, seed: int, learning_rate: float, init_params: dict[str, np.ndarray] | None,
                bucket_bytes: int | None = None, first_bytes: int | None = None) -> Replica:
        from edl.frameworks.paddle.replica import PaddleReplica

        return PaddleReplica(md, seed, learning_rate, init_params, bucket_bytes, first_bytes)

    def group(self, host: str, port: int, rank: int, world: int, group_id: int, backend: str,
              timeout_s: int = 10) -> Group:
        from edl.frameworks.paddle.group import PaddleGroup

        return PaddleGroup(host, port, rank, world, group_id, backend, timeout_s)


FRAMEWORK = Paddle()
