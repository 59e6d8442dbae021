"""Shared pieces of the zoo's PaddlePaddle classifiers: cross-entropy and a plain MLP (the collate is the zoo's)."""

from __future__ import annotations

import paddle

from edl.zoo.collate import collate

__all__ = ["collate", "loss", "mlp"]


def loss(outputs: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
    return paddle.nn.functional.cross_entropy(outputs, labels)


def mlp(sizes: list[int]) -> paddle.nn.Layer:
    layers: list[paddle.nn.Layer] = []
    for i in range(len(sizes) - 1):
        layers.append(paddle.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(paddle.nn.ReLU())
    return paddle.nn.Sequential(*layers)
