"""Attention beyond one process with fastattn.dask: a million keys, and many sequences.

Part 1 -- long context. One block of queries attends to the keys of one million
tokens (D=128: float32 k and v of 512 MB each), held as chunks on a
``distributed.LocalCluster`` of 2 worker processes whose memory limit is well
below the whole k and v: no worker ever holds all the keys. Each task computes
exact attention of the queries over one chunk of keys where that chunk lives,
and the partial results (output and log-sum-exp) are merged with
``fastattn.merge_attention`` in a tree. The script prints the time, the peak
memory of each worker, and the error against an in-memory computation over all
the keys for a subsample of the query rows (done in this process, which gathers
k and v chunk by chunk for the check; ``--no-check`` skips it).

Part 2 -- many sequences. A batch of 10 000 short causal sequences chunked on
the batch axis: one task per chunk, mapped over the workers.

    python examples/long_context_dask.py                 # both parts
    python examples/long_context_dask.py --keys 262144   # smaller
    python examples/long_context_dask.py --threads 2     # fastattn threads per worker

Needs the optional extra: ``pip install ".[dask]"`` (from the project's directory).
"""
import argparse
import resource
import time

import numpy as np

import dask
import dask.array as da
import distributed

import fastattn
import fastattn.dask as fdask

MiB = 2**20


def peak_rss():
    """This process's peak resident memory, in bytes (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def gather_by_chunk(client, x):
    """x (chunked on axis 0) as one NumPy array in this process, fetched one chunk
    at a time (a worker never serializes more than a chunk at once)."""
    result = np.empty(x.shape, x.dtype)
    start = 0
    for i in range(x.numblocks[0]):
        part = client.compute(x.blocks[i], sync=True)
        result[start:start + len(part)] = part
        start += len(part)
    return result


def long_context(client, args):
    S, D, L = args.keys, 128, args.queries
    chunk = -(-S // args.chunks)
    print(f"\n== long context: {L} queries x {S} keys, D={D}, float32 k and v of "
          f"{S * D * 4 / MiB:.0f} MiB each, {args.chunks} chunks of {chunk} keys ==")
    # k and v are made on the workers, chunk by chunk, and kept there (persist):
    # the client never holds them.
    rng = da.random.default_rng(1)  # uniform in [-1, 1): quicker to make than normals
    k, v = (2 * rng.random((S, D), chunks=(chunk, D), dtype=np.float32) - 1 for _ in range(2))
    k, v = client.persist([k, v])
    distributed.wait([k, v])
    nbytes = client.nbytes(summary=False)
    held = [sum(nbytes[key] for key in keys) for keys in client.has_what().values()]
    print("k and v chunks held per worker (in memory or spilled to its disk):",
          ", ".join(f"{n / MiB:.0f} MiB" for n in held))
    q = np.random.default_rng(2).standard_normal((L, D), dtype=np.float32) * 2.0

    o, lse = fdask.scaled_dot_product_attention(q, k, v, return_lse=True)
    t0 = time.perf_counter()
    o, lse = client.compute([o, lse], sync=True)
    elapsed = time.perf_counter() - t0
    print(f"fastattn.dask: {elapsed:.2f} s for {L} x {S} (o {o.shape}, lse {lse.shape})")
    for addr, rss in client.run(peak_rss).items():
        print(f"  worker {addr}: peak memory {rss / MiB:.0f} MiB")

    if args.check:
        rows = np.random.default_rng(3).choice(L, size=min(L, 16), replace=False)
        kk, vv = gather_by_chunk(client, k), gather_by_chunk(client, v)  # for the check only
        t0 = time.perf_counter()
        want, want_lse = fastattn.scaled_dot_product_attention(q[rows], kk, vv, return_lse=True)
        t_mem = time.perf_counter() - t0
        err = np.abs(o[rows] - want).max() / np.abs(want).max()
        err_lse = np.abs(lse[rows] - want_lse).max()
        print(f"vs in-memory fastattn over all {S} keys, {len(rows)} query rows "
              f"({t_mem:.2f} s): max |o - o_ref| / max |o_ref| = {err:.2e}, "
              f"max |lse - lse_ref| = {err_lse:.2e}")
        del kk, vv


def many_sequences(client, args):
    B, H, L, D = args.sequences, 2, 32, 64
    per_chunk = -(-B // args.seq_chunks)
    print(f"\n== many sequences: {B} causal sequences of {L} tokens, {H} heads, D={D}, "
          f"{args.seq_chunks} chunks of {per_chunk} sequences ==")
    rng = da.random.default_rng(4)
    q, k, v = (2 * rng.random((B, H, L, D), chunks=(per_chunk, H, L, D), dtype=np.float32) - 1
               for _ in range(3))
    o = fdask.scaled_dot_product_attention(q, k, v, is_causal=True)
    t0 = time.perf_counter()
    result = client.compute(o, sync=True)
    print(f"fastattn.dask: {time.perf_counter() - t0:.2f} s (with making the inputs on the "
          f"workers), result {result.shape}")
    if args.check:
        qs, ks, vs = dask.compute(q[:100], k[:100], v[:100])
        want = fastattn.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        print(f"vs in-memory on the first 100 sequences: max |o - o_ref| = "
              f"{np.abs(result[:100] - want).max():.2e}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=2**20, help="keys (default 1048576)")
    parser.add_argument("--queries", type=int, default=256, help="query rows (default 256)")
    parser.add_argument("--chunks", type=int, default=16, help="key chunks (default 16)")
    parser.add_argument("--sequences", type=int, default=10_000,
                        help="sequences of part 2 (default 10000)")
    parser.add_argument("--seq-chunks", type=int, default=10, help="chunks of part 2")
    parser.add_argument("--memory-limit", default="640MiB",
                        help="memory limit per worker (default 640MiB; k and v are 1 GiB)")
    parser.add_argument("--threads", type=int, default=1,
                        help="fastattn threads in each worker (default 1)")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the comparisons with in-memory results")
    args = parser.parse_args(argv)

    # Dask's default memory policy: a worker past 60% of its limit spills chunks to
    # disk and reads them back when a task needs them.
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     memory_limit=args.memory_limit,
                                     dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        print(f"LocalCluster: 2 worker processes, 1 thread each, memory limit "
              f"{args.memory_limit} each")
        if args.threads > 1:
            fdask.set_worker_threads(client, args.threads)
        print("fastattn threads per worker:", sorted(set(client.run(fastattn.get_num_threads)
                                                         .values())))
        long_context(client, args)
        client.restart()  # fresh workers (the thread setting is a plugin: it stays)
        many_sequences(client, args)


if __name__ == "__main__":
    main()
