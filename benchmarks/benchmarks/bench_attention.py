"""Scaled dot-product attention: speed, GFLOP/s, memory and accuracy."""
import numpy as np

import fastattn
from fastattn import reference
from fastattn._bench import (MODEL_CASES, PEERS, PinnedThreads, Problem, best_time, check_peer,
                             fma_peaks)

from .common import IMPLS, random, sdpa_fn, set_threads


class SDPA:
    """B=1, H=8 self-attention, causal and not (the SDPA rows of the grid of
    ``python -m fastattn bench``)."""

    params = (IMPLS, [1, 2], [64, 128], [1024, 4096], [False, True])
    param_names = ["impl", "threads", "D", "L", "causal"]
    timeout = 300

    def setup(self, impl, threads, D, L, causal):
        self.limits = None  # (asv runs teardown after a skipping setup too)
        if impl == "reference" and L > 1024:
            raise NotImplementedError("the reference is O(L*S) in memory and time")
        self.limits = set_threads(impl, threads)
        q, k, v = (random((1, 8, L, D), seed) for seed in range(3))
        self.fn = sdpa_fn(impl, q, k, v, is_causal=causal)

    def teardown(self, *args):
        fastattn.set_num_threads(None)
        if self.limits is not None:
            self.limits.restore_original_limits()

    def time_sdpa(self, *args):
        self.fn()


class SDPAGflops:
    """fastattn's rate on L=S=4096, D=128, not causal, against a NumPy matmul."""

    params = [["fastattn", "numpy-matmul"]]
    param_names = ["what"]
    timeout = 300

    def track_gflops(self, what):
        import time

        if what == "numpy-matmul":
            a = random((4096, 4096))
            a @ a
            t0 = time.perf_counter()
            a @ a
            return 2 * 4096**3 / (time.perf_counter() - t0) / 1e9
        q, k, v = (random((1, 8, 4096, 128), seed) for seed in range(3))
        fastattn.scaled_dot_product_attention(q, k, v)
        t0 = time.perf_counter()
        fastattn.scaled_dot_product_attention(q, k, v)
        return 4 * 8 * 4096 * 4096 * 128 / (time.perf_counter() - t0) / 1e9

    track_gflops.unit = "GFLOP/s"


class SlidingWindow:
    """sliding_window_attention, window 256, against full causal attention."""

    params = ([4096, 8192, 16384], ["window-256", "causal"])
    param_names = ["L", "mask"]
    timeout = 300

    def setup(self, L, mask):
        self.q, self.k, self.v = (random((1, 8, L, 64), seed) for seed in range(3))

    def time_attention(self, L, mask):
        if mask == "causal":
            fastattn.causal_attention(self.q, self.k, self.v)
        else:
            fastattn.sliding_window_attention(self.q, self.k, self.v, 256)


class Decode:
    """One new token over a 16k KV cache, GQA 32/8 heads, D=128."""

    params = [["fastattn", "torch", "copy-kv"]]
    param_names = ["impl"]

    def setup(self, impl):
        self.q = random((1, 32, 1, 128), 0)
        self.k = random((1, 8, 16384, 128), 1)
        self.v = random((1, 8, 16384, 128), 2)
        if impl == "copy-kv":
            self.fn = lambda: (self.k.copy(), self.v.copy())
        else:
            set_threads(impl, 2)
            self.fn = sdpa_fn(impl, self.q, self.k, self.v, enable_gqa=True)

    def teardown(self, impl):
        fastattn.set_num_threads(None)

    def time_decode(self, impl):
        self.fn()


class PeakMemory:
    """Causal B=1, H=8, L=S=16384, D=64: inputs and output are 128 MiB."""

    timeout = 300

    def setup(self):
        self.q, self.k, self.v = (random((1, 8, 16384, 64), seed) for seed in range(3))
        self.out = np.zeros_like(self.q)

    def peakmem_causal_16k(self):
        fastattn.causal_attention(self.q, self.k, self.v, out=self.out)

    def peakmem_inputs_and_output_only(self):
        """The baseline: what the process holds without the call."""


class Accuracy:
    """Max abs error against float64 on B=1, H=4, L=S=1024, D=64."""

    params = [["fastattn", "torch"], [False, True]]
    param_names = ["impl", "causal"]

    def setup(self, impl, causal):
        q, k, v = (random((1, 4, 1024, 64), seed) for seed in range(3))
        self.got = sdpa_fn(impl, q, k, v, is_causal=causal)()
        self.want = reference.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def track_max_abs_error(self, impl, causal):
        return float(np.max(np.abs(np.asarray(self.got, np.float64) - self.want)))

    track_max_abs_error.unit = "abs error"


class SmallCall:
    """Per-call cost on tiny inputs (one decoding step of a small model):
    mostly argument checks and shaping in Python, which this keeps in view."""

    params = [["fastattn", "torch"]]
    param_names = ["impl"]

    def setup(self, impl):
        q = random((1, 4, 1, 64), 0)
        k, v = (random((1, 4, 32, 64), seed) for seed in (1, 2))
        self.fn = sdpa_fn(impl, q, k, v)

    def time_sdpa_small(self, impl):
        self.fn()


class Models:
    """The model grid of ``python -m fastattn bench --models`` (encoders, ViT,
    Whisper, LLM decode and prefill, a tiny call), every implementation on 1
    and 2 threads; the peers (torch, onnxruntime, openvino, jax) skip when not
    installed, the reference where it cannot express or hold the case (it runs
    whole here, not sliced). Each peer's result is checked against fastattn's
    in setup; JAX runs with the process's threads pinned to `threads` cores."""

    params = (IMPLS + ["onnxruntime", "openvino", "jax"], [1, 2],
              [name for name, _ in MODEL_CASES])
    param_names = ["impl", "threads", "case"]
    timeout = 300

    def setup(self, impl, threads, case):
        self.pin = None
        prob = dict(MODEL_CASES)[case]
        if impl == "reference" and prob.B * prob.H * prob.L * prob.S > 2**25:
            raise NotImplementedError("the reference is O(L*S) in memory and time")
        r = prob.runner(impl, threads)
        if r is None:
            raise NotImplementedError(f"{impl} is not installed or cannot express {case}")
        self.fn = r[0]
        if impl == "jax":
            self.pin = PinnedThreads(threads).__enter__()
            self.pin.check()
        if impl in PEERS:
            q, k, v, mask = prob.inputs()
            want = fastattn.scaled_dot_product_attention(q, k, v, mask, is_causal=prob.causal,
                                                         enable_gqa=prob.gqa)
            try:  # (two calls: OpenVINO 2025.3 fails the tiny call's second on 2 threads)
                check_peer(impl, self.fn(), want, prob)
                check_peer(impl, self.fn(), want, prob)
            except Exception as exc:
                raise NotImplementedError(f"{impl} fails or disagrees on {case}: {exc}") from exc

    def teardown(self, *args):
        fastattn.set_num_threads(None)
        if self.pin is not None:
            self.pin.__exit__(None, None, None)

    def time_model(self, *args):
        self.fn()


class FmaPeakFraction:
    """fastattn's FLOP rate on L=S=4096, D=128, not causal, over the float32
    FMA peak of the same threads (AVX2 and AVX-512 widths where the CPU has them)."""

    params = (["AVX2", "AVX-512"], [1, 2])
    param_names = ["peak", "threads"]
    timeout = 300

    def setup(self, peak, threads):
        self.peaks = fma_peaks(threads)
        if peak not in self.peaks:
            raise NotImplementedError(f"no {peak} on this CPU")
        self.prob = Problem(1, 8, 8, 4096, 4096, 128)
        self.fn = self.prob.runner("fastattn", threads)[0]

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def track_fma_peak_fraction(self, peak, threads):
        self.fn()
        return self.prob.flops() / best_time(self.fn, 1) / 1e9 / self.peaks[peak]

    track_fma_peak_fraction.unit = "fraction of peak"
