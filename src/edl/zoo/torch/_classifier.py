"""Shared pieces of the zoo's PyTorch classifiers: cross-entropy and a plain MLP (the collate is the zoo's)."""

from __future__ import annotations

import torch
from torch import nn


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, labels)


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
