"""Shared pieces of the zoo's classifiers: features/label columns, cross-entropy."""

from __future__ import annotations

import numpy as np
import paddle
import pyarrow as pa


def collate(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    feats = table.column("features").combine_chunks()
    width = feats.type.list_size
    x = feats.values.to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.float32, copy=False)
    y = table.column("label").to_numpy().astype(np.int64)
    return x, y


def loss(outputs: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
    return paddle.nn.functional.cross_entropy(outputs, labels)


def mlp(sizes: list[int]) -> paddle.nn.Layer:
    layers: list[paddle.nn.Layer] = []
    for i in range(len(sizes) - 1):
        layers.append(paddle.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(paddle.nn.ReLU())
    return paddle.nn.Sequential(*layers)
