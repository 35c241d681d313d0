"""Half-precision and quantized K/V and strided (B, L, H, D) inputs, against
float32 contiguous.

Targets: decoding (B=1, 32 query / 8 kv heads, L=1, S=16384, D=128, 2 threads)
with float16 or bfloat16 K/V >= 1.7x faster than with float32 K/V, and faster
than PyTorch on float32 K/V (over a short cache, S=256, not slower than
float32); causal prefill (L=S=4096) with float16 K/V within
1.1x of float32; (B, L, H, D) views within 1.1x of the contiguous call;
decoding from a q8_0 cache within 1.05x of the float16 time and 0.75x of the
float32 time (q4_0 reported). The
track_* ratios time both calls alternately in one process (robust to a drifting
machine); values above 1 mean the half-precision / strided call is faster.
"""
import numpy as np

import fastattn
from fastattn._bench import as_layout, best_time, kv_operand

from .common import random, torch_or_skip

DECODE = dict(B=1, H=32, Hkv=8, L=1, S=16384, D=128)
PREFILL = dict(B=1, H=8, Hkv=8, L=4096, S=4096, D=128)


def _inputs(shape, kv="float32", layout="bhld"):
    B, H, Hkv, L, S, D = (shape[n] for n in ("B", "H", "Hkv", "L", "S", "D"))
    q, k, v = random((B, H, L, D), 0), random((B, Hkv, S, D), 1), random((B, Hkv, S, D), 2)
    return as_layout(q, layout), kv_operand(k, kv, layout), kv_operand(v, kv, layout)


def _skip_without(kv):
    if kv == "bfloat16":
        try:
            import ml_dtypes  # noqa: F401
        except ImportError:
            raise NotImplementedError("ml_dtypes is not installed") from None


class HalfKVDecode:
    """Decoding with a float32 / float16 / bfloat16 KV cache (PyTorch: float32 only)."""

    params = (["fastattn", "torch"], ["float32", "float16", "bfloat16"])
    param_names = ["impl", "kv"]
    timeout = 300

    def setup(self, impl, kv):
        _skip_without(kv)
        if impl == "torch" and kv != "float32":
            raise NotImplementedError("PyTorch's SDPA takes q, k, v of one dtype")
        q, k, v = _inputs(DECODE, kv)
        if impl == "torch":
            torch = torch_or_skip()
            torch.set_num_threads(2)
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

            def run():
                with torch.no_grad():
                    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
            self.fn = run
        else:
            fastattn.set_num_threads(2)
            self.fn = lambda: fastattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_decode(self, *args):
        self.fn()


def _ratio(slow, fast, repeat=5):
    """Best time of `slow` over best time of `fast`, timed alternately."""
    slow(), fast()
    ts, tf = np.inf, np.inf
    for _ in range(repeat):
        ts = min(ts, best_time(slow, 1))
        tf = min(tf, best_time(fast, 1))
    return ts / tf


class HalfKVSpeedup:
    """float32-K/V time over half-precision-K/V time (decode: target >= 1.7;
    prefill: target >= 1 / 1.1; decoding over a short cache, S=256, where the
    per-call cost shows: not below 1)."""

    params = (["decode", "short-decode", "prefill"], ["float16", "bfloat16"])
    param_names = ["case", "kv"]
    timeout = 600

    def setup(self, case, kv):
        _skip_without(kv)
        if case == "prefill" and kv == "bfloat16":
            raise NotImplementedError("the prefill target names float16")
        fastattn.set_num_threads(2)
        shape = {"decode": DECODE, "short-decode": dict(DECODE, S=256),
                 "prefill": PREFILL}[case]
        kw = dict(enable_gqa=shape["H"] != shape["Hkv"], is_causal=case == "prefill")
        q, k, v = _inputs(shape)
        q, kh, vh = _inputs(shape, kv)
        self.f32 = lambda: fastattn.scaled_dot_product_attention(q, k, v, **kw)
        self.half = lambda: fastattn.scaled_dot_product_attention(q, kh, vh, **kw)

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def track_speedup(self, case, kv):
        return _ratio(self.f32, self.half,
                      repeat={"decode": 5, "short-decode": 200, "prefill": 2}[case])

    track_speedup.unit = "x"


class StridedLayout:
    """(B, L, H, D) arrays viewed as (B, H, L, D), read in place, against the
    contiguous call (target: ratio >= 1 / 1.1)."""

    params = (["decode", "prefill"],)
    param_names = ["case"]
    timeout = 600

    def setup(self, case):
        fastattn.set_num_threads(2)
        shape = DECODE if case == "decode" else dict(PREFILL, L=2048, S=2048)
        kw = dict(enable_gqa=shape["H"] != shape["Hkv"], is_causal=case == "prefill")
        q, k, v = _inputs(shape)
        qs, ks, vs = _inputs(shape, layout="blhd")
        self.contiguous = lambda: fastattn.scaled_dot_product_attention(q, k, v, **kw)
        self.strided = lambda: fastattn.scaled_dot_product_attention(qs, ks, vs, **kw)

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_strided(self, case):
        self.strided()

    def track_contiguous_over_strided(self, case):
        return _ratio(self.contiguous, self.strided, repeat=5 if case == "decode" else 2)

    track_contiguous_over_strided.unit = "x"


class QuantizedKVDecode:
    """Decoding (the DECODE shape) from a quantized cache (GGUF q8_0 / q4_0
    blocks, fastattn.quantize_kv), its (B, S, H, D) view too: the float16 and
    the float32 time over the quantized time, timed alternately (targets for
    q8_0 in the contiguous layout: >= 1 / 1.05 and >= 1 / 0.75)."""

    params = (["q8_0", "q4_0"], ["bhld", "blhd"])
    param_names = ["kv", "layout"]
    timeout = 600

    def setup(self, kv, layout):
        fastattn.set_num_threads(2)
        runs = {}
        for dt in ("float32", "float16", kv):
            q, k, v = _inputs(DECODE, dt, layout)
            runs[dt] = (lambda q=q, k=k, v=v:
                        fastattn.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        self.runs = runs
        self.quantized = runs[kv]

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_decode(self, kv, layout):
        self.quantized()

    def track_float16_over_quantized(self, kv, layout):
        return _ratio(self.runs["float16"], self.quantized)

    def track_float32_over_quantized(self, kv, layout):
        return _ratio(self.runs["float32"], self.quantized)

    track_float16_over_quantized.unit = "x"
    track_float32_over_quantized.unit = "x"
