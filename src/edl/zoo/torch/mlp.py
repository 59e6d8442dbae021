"""The benchmarks' wider MLP in PyTorch: the network of ``edl.zoo.mlp`` (about 2.4 M parameters).

Data: ``edl data prepare synthetic --rows 200000 --features 256 --classes 10 --out DIR``.
"""

from __future__ import annotations

import torch
from torch import nn

from edl.zoo.collate import collate
from edl.zoo.torch._classifier import loss

__all__ = ["model", "loss", "optimizer", "collate"]

HIDDEN = 1024


class WideMLP(nn.Module):
    """256 inputs -> three 1024-wide ReLU layers -> 10 classes."""

    def __init__(self, features: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def model() -> nn.Module:
    return WideMLP()


def optimizer(parameters, learning_rate: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=learning_rate, momentum=0.9)
