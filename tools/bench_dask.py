"""Time fastattn.dask on a 2-worker LocalCluster against the in-memory call, and
merge_attention against one read of its inputs (the Dask table of docs/performance.rst).

    python tools/bench_dask.py              # all three rows
    python tools/bench_dask.py --only merge --repeat 5

Each row is the best of --repeat runs, both sides measured in this one run:
- causal L=S=16384, D=64, 8 heads, chunks of 4096 on L and S: a LocalCluster of
  2 worker processes with 1 thread each (inputs persisted on the workers) vs
  fastattn.scaled_dot_product_attention in this process with 2 threads;
- decode: 1 query against 1M keys (D=128) in 8 chunks held by the 2 workers vs
  one process holding all the keys (2 threads);
- merge_attention of 8 partials of (8, 4096, 128), 1 thread, vs reading them
  once (numpy.max over each partial, 1 thread).
"""
import argparse
import os
import platform
import time

import numpy as np

import fastattn


def best(fn, repeat):
    fn()  # warm-up (first-touch of pages, worker imports)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def row(name, mine, peer, what, target):
    ratio = mine / peer
    print(f"| {name} | {mine * 1e3:.0f} ms | {peer * 1e3:.0f} ms ({what}) | {ratio:.2f}x "
          f"| <= {target}x |", flush=True)


def dask_rows(repeat, only):
    import dask.array as da
    import distributed

    import fastattn.dask as fdask

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, memory_limit="4GiB",
                                  silence_logs=50) as cluster, \
            distributed.Client(cluster) as client:
        rng = np.random.default_rng(0)
        if only in (None, "causal"):
            q, k, v = (rng.standard_normal((1, 8, 16384, 64), dtype=np.float32)
                       for _ in range(3))
            dq, dk, dv = client.persist([da.from_array(x, chunks=(1, 8, 4096, 64))
                                         for x in (q, k, v)])
            distributed.wait([dq, dk, dv])
            o = fdask.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
            t_dask = best(lambda: client.compute(o, sync=True), repeat)
            fastattn.set_num_threads(2)
            t_mem = best(lambda: fastattn.scaled_dot_product_attention(q, k, v, is_causal=True),
                         repeat)
            fastattn.set_num_threads(None)
            row("causal L=S=16384, D=64, 8 heads, chunks 4096", t_dask, t_mem,
                "in memory, 2 threads", 1.5)
            del q, k, v, dq, dk, dv, o
        if only in (None, "decode"):
            S, D = 2**20, 128
            q = rng.standard_normal((1, D), dtype=np.float32)
            drng = da.random.default_rng(1)
            dk, dv = client.persist([drng.standard_normal((S, D), chunks=(S // 8, D),
                                                          dtype=np.float32) for _ in range(2)])
            distributed.wait([dk, dv])
            o = fdask.scaled_dot_product_attention(q, dk, dv)
            t_dask = best(lambda: client.compute(o, sync=True), repeat)
            k, v = dk.compute(), dv.compute()
            fastattn.set_num_threads(2)
            t_mem = best(lambda: fastattn.scaled_dot_product_attention(q, k, v), repeat)
            fastattn.set_num_threads(None)
            row("decode: 1 query x 1M keys, D=128, 8 chunks", t_dask, t_mem,
                "one process, 2 threads", 1.3)


def merge_row(repeat):
    rng = np.random.default_rng(0)
    outs = [rng.standard_normal((8, 4096, 128), dtype=np.float32) for _ in range(8)]
    lses = [rng.standard_normal((8, 4096), dtype=np.float32) for _ in range(8)]
    o = np.empty_like(outs[0])
    fastattn.set_num_threads(1)
    t_merge = best(lambda: fastattn.merge_attention(outs, lses, out=o), repeat)
    fastattn.set_num_threads(None)
    t_read = best(lambda: [np.max(p) for p in outs], repeat)
    row("merge_attention, 8 partials of (8, 4096, 128)", t_merge, t_read,
        "numpy.max over each once", 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description="fastattn.dask and merge_attention timings")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["causal", "decode", "merge"])
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_name()}, {len(os.sched_getaffinity(0))} cores; fastattn "
          f"{fastattn.__version__}")
    print("| case | fastattn | peer | ratio | target |\n|---|---|---|---|---|")
    if args.only in (None, "merge"):
        merge_row(args.repeat)
    if args.only != "merge":
        dask_rows(args.repeat, args.only)


if __name__ == "__main__":
    main()
