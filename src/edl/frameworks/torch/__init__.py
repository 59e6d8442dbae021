"""PyTorch behind ``edl.api.framework``: eager replicas, and a process group per generation.

Groups are built from a ``TCPStore`` of their own (``edl.frameworks.torch.group``), never
``init_process_group``'s one global default group, so a generation can be dropped and another
formed while the process lives.
"""

from __future__ import annotations

import numpy as np

from edl.api.framework import Group, Replica
from edl.modeldef import ModelDef


class Torch:
    name = "torch"

    def replica(self, md: ModelDef, seed: int, learning_rate: float, init_params: dict[str, np.ndarray] | None,
                bucket_bytes: int | None = None, first_bytes: int | None = None) -> Replica:
        from edl.frameworks.torch.replica import TorchReplica

        return TorchReplica(md, seed, learning_rate, init_params, bucket_bytes, first_bytes)

    def group(self, host: str, port: int, rank: int, world: int, group_id: int, backend: str,
              timeout_s: int = 10) -> Group:
        from edl.frameworks.torch.group import TorchGroup

        return TorchGroup(host, port, rank, world, group_id, backend, timeout_s)


FRAMEWORK = Torch()
