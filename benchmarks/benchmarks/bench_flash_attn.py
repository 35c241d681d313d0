"""fastattn.flash_attn: the cost of FlashAttention's API over the core call.

One decoding step over a KV cache of 8192 tokens, B=1, 32 query heads over 8
kv heads, D=128, float32: ``flash_attn_with_kvcache`` (appending the new
token at position 8191, then attending to all 8192) against
``fastattn.scaled_dot_product_attention`` on the same cache arrays (viewed
as (B, H, S, D), nothing appended), and a paged cache of blocks of 256 rows
against the contiguous one.

``python benchmarks/benchmarks/bench_flash_attn.py`` prints the times and
the ratios, measured in one process with the calls interleaved: the median
over rounds of the ratio within a round.
"""
import time

import numpy as np

import fastattn
from fastattn.flash_attn import flash_attn_with_kvcache

H, HKV, S, D, BLOCK = 32, 8, 8192, 128, 256
CASES = ["core", "kvcache", "kvcache-paged", "kvcache-paged-shuffled"]


def _inputs(case):
    """A no-argument callable running one decoding step of `case`."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, H, D), dtype=np.float32)
    k_new = rng.standard_normal((1, 1, HKV, D), dtype=np.float32)
    v_new = rng.standard_normal((1, 1, HKV, D), dtype=np.float32)
    k_cache = rng.standard_normal((1, S, HKV, D), dtype=np.float32)
    v_cache = rng.standard_normal((1, S, HKV, D), dtype=np.float32)
    if case == "core":
        qv, kv, vv = (a.swapaxes(1, 2) for a in (q, k_cache, v_cache))
        return lambda: fastattn.scaled_dot_product_attention(qv, kv, vv, enable_gqa=True)
    if case == "kvcache":
        return lambda: flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                               cache_seqlens=S - 1)
    nblk = S // BLOCK
    order = np.arange(nblk) if case == "kvcache-paged" else rng.permutation(nblk)
    table = order[None].astype(np.int32)
    k_pages = np.empty((nblk, BLOCK, HKV, D), np.float32)
    v_pages = np.empty((nblk, BLOCK, HKV, D), np.float32)
    k_pages[order] = k_cache.reshape(nblk, BLOCK, HKV, D)
    v_pages[order] = v_cache.reshape(nblk, BLOCK, HKV, D)
    return lambda: flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new,
                                           cache_seqlens=S - 1, block_table=table)


def measure(cases=CASES, rounds=15, threads=2):
    """Seconds per call, (rounds, len(cases)): each round runs every case once,
    in an order rotated round by round, so that the ratio of two cases can be
    taken within a round (paired) while the machine's speed drifts."""
    fastattn.set_num_threads(threads)
    try:
        fns = [_inputs(c) for c in cases]
        for fn in fns:
            fn()
        times = np.empty((rounds, len(cases)))
        for r in range(rounds):
            for i in np.roll(np.arange(len(cases)), r):
                t0 = time.perf_counter()
                fns[i]()
                times[r, i] = time.perf_counter() - t0
        return times
    finally:
        fastattn.set_num_threads(None)


def paired_ratio(times, cases, num, den):
    """The median over rounds of time(num) / time(den)."""
    return float(np.median(times[:, cases.index(num)] / times[:, cases.index(den)]))


class KVCacheDecode:
    """Time of one decoding step, 2 threads."""

    params = [CASES]
    param_names = ["case"]
    timeout = 300

    def setup(self, case):
        fastattn.set_num_threads(2)
        self.fn = _inputs(case)

    def teardown(self, case):
        fastattn.set_num_threads(None)

    def time_decode(self, case):
        self.fn()


class KVCacheRatio:
    """The ratios of the targets, measured in one process: kvcache / core call
    (goal <= 1.1) and paged / contiguous (goal <= 1.15)."""

    params = [["kvcache/core", "kvcache-paged/kvcache", "kvcache-paged-shuffled/kvcache"]]
    param_names = ["ratio"]
    timeout = 600

    def track_ratio(self, ratio):
        num, den = ratio.split("/")
        return paired_ratio(measure([num, den], rounds=21), [num, den], num, den)

    track_ratio.unit = "x"


if __name__ == "__main__":
    times = measure(rounds=31)
    config = fastattn.show_config(print_=False)
    print(f"fastattn {config['version']}, {config['simd']} kernels, 2 threads, "
          f"B=1 H={H}/{HKV} S={S} D={D}, block size {BLOCK}; median of 31 paired rounds")
    for i, case in enumerate(CASES):
        print(f"{case:24s} {np.median(times[:, i]) * 1e3:8.2f} ms (best {times[:, i].min() * 1e3:.2f})")
    print(f"{'kvcache / core':34s} {paired_ratio(times, CASES, 'kvcache', 'core'):.3f}x  "
          f"(goal <= 1.1)")
    for paged in ("kvcache-paged", "kvcache-paged-shuffled"):
        print(f"{paged + ' / kvcache':34s} {paired_ratio(times, CASES, paged, 'kvcache'):.3f}x  "
              f"(goal <= 1.15)")
