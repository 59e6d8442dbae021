"""scikit-learn's 8x8 digits: a small MLP that reaches ~97 % held-out accuracy.

Data: ``edl data prepare digits --out DIR``.
"""

from __future__ import annotations

import paddle

from edl.zoo._classifier import collate, loss, mlp

__all__ = ["model", "loss", "optimizer", "collate"]


def model() -> paddle.nn.Layer:
    return mlp([64, 128, 64, 10])


def optimizer(parameters, learning_rate: float) -> paddle.optimizer.Optimizer:
    return paddle.optimizer.Adam(learning_rate=learning_rate, parameters=parameters)
