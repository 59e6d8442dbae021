"""A larger MLP for benchmarks: a CPU step takes tens of milliseconds at batch 256.

Data: ``edl data prepare synthetic --rows 200000 --features 256 --classes 10 --out DIR``
(the input width is read from the data, so other ``--features`` work too).
"""

from __future__ import annotations

import paddle

from edl.zoo._classifier import collate, loss

__all__ = ["model", "loss", "optimizer", "collate"]

HIDDEN = 1024


class WideMLP(paddle.nn.Layer):
    """256 inputs -> three 1024-wide ReLU layers -> 10 classes (about 2.4 M parameters)."""

    def __init__(self, features: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.net = paddle.nn.Sequential(
            paddle.nn.Linear(features, HIDDEN),
            paddle.nn.ReLU(),
            paddle.nn.Linear(HIDDEN, HIDDEN),
            paddle.nn.ReLU(),
            paddle.nn.Linear(HIDDEN, HIDDEN),
            paddle.nn.ReLU(),
            paddle.nn.Linear(HIDDEN, classes),
        )

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.net(x)


def model() -> paddle.nn.Layer:
    return WideMLP()


def optimizer(parameters, learning_rate: float) -> paddle.optimizer.Optimizer:
    return paddle.optimizer.Momentum(learning_rate=learning_rate, momentum=0.9, parameters=parameters)
