"""Attention over Dask arrays: keys that do not fit one machine, or millions of sequences.

:func:`scaled_dot_product_attention` takes the arguments of
:func:`fastattn.scaled_dot_product_attention` as Dask (or NumPy) arrays chunked
on the batch, head, query (L) and key (S) axes and returns Dask arrays. The
graph has one task per (query block, key block) pair that holds an allowed key
-- each calls the in-memory function on its blocks with ``return_lse=True`` --
and the partial results of a query block are merged with
:func:`fastattn.merge_attention` in a tree. Blocks wholly outside `is_causal` or
`window` are not in the graph: causal attention is about half the tasks.

Threads on workers: Dask's nanny starts worker processes with
``OMP_NUM_THREADS=1``, so fastattn runs one OpenMP thread per task there. To give
it more, call :func:`set_worker_threads` once per cluster (a worker plugin that
calls :func:`fastattn.set_num_threads` in each worker, new ones included); keep
threads x worker threads x workers on a host at most its cores.

Needs the optional extra: ``pip install ".[dask]"`` from the project's directory (``dask[array]`` and
``distributed``).
"""
import itertools
import math
import os
import warnings
from typing import Any, Dict, List, Tuple

import numpy as np

try:
    import dask.array as da
    from dask.array.dispatch import concatenate_lookup
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError('fastattn.dask needs Dask: pip install ".[dask]" (from the project\'s '
                      "directory), or dask[array] and distributed") from exc

import fastattn
from fastattn._attention import sdpa
from fastattn._quant import QuantizedArray
from fastattn._threads import checked_num_threads
from fastattn._validate import (as_array, as_bool, attention_inputs, foreign_keywords,
                                int_array, is_bfloat16, is_masked_array, segment_pair,
                                to_float32)

__all__ = ["scaled_dot_product_attention", "set_worker_threads", "FastattnThreads"]

_SPLIT_EVERY = 8  # partials merged per task in the tree


# ----------------------------------------------------------------------------
# Threads on workers


class FastattnThreads(WorkerPlugin):
    """A ``distributed`` worker plugin that sets fastattn's thread count.

    Parameters
    ----------
    n : int
        OpenMP threads for fastattn's kernels in each worker process (see
        :func:`fastattn.set_num_threads`). Checked when the plugin is made;
        the calling process's own setting is left as it is, also where
        workers run as threads of that process (``Client(processes=False)``):
        they share its setting, which the plugin does not change.

    Raises
    ------
    TypeError
        If `n` is not an int.
    ValueError
        If `n` is not in [1, 4096].

    Examples
    --------
    >>> plugin = FastattnThreads(2)  # client.register_plugin(plugin)
    >>> plugin.n
    2
    """

    name = "fastattn-threads"
    idempotent = False

    def __init__(self, n):
        # n is checked here, in the client (set_num_threads's errors), and the
        # client's own setting is left as it is: the setting is for the workers
        if n is None:
            raise TypeError("n must be an int in [1, 4096], got None")
        self.n = int(checked_num_threads(n))  # (its errors; not None here)
        self.pid = os.getpid()

    def setup(self, worker):
        if os.getpid() != self.pid:  # (a worker thread of the caller's process: not there)
            fastattn.set_num_threads(self.n)


def _usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def set_worker_threads(client, n=None):
    """Give fastattn `n` OpenMP threads in every worker process of a cluster.

    Dask's nanny starts worker processes with ``OMP_NUM_THREADS=1`` (so that
    many tasks in parallel do not oversubscribe the cores), which leaves
    fastattn one thread per task. This registers :class:`FastattnThreads` on
    `client`: each worker, present or joining later, calls
    :func:`fastattn.set_num_threads` with `n`.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    n : int, optional
        Threads per fastattn call. Default: the cores of each host shared out,
        ``cores // (sum of the worker threads on that host)``, the smallest over
        the hosts (at least 1). Keep ``n x threads per worker x workers per
        host <= cores``: more only makes the threads wait for each other.

    Returns
    -------
    int
        The thread count set.

    Raises
    ------
    TypeError
        If `client` is not a client (it has no ``run``, ``register_plugin``
        or ``scheduler_info``).

    Warns
    -----
    RuntimeWarning
        If some workers run as threads of the calling process
        (``Client(processes=False)``): those share its setting, which this
        leaves as it is.

    Examples
    --------
    Two single-threaded workers on a 4-core machine (not run here)::

        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1)
        client = distributed.Client(cluster)
        fastattn.dask.set_worker_threads(client)   # 2 threads per fastattn call
    """
    if not all(hasattr(client, m) for m in ("run", "register_plugin", "scheduler_info")):
        raise TypeError(f"client must be a dask.distributed.Client, got "
                        f"{type(client).__name__}")
    if n is None:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        cores = client.run(_usable_cores)
        per_host: Dict[str, Tuple[int, int]] = {}
        for addr, info in workers.items():
            host = info.get("host", addr)
            threads, ncores = per_host.get(host, (0, 0))
            per_host[host] = (threads + int(info.get("nthreads", 1)), max(ncores, cores[addr]))
        n = min((max(1, c // max(1, t)) for t, c in per_host.values()), default=1)
    plugin = FastattnThreads(n)
    if os.getpid() in client.run(os.getpid).values():
        warnings.warn("some workers run in this process (a cluster of threads): they share its "
                      "fastattn thread count, which set_worker_threads leaves as it is; call "
                      "fastattn.set_num_threads here to change it", RuntimeWarning, stacklevel=2)
    client.register_plugin(plugin)
    return plugin.n


# ----------------------------------------------------------------------------
# Arguments: dtypes, shapes, chunks


def _as_dask(x, name, convert=as_array):
    """x as a dask array (a NumPy array, or anything fastattn takes as one,
    becomes one block). Its dtype and shape are checked by the in-memory
    function's checks (see _stand_in); here only what is Dask's own: masked
    blocks, and chunk sizes that must be known."""
    if is_masked_array(x) or isinstance(getattr(x, "_meta", None), np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain array, not a masked array (its mask would be "
                        f"ignored)")
    if isinstance(x, QuantizedArray):  # one block, kept quantized
        x = da.from_array(x, chunks=tuple((n,) for n in x.shape), name=False, asarray=False)
    elif not isinstance(x, da.Array):
        x = convert(x, name)  # one block (of any size: empty arrays too)
        x = da.from_array(x, chunks=tuple((n,) for n in x.shape), name=False)
    if any(math.isnan(c) for cs in x.chunks for c in cs):
        raise ValueError(f"{name} has unknown chunk sizes (shape {x.shape}): its blocks "
                         f"cannot be aligned with the other arguments; call "
                         f"{name}.compute_chunk_sizes() first")
    return x


def _stand_in(x, role):
    """A NumPy array of x's shape that the in-memory function's checks take as
    they would take x, holding no data: one row of zeros broadcast over the
    other axes (q, k and v keep their rows contiguous, so nothing is copied).
    The dtype is x's, except that a floating q ("q") becomes float32 and a
    float64 k or v ("kv") float32, as the in-memory function would convert
    them (a conversion there would copy the whole array)."""
    dtype = x.dtype
    floating = dtype.kind == "f" or is_bfloat16(dtype)
    if floating and (role == "q" or (role == "kv" and dtype == np.float64)):
        dtype = np.dtype(np.float32)
    row = np.zeros(x.shape[-1:] if x.ndim and role in ("q", "kv") else (), dtype)
    return np.broadcast_to(row, x.shape)


@concatenate_lookup.register(QuantizedArray)
def _concatenate_quantized(arrays, axis=0):
    """Dask's concatenation of QuantizedArray blocks (a rechunk that merges
    blocks of k or v): their bytes joined along a leading axis, still
    quantized (the last axis, D, is one chunk, so only one block meets it)."""
    arrays = list(arrays)
    if len(arrays) == 1:
        return arrays[0]
    first = arrays[0]
    axis = axis % first.ndim
    if axis == first.ndim - 1 or any(a.format != first.format for a in arrays):
        raise ValueError("QuantizedArray blocks join along their leading axes, in one format")
    return QuantizedArray.from_blocks(np.concatenate([a.blocks for a in arrays], axis=axis),
                                      first.format)


class _Operand:
    """A dask array argument and the output axis of each of its dims.

    roles[d] is an int (an axis of the output batch), "L", "S", "kv" (the kv
    head axis under grouped-query attention) or None (a feature axis: one chunk).
    """

    def __init__(self, name, arr, roles):
        self.name, self.arr, self.roles = name, arr, list(roles)


def _bounds(chunks):
    return set(itertools.accumulate((0,) + tuple(chunks)))


def _chunks(bounds):
    b = sorted(bounds)
    return tuple(y - x for x, y in zip(b[:-1], b[1:])) or (0,)


def _align(ops, sizes, group):
    """Common chunks for each output axis (the union of the block boundaries
    of the operands that span it; query heads widened to whole GQA groups) and
    the operands rechunked to them."""
    bounds = {axis: {0, n} for axis, n in sizes.items()}
    for op in ops:
        for d, role in enumerate(op.roles):
            if role is None:
                continue
            if role == "kv":
                bounds["h"] |= {b * group for b in _bounds(op.arr.chunks[d])}
            elif op.arr.shape[d] == sizes[role] and sizes[role] != 1:
                bounds[role] |= _bounds(op.arr.chunks[d])
    if group > 1:
        bounds["h"] = {b // group * group for b in bounds["h"]}
    chunks = {axis: _chunks(b) for axis, b in bounds.items()}
    for op in ops:
        want = []
        for d, role in enumerate(op.roles):
            n = op.arr.shape[d]
            if role == "kv":
                want.append(tuple(c // group for c in chunks["h"]))
            elif role is None or n != sizes[role] or n == 1:
                want.append((n,))  # a feature axis or a broadcast one: one block
            else:
                want.append(chunks[role])
        if tuple(want) != op.arr.chunks:
            op.arr = op.arr.rechunk(tuple(want))
    return chunks


# ----------------------------------------------------------------------------
# Tasks


class _Static:
    """A task's constant arguments, held in one object that the scheduler
    passes through untouched (its tuples of slices are not tasks or keys)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def _block(c, *arrays):
    """One (query block, key block) pair: the in-memory attention on the rows
    and keys that can meet, with return_lse; rows cut off get (0, -inf)."""
    a = {name: x[sl] for name, x, sl in zip(c.names, arrays, c.slices)}
    kw = c.kw
    ids = (a["q_ids"], a["kv_ids"]) if "q_ids" in a else None
    # ALiBi's |p_i - j| over global positions: the block's own alignment
    # shifted by c.alibi_shift (no float mask of its rows x keys)
    o, lse = sdpa(a["q"], a["k"], a["v"], a.get("attn_mask"), window=kw["window"],
                  scale=kw["scale"], softcap=kw["softcap"], alibi_slopes=a.get("alibi_slopes"),
                  segment_ids=ids, enable_gqa=kw["enable_gqa"], return_lse=True,
                  alibi_shift=c.alibi_shift)
    before, after = c.pad
    if before or after:
        o = np.pad(o, [(0, 0)] * (o.ndim - 2) + [(before, after), (0, 0)])
        lse = np.pad(lse, [(0, 0)] * (lse.ndim - 1) + [(before, after)],
                     constant_values=-np.inf)
    return o, lse


def _add_sink(part, c, sinks):
    """A query block's merged partial with its sinks added: a virtual key of
    score `sink` and value 0 in every row's softmax (once per row), with the
    in-memory rules (NaN sink: NaN row; +inf: o = 0, lse = +inf; -inf: none)."""
    o, lse = part
    sink = np.broadcast_to(np.broadcast_to(np.asarray(sinks, np.float32), c.shape[:-2])[..., None],
                           lse.shape).astype(np.float64)
    lse64 = lse.astype(np.float64)
    with np.errstate(all="ignore"):
        new = np.logaddexp(lse64, sink)
        scale = np.where(lse64 == -np.inf, 0.0, np.exp(lse64 - new))
        o = (o * scale[..., None].astype(np.float32)).astype(np.float32)
    bad_row = np.isnan(lse64) | (lse64 == np.inf)  # the partial's own NaN row stays
    o = np.where((bad_row | np.isnan(sink))[..., None], np.float32(np.nan), o)
    o = np.where(((sink == np.inf) & ~bad_row & ~np.isnan(sink))[..., None], np.float32(0), o)
    new = np.where(bad_row, lse64, np.where(np.isnan(sink), np.nan, new))
    return np.ascontiguousarray(o, np.float32), new.astype(np.float32)


def _merge(parts):
    return fastattn.merge_attention([p[0] for p in parts], [p[1] for p in parts])


def _empty(c):
    """The partial of a query block with no allowed key: o = 0, lse = -inf."""
    shape = c.shape
    return np.zeros(shape, np.float32), np.full(shape[:-1], -np.inf, np.float32)


def _pick(pair, i):
    return pair[i]


def _meet(i0, i1, j0, j1, off, left, right):
    """The query rows [ia, ib) and keys [ja, jb) of blocks [i0, i1) x [j0, j1)
    that can meet under the bounds p_i - left <= j <= p_i + right (p_i = i + off;
    None = unbounded), or None when no pair does."""
    ja = j0 if left is None else max(j0, i0 + off - left)
    jb = j1 if right is None else min(j1, i1 + off + right)
    if ja >= jb:
        return None
    ia = i0 if right is None else max(i0, ja - off - right)
    ib = i1 if left is None else min(i1, jb - off + left)
    if ia >= ib:
        return None
    return ia, ib, ja, jb


# ----------------------------------------------------------------------------
# The front end


@foreign_keywords
def scaled_dot_product_attention(q, k, v, attn_mask=None, *, is_causal=False, window=None,
                                 scale=None, softcap=None, alibi_slopes=None, sinks=None,
                                 segment_ids=None, enable_gqa=False, return_lse=False, out=None,
                                 split_every=None):
    """Scaled dot-product attention over Dask arrays, blockwise and exact.

    The same computation, keywords and results as
    :func:`fastattn.scaled_dot_product_attention`, as a Dask graph: one task per
    (query block, key block) pair that holds an allowed key, each calling the
    in-memory function on its blocks, and the partial results of each query
    block merged with :func:`fastattn.merge_attention` in a tree.

    Parameters
    ----------
    q, k, v : dask.array.Array or array_like, real floating dtype
        Shapes as in :func:`fastattn.scaled_dot_product_attention`:
        ``q (..., L, D)``, ``k (..., S, D)``, ``v (..., S, Dv)`` (with
        `enable_gqa`, ``(..., Hq, L, D)`` and ``(..., Hkv, S, .)``). Chunks on the
        batch, head, L and S axes are free; D and Dv must be one chunk each. A
        NumPy array is one block. k and v may be quantized
        (:class:`fastattn.QuantizedArray`, one block, or a dask array of
        such chunks: ``dask.array.from_array(qa, chunks, asarray=False)``);
        each task then reads its blocks quantized, with the in-memory
        function's bits, and a rechunk keeps them quantized. Where several arguments span an axis their
        chunks are aligned to the union of their block boundaries (a rechunk);
        under `enable_gqa` query-head blocks are widened to whole groups of
        ``Hq // Hkv`` heads, so that each reads one block of kv heads.
    attn_mask : dask.array.Array or array_like of bool or real floating dtype, optional
        Broadcastable to (..., L, S); chunked along with q (L) and k (S); an
        axis of length 1 broadcasts without being expanded.
    is_causal, window, scale, softcap, enable_gqa, return_lse
        As in :func:`fastattn.scaled_dot_product_attention` (bottom-right
        alignment over the whole L and S: query row ``i`` sits at key position
        ``i + S - L``).
    alibi_slopes, sinks : dask.array.Array or array_like, optional
        One value per query head, broadcasting to ``q.shape[:-2]``, as in the
        in-memory function; chunked along with the batch and head axes. The sinks
        are added to each query block's merged result (a virtual key of score
        `sink` and value 0), so they count once per row.
    segment_ids : (q_ids, kv_ids), or one integer array when L == S, optional
        As in the in-memory function: integer dask or NumPy arrays broadcasting
        to (..., L) and (..., S), chunked along with q (L) and k (S).
    out : None
        Not supported (the result is lazy); store it with ``dask.array.store``
        or compute it.
    split_every : int, optional
        Partials merged per task in the tree (default 8, at least 2).

    Returns
    -------
    out : dask.array.Array, float32, shape (..., L, Dv)
        Chunked as the aligned batch and L axes of the inputs, Dv one chunk.
    lse : dask.array.Array, float32, shape (..., L)
        Only with `return_lse`: returned as ``(out, lse)``.

    Raises
    ------
    TypeError
        As the in-memory function (dtypes, bools, scale), and when `out` is given.
    ValueError
        As the in-memory function (shapes, window, scale), and when D or Dv is
        split into several chunks, an argument has unknown chunk sizes (which
        cannot be aligned), or `split_every` is not an int >= 2.

    Notes
    -----
    Equal to the in-memory result to float32 rounding: each task computes exact
    attention over its keys and the merge is exact up to rounding. For a given
    chunking the graph is fixed and every task is deterministic, so the bits do
    not depend on the scheduler, the number of workers or the threads.

    The causal and window bounds are those of the global positions; a task
    gets them as a window in its blocks' own frame, and only the query rows
    and keys of its blocks that can meet. A pair of blocks with no such row
    and key is not in the graph. Each task holds its blocks of q, k, v and
    the mask and an output block: worker memory follows the chunk sizes, never
    L x S.

    ALiBi's distance ``|p_i - j|`` is global too: a task whose blocks' own
    alignment differs from the global one (blocks off the diagonal) has the
    kernel shift its rows' positions by the difference, so the term costs no
    memory of its own.

    Each task uses :func:`fastattn.get_num_threads` threads of the process it
    runs in: in ``distributed`` worker processes that is 1 unless
    :func:`set_worker_threads` was called.

    Examples
    --------
    >>> import numpy as np, dask.array as da, fastattn, fastattn.dask
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 64, 16), dtype=np.float32)
    >>> k = rng.standard_normal((2, 64, 16), dtype=np.float32)
    >>> v = rng.standard_normal((2, 64, 8), dtype=np.float32)
    >>> dq, dk, dv = (da.from_array(x, chunks=(1, 16, -1)) for x in (q, k, v))
    >>> o = fastattn.dask.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    >>> o.chunks
    ((1, 1), (16, 16, 16, 16), (8,))
    >>> want = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> bool(np.allclose(o.compute(scheduler="sync"), want, atol=1e-6))
    True
    """
    if out is not None:
        raise TypeError("out is not supported by fastattn.dask (the result is a lazy dask "
                        "array): use dask.array.store(result, target) or result.compute()")
    if split_every is None:
        split_every = _SPLIT_EVERY
    if isinstance(split_every, bool) or not isinstance(split_every, (int, np.integer)) \
            or split_every < 2:
        raise ValueError(f"split_every must be an int >= 2, got {split_every!r}")
    if isinstance(q, QuantizedArray):  # (a task would refuse it only when computed)
        as_array(q, "q")
    q, k, v = (_as_dask(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    mask = None if attn_mask is None else _as_dask(attn_mask, "attn_mask")
    ids = None
    if segment_ids is not None:
        if q.ndim < 2 or k.ndim < 2:  # (the validator below names these shapes)
            ids = segment_ids
        else:
            pair = segment_pair(segment_ids, q.shape[-2], k.shape[-2])
            names = (("segment_ids", "segment_ids") if pair[0] is pair[1] else
                     ("segment_ids[0] (q_ids)", "segment_ids[1] (kv_ids)"))  # (as in memory)
            ids = tuple(_as_dask(x, name, int_array) for x, name in zip(pair, names))
    # alibi_slopes and sinks hold one value per query head: computed now, so
    # that the checks of their values (finite slopes) happen here, not in tasks
    slopes, sink_values = (None if x is None else as_array(x.compute() if isinstance(x, da.Array)
                                                           else x, name)
                           for x, name in ((alibi_slopes, "alibi_slopes"), (sinks, "sinks")))
    # Every argument is checked now, by the in-memory function's own checks, on
    # stand-ins of the dask arrays' shapes and dtypes that hold no data.
    a = attention_inputs(_stand_in(q, "q"), _stand_in(k, "kv"), _stand_in(v, "kv"),
                         None if mask is None else _stand_in(mask, "mask"), is_causal, window,
                         scale, enable_gqa, softcap=softcap, alibi_slopes=slopes,
                         sinks=sink_values,
                         segment_ids=None if ids is None else tuple(
                             _stand_in(x, "ids") for x in ids))
    for arr, name, what in ((q, "q", "D"), (k, "k", "D"), (v, "v", "Dv")):
        if len(arr.chunks[-1]) > 1:
            raise ValueError(f"{name}'s last axis ({what}={arr.shape[-1]}) must be one chunk, "
                             f"got chunks {arr.chunks[-1]}: use {name}.rechunk({{-1: -1}})")
    is_causal, enable_gqa = a.is_causal, as_bool(enable_gqa, "enable_gqa")
    batch, group = a.batch, a.group
    return_lse = as_bool(return_lse, "return_lse")
    L, S, Dv = a.L, a.S, a.Dv
    left, right = a.window
    scale = a.scale
    softcap = a.softcap or None
    nb = len(batch)

    def roles(arr, tail, heads=None):
        lead = arr.ndim - len(tail) - (heads is not None)
        axes = list(range(nb - (heads is not None) - lead, nb - (heads is not None)))
        return axes + ([heads] if heads is not None else []) + tail

    hq = (nb - 1) if enable_gqa else None
    ops = [_Operand("q", q, roles(q, ["L", None], hq)),
           _Operand("k", k, roles(k, ["S", None], "kv" if enable_gqa else None)),
           _Operand("v", v, roles(v, ["S", None], "kv" if enable_gqa else None))]
    if mask is not None:
        ops.append(_Operand("attn_mask", mask, roles(mask, ["L", "S"])))
    for value, name in ((slopes, "alibi_slopes"), (sink_values, "sinks")):
        if value is not None:  # one value per query head, as float32 (as checked)
            arr = _as_dask(to_float32(value, order="K"), name)
            ops.append(_Operand(name, arr, roles(arr, [])))
    if ids is not None:
        # (a 0-d id is one id for every row or key: an axis of 1 that broadcasts)
        q_ids, kv_ids = (x[None] if x.ndim == 0 else x for x in ids)
        ops.append(_Operand("q_ids", q_ids, roles(q_ids, ["L"])))
        ops.append(_Operand("kv_ids", kv_ids, roles(kv_ids, ["S"])))
    sizes: Dict[Any, int] = {**dict(enumerate(batch)), "L": L, "S": S}
    if enable_gqa:
        sizes["h"] = sizes.pop(nb - 1)
        for op in ops:
            op.roles = ["h" if r == nb - 1 else r for r in op.roles]
    chunks = _align(ops, sizes, group)
    axes = [("h" if enable_gqa and a == nb - 1 else a) for a in range(nb)]
    starts = {axis: [0] + list(itertools.accumulate(c)) for axis, c in chunks.items()}

    # causal and window as bounds p_i - lo <= j <= p_i + hi over global positions
    hi = right
    if is_causal:
        hi = 0 if hi is None else min(hi, 0)
    lo = None if left is None else min(left, L + S)
    hi = None if hi is None else min(hi, L + S)
    off = S - L

    token = tokenize(*(op.arr.name for op in ops), is_causal, lo, hi, scale, softcap,
                     enable_gqa, split_every)
    name_block = "fastattn-sdpa-block-" + token
    name_merge = "fastattn-sdpa-merge-" + token
    name_o, name_lse = "fastattn-sdpa-" + token, "fastattn-sdpa-lse-" + token
    blocks: Dict[Any, Any] = {}
    merges: Dict[Any, Any] = {}
    outs: Dict[Any, Any] = {}
    lses: Dict[Any, Any] = {}
    kw = dict(scale=scale, softcap=softcap, enable_gqa=enable_gqa)
    block_ops = [op for op in ops if op.name != "sinks"]
    sink_op = next((op for op in ops if op.name == "sinks"), None)
    nblocks = [len(chunks[a]) for a in axes]
    nL, nS = len(chunks["L"]), len(chunks["S"])

    def key_of(op, bidx, i, j) -> Tuple[Any, ...]:
        idx = []
        for d, role in enumerate(op.roles):
            if len(op.arr.chunks[d]) == 1:
                idx.append(0)
            elif role == "L":
                idx.append(i)
            elif role == "S":
                idx.append(j)
            elif role == "kv":
                idx.append(bidx[nb - 1])
            else:
                idx.append(bidx[axes.index(role)])
        return (op.arr.name,) + tuple(idx)

    def cut(op, rows, cols):
        sl = []
        for d, role in enumerate(op.roles):
            spans = op.arr.shape[d] == sizes.get(role, -1) and sizes[role] != 1
            sl.append(rows if role == "L" and spans else cols if role == "S" and spans
                      else slice(None))
        return tuple(sl)

    for bidx in itertools.product(*(range(n) for n in nblocks)):
        bshape: Tuple[int, ...] = tuple(int(chunks[a][b]) for a, b in zip(axes, bidx))
        for i in range(nL):
            i0, i1 = starts["L"][i], starts["L"][i + 1]
            keys: List[Any] = []
            for j in range(nS):
                j0, j1 = starts["S"][j], starts["S"][j + 1]
                meet = _meet(i0, i1, j0, j1, off, lo, hi)
                if meet is None:
                    continue
                ia, ib, ja, jb = meet
                delta = ib + off - jb  # global p_i - j0 = local p_i + delta
                win = (None if lo is None else lo - delta, None if hi is None else hi + delta)
                rows, cols = slice(ia - i0, ib - i0), slice(ja - j0, jb - j0)
                key = (name_block,) + bidx + (i, j)
                blocks[key] = (_block, _Static(
                    names=[op.name for op in block_ops],
                    slices=[cut(op, rows, cols) for op in block_ops],
                    pad=(ia - i0, i1 - ib), alibi_shift=delta,
                    kw=dict(kw, window=None if win == (None, None) else win)),
                    *[key_of(op, bidx, i, j) for op in block_ops])
                keys.append(key)
            level = 0
            while len(keys) > 1:
                nxt = []
                for g in range(0, len(keys), split_every):
                    mkey = (name_merge,) + bidx + (i, level, g // split_every)
                    merges[mkey] = (_merge, keys[g:g + split_every])
                    nxt.append(mkey)
                keys, level = nxt, level + 1
            if keys:
                final = keys[0]
            else:
                final = (name_merge,) + bidx + (i, "empty")
                merges[final] = (_empty, _Static(shape=bshape + (chunks["L"][i], Dv)))
            if sink_op is not None:  # the sinks, once per row, after the merge
                key = (name_merge,) + bidx + (i, "sinks")
                merges[key] = (_add_sink, final, _Static(shape=bshape + (chunks["L"][i], Dv)),
                               key_of(sink_op, bidx, i, 0))
                final = key
            outs[(name_o,) + bidx + (i, 0)] = (_pick, final, 0)
            lses[(name_lse,) + bidx + (i,)] = (_pick, final, 1)

    inputs = [op.arr for op in ops]
    graph = HighLevelGraph.from_collections(name_block, blocks, dependencies=inputs)
    layers: Dict[str, Any] = dict(graph.layers)
    deps: Dict[str, Any] = dict(graph.dependencies)
    layers[name_merge], deps[name_merge] = merges, {name_block} | {a.name for a in inputs}
    layers[name_o], deps[name_o] = outs, {name_block, name_merge}
    layers[name_lse], deps[name_lse] = lses, {name_block, name_merge}
    bchunks = tuple(chunks[a] for a in axes)
    def graph_of(name):
        other = name_lse if name == name_o else name_o
        return HighLevelGraph({n: lay for n, lay in layers.items() if n != other},
                              {n: d for n, d in deps.items() if n != other})

    o = da.Array(graph_of(name_o), name_o,
                 bchunks + (chunks["L"], (Dv,)), dtype=np.float32,
                 meta=np.empty((0,) * (nb + 2), np.float32))
    if not return_lse:
        return o
    lse = da.Array(graph_of(name_lse), name_lse,
                   bchunks + (chunks["L"],), dtype=np.float32,
                   meta=np.empty((0,) * (nb + 1), np.float32))
    return o, lse
