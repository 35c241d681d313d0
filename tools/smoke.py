"""A short tour of every kernel entry point, checked against the reference.

Small enough to run under valgrind (tools/sanitize.sh with SANITIZE_VALGRIND=1):
odd sizes that miss every tile and SIMD width, every mask kind, causal, window,
GQA, L != S, non-finite values, every SIMD path, one and two threads.
Exits non-zero if a result differs from the reference.
"""
import sys

import numpy as np

import fastattn
from fastattn import _core, reference


def close(a, b, tol=3e-5):
    return a.shape == b.shape and np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True)


def main():
    rng = np.random.default_rng(0)
    failures = 0
    for path in _core.simd_available():
        _core.select_simd(path)
        for nthreads in (1, 2):
            fastattn.set_num_threads(nthreads)
            x = rng.standard_normal((7, 37)).astype(np.float32)
            x[2, 5] = np.nan
            x[3, :] = -np.inf
            x[4, 1] = np.inf
            for name in ("softmax", "log_softmax", "logsumexp"):
                for axis in (-1, 0):
                    got = getattr(fastattn, name)(x, axis=axis)
                    failures += not close(got, getattr(reference, name)(x, axis=axis))
            q = rng.standard_normal((2, 4, 19, 13)).astype(np.float32)
            k = rng.standard_normal((2, 2, 71, 13)).astype(np.float32)
            v = rng.standard_normal((2, 2, 71, 9)).astype(np.float32)
            bmask = rng.random((19, 71)) < 0.7
            fmask = rng.standard_normal((2, 1, 19, 71)).astype(np.float32)
            fmask[..., ::5] = -np.inf
            k[..., 3, :] = np.nan          # a key only the bool mask may hide
            bmask[:, 3] = False
            for mask in (None, bmask, fmask):
                for kw in ({}, {"is_causal": True}, {"window": (9, 2)},
                           {"is_causal": True, "window": (30, None)}):
                    args = (q, k, v, mask)
                    o, lse = fastattn.scaled_dot_product_attention(*args, enable_gqa=True,
                                                                   return_lse=True, **kw)
                    ro, rlse = reference.scaled_dot_product_attention(*args, enable_gqa=True,
                                                                      return_lse=True, **kw)
                    failures += not close(o, ro) or not close(lse, rlse)
                    w = fastattn.attention_weights(q, k, mask, enable_gqa=True, **kw)
                    failures += not close(w, reference.attention_weights(q, k, mask,
                                                                         enable_gqa=True, **kw))
            y = np.empty(33, np.float32)
            _core.exp(np.linspace(-120, 90, 33, dtype=np.float32), y)
            _core.exp2(np.linspace(-160, 130, 33, dtype=np.float32), y)
    fastattn.set_num_threads(None)
    print("smoke:", "FAILED" if failures else "ok", f"({failures} mismatches)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
