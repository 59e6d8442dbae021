"""A realistic size for the benchmarks: a 6-layer transformer encoder over token sequences (about 23 M
parameters), classifying each sequence; PaddlePaddle. The same network as ``edl.zoo.torch.transformer``.

Data: ``edl data prepare tokens --rows 20000 --length 64 --vocab 8192 --classes 10 --out DIR``.
"""

from __future__ import annotations

import paddle
from paddle import nn

from edl.zoo._classifier import loss
from edl.zoo.collate import collate_tokens as collate

__all__ = ["model", "loss", "optimizer", "collate"]

VOCAB, LENGTH, WIDTH, HEADS, LAYERS, FF, CLASSES = 8192, 64, 512, 8, 6, 2048, 10


class TokenClassifier(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = self.create_parameter([1, LENGTH, WIDTH], default_initializer=nn.initializer.Constant(0.0))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FF, dropout=0.0, normalize_before=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: paddle.Tensor) -> paddle.Tensor:
        h = self.encoder(self.embed(tokens) + self.position[:, : tokens.shape[1]])
        return self.head(self.norm(h).mean(axis=1))


def model() -> nn.Layer:
    return TokenClassifier()


def optimizer(parameters, learning_rate: float) -> paddle.optimizer.Optimizer:
    return paddle.optimizer.AdamW(learning_rate=learning_rate, parameters=parameters)
