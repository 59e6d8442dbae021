"""scikit-learn's 8x8 digits in PyTorch: the small MLP of ``edl.zoo.digits``.

Data: ``edl data prepare digits --out DIR``.
"""

from __future__ import annotations

import torch
from torch import nn

from edl.zoo.collate import collate
from edl.zoo.torch._classifier import loss, mlp

__all__ = ["model", "loss", "optimizer", "collate"]


def model() -> nn.Module:
    return mlp([64, 128, 64, 10])


def optimizer(parameters, learning_rate: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=learning_rate)
