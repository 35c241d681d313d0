"""The attention backward: time against PyTorch's CPU backward, the FLOP
rate as a fraction of the FMA peak, and peak memory (the rows of ``python -m
fastattn bench --backward``)."""
import numpy as np

import fastattn
from fastattn._bench import BACKWARD_CASES, fma_peaks, time_backward

from .common import random, torch_or_skip

CASES = {f"{B}x{H}x{L}x{S}x{D}" + ("-causal" if causal else ""): (B, H, L, S, D, causal)
         for B, H, L, S, D, causal in BACKWARD_CASES}


class Backward:
    """Seconds of attention_backward, and of PyTorch's backward (forward and
    backward minus forward), on 2 threads."""

    params = (["fastattn", "torch"], list(CASES))
    param_names = ["impl", "case"]
    timeout = 600

    def setup(self, impl, case):
        B, H, L, S, D, causal = CASES[case]
        if impl == "torch":
            torch_or_skip()
        self.case = CASES[case]

    def track_seconds(self, impl, case):
        fa, tb = time_backward(*self.case, repeat=3, threads=2)
        return fa if impl == "fastattn" else tb

    track_seconds.unit = "seconds"


class BackwardPeakFraction:
    """The backward's FLOP rate (2.5 forward products, FlashAttention's count)
    over the FMA peak of the same 2 threads, causal (1, 8, 2048, 2048, 64)."""

    timeout = 600

    def track_fma_peak_fraction(self):
        B, H, L, S, D, causal = BACKWARD_CASES[0]
        fa, _ = time_backward(B, H, L, S, D, causal, repeat=3, threads=2)
        rate = 2.5 * 4 * B * H * L * S * D * 0.5 / fa / 1e9
        return rate / max(fma_peaks(2).values())

    track_fma_peak_fraction.unit = "fraction"


class BackwardPeakMemory:
    """Causal B=1, H=4, L=S=8192, D=64: the backward next to the forward."""

    timeout = 300

    def setup(self):
        self.q, self.k, self.v, self.do = (random((1, 4, 8192, 64), seed) for seed in range(4))
        self.o, self.lse = fastattn.scaled_dot_product_attention(
            self.q, self.k, self.v, is_causal=True, return_lse=True)
        self.out = np.empty_like(self.q)

    def peakmem_forward(self):
        fastattn.causal_attention(self.q, self.k, self.v, out=self.out)

    def peakmem_backward(self):
        fastattn.attention_backward(self.do, self.q, self.k, self.v, self.o, self.lse,
                                    is_causal=True)
