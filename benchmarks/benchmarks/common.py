"""Shared set-up of the fastattn benchmarks: inputs and the implementations
compared side by side (fastattn, its NumPy reference, PyTorch when installed)."""
import numpy as np

import fastattn
from fastattn import reference


def torch_or_skip():
    """PyTorch, imported on first use (it is an optional peer, and importing it
    would count in the peak-memory benchmarks); NotImplementedError skips."""
    try:
        import torch
    except ImportError:
        raise NotImplementedError("PyTorch is not installed") from None
    return torch

IMPLS = ["fastattn", "reference", "torch"]
SEED = 0


def random(shape, seed=SEED):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def set_threads(impl, threads):
    """Give `impl` `threads` threads (NotImplementedError skips the case)."""
    if impl == "torch":
        torch_or_skip().set_num_threads(threads)
    elif impl == "reference":
        from threadpoolctl import threadpool_limits

        return threadpool_limits(threads, user_api="blas")
    fastattn.set_num_threads(threads)
    return None


def sdpa_fn(impl, q, k, v, **kw):
    """A no-argument callable running SDPA of `impl` on numpy inputs."""
    if impl == "fastattn":
        return lambda: fastattn.scaled_dot_product_attention(q, k, v, **kw)
    if impl == "reference":
        return lambda: reference.scaled_dot_product_attention(q, k, v, **kw)
    torch = torch_or_skip()
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    tkw = {"is_causal": kw.get("is_causal", False), "enable_gqa": kw.get("enable_gqa", False)}

    def run():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **tkw)
    return run
