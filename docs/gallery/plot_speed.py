"""
Speed on the machine that built these pages
===========================================

The speed tables of ``python -m fastattn bench`` as charts, measured here
when the page was built, on small shapes so that the build stays fast
(a few seconds). Every figure is the best of a few calls, with the thread
count fastattn uses by default; the machine and the thread count are
printed below. For real measurements run ``python -m fastattn bench`` (the
whole grid) or ``python -m fastattn bench --models`` on your own machine.
"""

import platform
import time

import matplotlib.pyplot as plt
import numpy as np

import fastattn
from fastattn import reference


def best(fn, repeat=5):
    """Best wall time of `repeat` calls, in seconds."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


config = fastattn.show_config(mode="dicts")
print(f"fastattn {config['version']}, {config['simd']} kernels, {config['num_threads']} threads,"
      f" {platform.machine()} {platform.processor() or ''}")
rng = np.random.default_rng(0)
H, D = 4, 64

# %%
# Attention against the NumPy reference
# -------------------------------------
# Time per call for full and causal attention at growing sequence lengths;
# the reference forms the whole ``L x S`` matrix in float64.
lengths = [128, 256, 512, 1024]
rows = {"fastattn": [], "fastattn causal": [], "reference": []}
for n in lengths:
    q, k, v = (rng.standard_normal((1, H, n, D), dtype=np.float32) for _ in range(3))
    rows["fastattn"].append(best(lambda: fastattn.scaled_dot_product_attention(q, k, v)))
    rows["fastattn causal"].append(
        best(lambda: fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)))
    rows["reference"].append(best(lambda: reference.scaled_dot_product_attention(q, k, v),
                                  repeat=1) if n <= 512 else np.nan)

fig, ax = plt.subplots(figsize=(6, 3.6))
for name, times in rows.items():
    ax.plot(lengths, np.array(times) * 1e3, marker="o", label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xticks(lengths, [str(n) for n in lengths])
ax.yaxis.set_major_formatter(plt.FormatStrFormatter("%g"))
ax.set_xlabel(f"L = S (B=1, H={H}, D={D})")
ax.set_ylabel("ms per call")
ax.legend(fontsize=8)
ax.set_title("scaled_dot_product_attention")
fig.tight_layout()
print("L=S      " + "  ".join(f"{n:>8}" for n in lengths))
for name, times in rows.items():
    print(f"{name:<16} " + "  ".join(f"{t * 1e3:7.2f}ms" for t in times))

# %%
# A sliding window costs O(L · W), not O(L²)
# ------------------------------------------
# With ``window=(W - 1, 0)`` the key tiles outside the window are skipped, so
# doubling L doubles the time, where full causal attention quadruples it.
W = 128
lengths = [512, 1024, 2048]
causal, window = [], []
for n in lengths:
    q, k, v = (rng.standard_normal((1, 2, n, D), dtype=np.float32) for _ in range(3))
    causal.append(best(lambda: fastattn.causal_attention(q, k, v)))
    window.append(best(lambda: fastattn.sliding_window_attention(q, k, v, W)))

fig, ax = plt.subplots(figsize=(6, 3.4))
x = np.arange(len(lengths))
ax.bar(x - 0.2, np.array(causal) * 1e3, 0.4, label="causal")
ax.bar(x + 0.2, np.array(window) * 1e3, 0.4, label=f"sliding window {W}")
ax.set_xticks(x, [f"L = {n}" for n in lengths])
ax.set_ylabel("ms per call")
ax.legend(fontsize=8)
ax.set_title("causal vs sliding-window attention (H=2, D=64)")
fig.tight_layout()

# %%
# softmax against a copy
# ----------------------
# softmax must read and write the whole array, so a copy (``x.copy()``) is
# the yardstick; the ratio is what ``python -m fastattn bench`` reports.
shapes = [(1024, 512), (256, 4096), (64, 16384)]
ratios = []
for shape in shapes:
    x = rng.standard_normal(shape, dtype=np.float32)
    ratios.append(best(lambda: fastattn.softmax(x)) / best(lambda: x.copy()))
fig, ax = plt.subplots(figsize=(6, 3))
ax.bar([str(s) for s in shapes], ratios, color="tab:green")
ax.axhline(1.0, color="gray", lw=0.8)
ax.set_ylabel("time / time of x.copy()")
ax.set_title("fastattn.softmax along the last axis")
fig.tight_layout()
plt.show()
