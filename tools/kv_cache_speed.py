"""Decoding and prefill from float32, float16, q8_0 and q4_0 KV caches, alternated.

Each case times the four caches call by call in one process (so that a
drifting machine moves them alike) and prints the median times and the
medians of the per-round ratios q8_0/float16, q8_0/float32, q4_0/float16
(docs/performance.rst's table of quantized caches):

    python tools/kv_cache_speed.py [--threads 2,16] [--rounds 21]

Unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE in the command for a fair
machine (they do not touch fastattn, but the peak probe shares the cores).
"""
import argparse
import sys

import numpy as np

import fastattn
from fastattn._bench import as_layout, best_time, fma_peaks, kv_operand

KVS = ("float32", "float16", "q8_0", "q4_0")


def run(shape, layout, threads, causal, rounds, out=sys.stdout):
    """Time one case; return {cache: median seconds} (and print its row)."""
    B, H, Hkv, L, S, D = shape
    rng = np.random.default_rng(0)
    fastattn.set_num_threads(threads)
    q = rng.standard_normal((B, H, L, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, S, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, S, D), dtype=np.float32)
    qa = as_layout(q, layout)
    calls = {}
    for kv in KVS:
        ka, va = kv_operand(k, kv, layout), kv_operand(v, kv, layout)
        calls[kv] = (lambda ka=ka, va=va: fastattn.scaled_dot_product_attention(
            qa, ka, va, enable_gqa=H != Hkv, is_causal=causal))
        calls[kv]()  # warm up
    t = {kv: [] for kv in calls}
    for _ in range(rounds):
        for kv, fn in calls.items():
            t[kv].append(best_time(fn, 1))
    med = {kv: float(np.median(x)) for kv, x in t.items()}

    def ratio(a, b):
        return float(np.median([x / y for x, y in zip(t[a], t[b])]))

    label = (f"B={B} H={H}/{Hkv} L={L} S={S} D={D}{' causal' if causal else ''} {layout} "
             f"{threads}t")
    print(f"{label:<50}" + "".join(f"{med[kv] * 1e3:9.2f}" for kv in KVS)
          + f"{ratio('q8_0', 'float16'):9.2f}{ratio('q8_0', 'float32'):9.2f}"
          + f"{ratio('q4_0', 'float16'):9.2f}", file=out, flush=True)
    return med


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="2",
                        help="comma-separated thread counts of the decoding rows (default 2)")
    parser.add_argument("--rounds", type=int, default=21, help="rounds of the decoding rows")
    args = parser.parse_args(argv)
    threads = [int(x) for x in args.threads.split(",")]
    print(f"simd {fastattn.show_config(mode='dicts')['simd']}; FMA peak GFLOP/s: "
          f"{fma_peaks(1)} on 1 thread, {fma_peaks(max(threads))} on {max(threads)}")
    print(f"{'case':<50}" + "".join(f"{kv + ' ms':>9}" for kv in KVS)
          + f"{'q8/f16':>9}{'q8/f32':>9}{'q4/f16':>9}")
    decode = (1, 32, 8, 1, 16384, 128)
    for n in threads:
        for layout in ("bhld", "blhd"):
            run(decode, layout, n, False, args.rounds)
    run(decode, "bhld", 1, False, max(3, args.rounds // 2))
    run((1, 32, 8, 1, 1024, 128), "bhld", threads[0], False, 2 * args.rounds)
    run((1, 8, 8, 2048, 2048, 128), "bhld", threads[0], True, 5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
