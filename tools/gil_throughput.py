"""Throughput of fastattn calls from 1 and 2 Python threads, one OpenMP thread each.

If the kernels release the GIL, two Python threads make close to twice the
calls per second of one (given two free cores). A measurement to report, not a test:

    PYTHONPATH=src python tools/gil_throughput.py [seconds]
"""
import sys
import threading
import time

import numpy as np

import fastattn


def main(seconds=3.0):
    fastattn.set_num_threads(1)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 256, 64)).astype(np.float32) for _ in range(3))

    def call():
        fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)

    call()
    rates = {}
    for nthreads in (1, 2):
        counts = [0] * nthreads
        stop = time.perf_counter() + seconds

        def worker(i):
            while time.perf_counter() < stop:
                call()
                counts[i] += 1
        start = time.perf_counter()
        pool = [threading.Thread(target=worker, args=(i,)) for i in range(nthreads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        rates[nthreads] = sum(counts) / (time.perf_counter() - start)
        print(f"{nthreads} Python thread(s): {rates[nthreads]:.1f} calls/s")
    print(f"speed-up with 2 threads: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
