"""edl: elastic deep learning for PaddlePaddle, as pipeline components."""

__version__ = "0.1.0"
