"""fastattn: fast, exact softmax and scaled dot-product attention on the CPU.

A compiled core (C kernels with OpenMP threads) behind a NumPy API that mirrors
the pure-NumPy reference in :mod:`fastattn.reference` name for name.
"""
import os as _os
import warnings as _warnings

from fastattn import _core

try:  # FASTATTN_SIMD=generic|avx2|avx512|neon|auto forces a kernel path (default: auto)
    _core.select_simd(_os.environ.get("FASTATTN_SIMD", "auto").strip().lower() or "auto")
except ValueError as _exc:
    _warnings.warn(f"FASTATTN_SIMD ignored: {_exc}", RuntimeWarning, stacklevel=2)
    _core.select_simd("auto")

from fastattn._softmax import log_softmax, logsumexp, softmax  # noqa: E402
from fastattn._attention import (  # noqa: E402
    attention_weights,
    causal_attention,
    scaled_dot_product_attention,
    sliding_window_attention,
)
from fastattn._varlen import varlen_attention  # noqa: E402
from fastattn._backward import attention_backward, varlen_attention_backward  # noqa: E402
from fastattn._merge import merge_attention  # noqa: E402
from fastattn._quant import QuantizedArray, quantize_kv  # noqa: E402
from fastattn._threads import get_num_threads, set_num_threads  # noqa: E402
from fastattn._memory import set_result_cache  # noqa: E402
from fastattn._config import show_config  # noqa: E402
from fastattn._version import __version__  # noqa: E402
from fastattn import flash_attn  # noqa: E402,F401  (FlashAttention's Python API)
from fastattn import reference  # noqa: E402,F401  (the float64 NumPy twin, the tests' oracle)

__all__ = [  # a literal list, for static analysers: the modules' __all__ and the config
    "softmax",
    "log_softmax",
    "logsumexp",
    "scaled_dot_product_attention",
    "causal_attention",
    "sliding_window_attention",
    "attention_weights",
    "varlen_attention",
    "merge_attention",
    "quantize_kv",
    "QuantizedArray",
    "attention_backward",
    "varlen_attention_backward",
    "set_num_threads",
    "get_num_threads",
    "set_result_cache",
    "show_config",
    "__version__",
]
