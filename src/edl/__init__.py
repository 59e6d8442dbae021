"""edl: elastic deep learning for PaddlePaddle, as pipeline components."""

__version__ = "0.1.0"

import warnings as _warnings

# Paddle warns about a missing C++ compiler cache on every import; it is irrelevant to us.
_warnings.filterwarnings("ignore", message=".*ccache.*")
