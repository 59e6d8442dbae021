"""A realistic size for the benchmarks: a 6-layer transformer encoder over token sequences (about 23 M
parameters), classifying each sequence; PyTorch. The same network as ``edl.zoo.transformer``.

Data: ``edl data prepare tokens --rows 20000 --length 64 --vocab 8192 --classes 10 --out DIR``.
"""

from __future__ import annotations

import torch
from torch import nn

from edl.zoo.collate import collate_tokens as collate
from edl.zoo.torch._classifier import loss

__all__ = ["model", "loss", "optimizer", "collate"]

VOCAB, LENGTH, WIDTH, HEADS, LAYERS, FF, CLASSES = 8192, 64, 512, 8, 6, 2048, 10


class TokenClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(1, LENGTH, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FF, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens) + self.position[:, : tokens.shape[1]])
        return self.head(self.norm(h).mean(dim=1))


def model() -> nn.Module:
    return TokenClassifier()


def optimizer(parameters, learning_rate: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=learning_rate)
