"""merge_attention and fastattn.dask: speed against their in-memory baselines."""
import numpy as np

import fastattn

from .common import random


class Merge:
    """merge_attention of 8 partials of (8, 4096, 128) vs reading them once."""

    params = (["merge_attention", "read-once"], [1, 2])
    param_names = ["what", "threads"]
    timeout = 120

    def setup(self, what, threads):
        self.outs = [random((8, 4096, 128), seed) for seed in range(8)]
        self.lses = [random((8, 4096), seed + 8) for seed in range(8)]
        self.out = np.empty_like(self.outs[0])
        fastattn.set_num_threads(threads)
        if what == "read-once" and threads > 1:
            raise NotImplementedError("numpy.max reads on one thread")

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_merge(self, what, threads):
        if what == "read-once":
            for p in self.outs:
                np.max(p)
        else:
            fastattn.merge_attention(self.outs, self.lses, out=self.out)


class DaskCluster:
    """fastattn.dask on a LocalCluster of 2 single-threaded worker processes
    (inputs persisted there) vs the in-memory call with 2 threads."""

    params = (["causal-16k", "decode-1M"], ["dask-2-workers", "in-memory-2-threads"])
    param_names = ["case", "impl"]
    timeout = 600
    number = 1
    repeat = 3

    def setup(self, case, impl):
        self.cluster = self.client = None
        if case == "causal-16k":  # L=S=16384, D=64, 8 heads, chunks of 4096 on L and S
            q, k, v = (random((1, 8, 16384, 64), seed) for seed in range(3))
            chunks, kw = (1, 8, 4096, 64), dict(is_causal=True)
        else:  # one query against 1M keys (D=128) in 8 chunks
            q, k, v = random((1, 128), 0), random((2**20, 128), 1), random((2**20, 128), 2)
            chunks, kw = (2**17, 128), {}
        if impl == "in-memory-2-threads":
            fastattn.set_num_threads(2)
            self.fn = lambda: fastattn.scaled_dot_product_attention(q, k, v, **kw)
            return
        try:
            import dask.array as da
            import distributed

            import fastattn.dask as fdask
        except ImportError:
            raise NotImplementedError("dask and distributed are not installed") from None
        self.cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                                                processes=True, dashboard_address=None,
                                                memory_limit="4GiB", silence_logs=50)
        self.client = distributed.Client(self.cluster)
        dq = da.from_array(q, chunks=chunks if q.ndim == 4 else q.shape)
        dk, dv = (da.from_array(x, chunks=chunks) for x in (k, v))
        dq, dk, dv = self.client.persist([dq, dk, dv])
        distributed.wait([dk, dv])
        o = fdask.scaled_dot_product_attention(dq, dk, dv, **kw)
        self.fn = lambda: self.client.compute(o, sync=True)
        self.fn()  # workers import fastattn once

    def teardown(self, *args):
        fastattn.set_num_threads(None)
        if self.client is not None:
            self.client.close()
            self.cluster.close()

    def time_attention(self, case, impl):
        self.fn()
