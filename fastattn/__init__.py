"""fastattn: fast, exact softmax and scaled dot-product attention on the CPU.

A compiled core (C kernels with OpenMP threads) behind a NumPy API that mirrors
the pure-NumPy reference in :mod:`fastattn.reference` name for name.
"""
from fastattn._api import (
    attention_weights,
    causal_attention,
    get_num_threads,
    log_softmax,
    logsumexp,
    scaled_dot_product_attention,
    set_num_threads,
    sliding_window_attention,
    softmax,
)
from fastattn._config import show_config

__version__ = "0.1.0"

__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "scaled_dot_product_attention",
    "causal_attention",
    "sliding_window_attention",
    "attention_weights",
    "set_num_threads",
    "get_num_threads",
    "show_config",
    "__version__",
]
