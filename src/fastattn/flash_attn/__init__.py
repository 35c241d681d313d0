"""FlashAttention's Python API on the CPU, over fastattn's kernels.

``flash_attn_func``, ``flash_attn_varlen_func``, ``flash_attn_with_kvcache``
and the packed forms (``flash_attn_qkvpacked_func``, ``flash_attn_kvpacked_func``
and their varlen twins) take FlashAttention 2's argument names, defaults,
layouts and return values, so that code written for ``flash_attn`` runs on
NumPy arrays without a GPU:

>>> from fastattn.flash_attn import flash_attn_func  # instead of: from flash_attn import ...

Layouts are FlashAttention's token-major ones: ``q (B, L, H, D)``,
``k``/``v (B, S, Hkv, D)``, packed ``qkv (B, L, 3, H, D)`` and ``kv (B, S,
2, Hkv, D)``; varlen ``(total, H, D)``; KV caches
``(B_cache, S_max, Hkv, D)`` or, paged, ``(num_blocks, block_size, Hkv, D)``
with a ``block_table``. They are handed to the core as ``(B, H, L, D)`` views
(``swapaxes``), never repeated per head. Results are float32 NumPy arrays.

Semantics, as in FlashAttention >= 2.1: ``causal`` is aligned to the
bottom-right corner (query ``i`` sits at key position ``i + S - L``);
``window_size=(left, right)`` allows keys ``p_i - left <= j <= p_i + right``
with -1 (any negative value) for an unbounded side; ``softcap > 0`` applies
``softcap * tanh(s / softcap)``; ``alibi_slopes`` of shape ``(H,)`` or
``(B, H)`` subtracts ``slope * |p_i - j|``; grouped-query and multi-query
attention follow from ``Hkv`` dividing ``H``. These map onto
:func:`fastattn.scaled_dot_product_attention` as ``window=(left, right)``
with None for -1, ``softcap=None`` for 0.0, ``is_causal``, ``enable_gqa``.

This is inference only: ``dropout_p != 0`` raises ``ValueError``; there is no
backward pass (``deterministic`` is accepted and has no effect: the forward
pass is deterministic, bitwise, for every thread count).

FlashAttention's neighbouring modules sit where FlashAttention has them:
:mod:`fastattn.flash_attn.bert_padding` (``unpad_input``, ``pad_input``,
``index_first_axis``) and :mod:`fastattn.flash_attn.layers.rotary`
(``apply_rotary_emb``). ``__version__`` is the FlashAttention release whose
Python API this package follows (see its comment), not fastattn's own
version; where fastattn differs from FlashAttention on purpose,
:doc:`/howto/conventions` says so.
"""
import math
import numbers

import numpy as np

import fastattn
from fastattn._quant import QuantizedArray, quantize_rows
from fastattn._attention import PAGE_MULTIPLE, paged_sdpa  # the kernel's in-place paged read
from fastattn._validate import (_FLOAT32_MAX, _is_torch_tensor, as_array, check_cu_seqlens,
                                FLASH_ATTN_KEYWORDS, check_out, check_scale, check_softcap,
                                check_window, foreign_keywords, index,
                                index_int64, int_array, new_array, shares_memory)

# The FlashAttention release whose Python API this package follows: the names,
# signatures, defaults and return values of flash_attn 2.8.3, which are those of
# every release from 2.7.0 on for the functions here (2.7.0 gave unpad_input its
# unused_mask and fifth return value). Code that checks flash_attn.__version__
# before using a feature then sees the API it gets. fastattn's own version is
# fastattn.__version__.
__version__ = "2.8.3"

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]


# ----------------------------------------------------------------------------
# Argument checks (each error names the argument, what it got, what was expected)


def _real_float_dtype(dtype):
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _array(x, name, ndim, writeable=""):
    """`x` as an ndarray of a real floating dtype with `ndim` dims (no copy),
    or a fastattn.QuantizedArray as it is (its values float32; the core
    reads its blocks). With `writeable` (what is written into it, for the
    error: a cache that k and v are appended into, an array rotated in place)
    it must be a NumPy array, a CPU torch tensor, whose memory the NumPy view
    shares, or a QuantizedArray over writeable blocks (rows written into it
    are quantized)."""
    if isinstance(x, QuantizedArray):
        if writeable and not x.blocks.flags.writeable:
            raise ValueError(f"{name} must be writeable: {writeable}")
        if x.ndim != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
        return x
    if writeable and not (isinstance(x, np.ndarray) or _is_torch_tensor(x)):
        raise TypeError(f"{name} must be a NumPy array or a CPU torch tensor (it is updated "
                        f"in place), got {type(x).__name__}")
    arr = as_array(x, name)  # torch tensors, DLPack, bfloat16: fastattn's one rule
    if writeable and not arr.flags.writeable:
        raise ValueError(f"{name} must be writeable: {writeable}")
    if not _real_float_dtype(arr.dtype):
        raise TypeError(f"{name} must have a real floating dtype (float16, bfloat16, float32 "
                        f"or float64), got {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {arr.shape}")
    return arr


def _check_headdim(q, name):
    """The head dimension (q's last axis, in the caller's layout) is at least 1."""
    if q.shape[-1] < 1:
        raise ValueError(f"{name} must have a head dimension (last axis) >= 1, got shape "
                         f"{q.shape}")


def _index_array(x, name, shape=None):
    """`x` as an int64 array (of `shape` when given); TypeError unless integer,
    ValueError for a value that int64 does not hold (named, never wrapped)."""
    arr = int_array(x, name)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an array of integers, got dtype {arr.dtype}")
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return index_int64(arr, name)


def _int(x, name, minimum=0):
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got {x!r}")
    try:
        value = index(x)
    except TypeError:
        got = type(x).__name__ + (f" of dtype {x.dtype}" if isinstance(x, np.ndarray) else "")
        raise TypeError(f"{name} must be an int, got {got}") from None
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def _bool(x, name):
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    raise TypeError(f"{name} must be a bool, got {type(x).__name__}")


def _check_dropout(dropout_p):
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise ValueError(f"dropout_p must be 0.0: fastattn.flash_attn is for inference and has "
                         f"no dropout, got {dropout_p!r}")


def _check_scale(softmax_scale):
    """softmax_scale as the core's `scale` (None = 1/sqrt(D))."""
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a float or None, got "
                        f"{type(softmax_scale).__name__}")
    try:  # the core's rule (finite in float32), under FlashAttention's name
        return check_scale(softmax_scale, 1)
    except ValueError:
        raise ValueError(f"softmax_scale must be finite (in float32), got {softmax_scale!r}") \
            from None


def _check_softcap(softcap):
    """FlashAttention's softcap (> 0 caps, any other number is off) as the core's
    (None = off)."""
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    try:
        value = float(softcap)
    except OverflowError:  # an int beyond float64's range
        value = -math.inf if softcap < 0 else math.inf  # (numbers.Real has __lt__)
    if value <= 0:  # (FlashAttention: "anything > 0 activates softcapping")
        return None
    if not value <= _FLOAT32_MAX:  # (NaN fails too)
        raise ValueError(f"softcap must be a finite float (> 0 caps, <= 0 is off; finite in "
                         f"float32), got {softcap!r}")
    return check_softcap(softcap)  # the core's rule: a normal float32


def _check_window(window_size, span):
    """FlashAttention's window_size (a negative side is unbounded) as the core's
    window (None), each side cut to `span` (more than any query-key distance:
    the same keys, positions within int64) by the core's rule. Like
    FlashAttention, it reads ``window_size[0]`` and ``window_size[1]``: a
    tuple, a list, or a NumPy array or tensor of two ints."""
    if not isinstance(window_size, (tuple, list)):
        if (isinstance(window_size, np.ndarray) or _is_torch_tensor(window_size)) \
                and np.shape(window_size) == (2,):
            window_size = [window_size[0], window_size[1]]
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right) of ints, -1 for unbounded, "
                         f"got {window_size!r}")
    sides = []
    for side, value in zip(("left", "right"), window_size):
        if _is_torch_tensor(value) or (isinstance(value, np.ndarray) and value.ndim == 0):
            value = value.item()
        if isinstance(value, (bool, np.bool_)):
            raise ValueError(f"window_size's {side} side must be an int, got {value!r}")
        try:
            value = index(value)
        except TypeError:
            raise ValueError(f"window_size's {side} side must be an int (-1 for unbounded), "
                             f"got {value!r}") from None
        sides.append(None if value < 0 else value)
    return check_window(tuple(sides), span)


def _check_alibi(alibi_slopes, B, H):
    """alibi_slopes of shape (H,) or (B, H), finite in float32, as a new float32
    array (a copy: `out` may not overlap it, and nothing written reaches it)."""
    if alibi_slopes is None:
        return None
    arr = as_array(alibi_slopes, "alibi_slopes")
    if not _real_float_dtype(arr.dtype):
        raise TypeError(f"alibi_slopes must have a real floating dtype, got {arr.dtype}")
    if arr.shape not in ((H,), (B, H)):
        raise ValueError(f"alibi_slopes must have shape (nheads,) = ({H},) or (batch_size, "
                         f"nheads) = ({B}, {H}), got {arr.shape}")
    with np.errstate(over="ignore"):  # (beyond float32: inf, reported below)
        arr32 = np.array(arr, dtype=np.float32)
    if not np.isfinite(arr32).all():
        raise ValueError(f"alibi_slopes must be finite (in float32), got "
                         f"{float(arr[~np.isfinite(arr32)].reshape(-1)[0])!r}")
    return arr32


def _check_heads(H, Hkv, what="k"):
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"the number of query heads ({H}) must be a multiple of {what}'s "
                         f"number of heads ({Hkv})")


def _check_out(out, shape, inputs):
    """`out` for a result of `shape` (None: none), by the core's rule: a float32
    ndarray (TypeError) of exactly that shape, C-contiguous, writeable, aligned
    and not overlapping any of `inputs` (ValueError): the caller's own arrays,
    not copies made of them."""
    if out is not None:
        check_out(out, shape, inputs)
    return out


def _core_options(causal, window, scale, softcap, alibi):
    """Keywords for fastattn.scaled_dot_product_attention (only those that are set)."""
    kw = dict(is_causal=causal, scale=scale)
    if window != (None, None):
        kw["window"] = window
    if softcap is not None:
        kw["softcap"] = softcap
    if alibi is not None:
        kw["alibi_slopes"] = alibi
    return kw


def _bhld(x):
    """(B, L, H, D) -> the (B, H, L, D) view the core reads; (T, H, D) -> (H, T, D)."""
    return x.swapaxes(-3, -2)


def _token_major(out_bhld, out):
    """The core's (B, H, L, Dv) result as FlashAttention's (B, L, H, Dv): a free
    reshape when L or H is 1, else one copy (into `out` when given)."""
    result = out_bhld.swapaxes(1, 2)
    if out is not None:
        if not np.shares_memory(out, out_bhld):
            np.copyto(out, result)
        return out
    return np.ascontiguousarray(result)


def _core_out(out, B, L, H, Dv):
    """The (B, H, L, Dv) buffer the core writes: `out` itself when L or H is 1
    (the same memory order), else a new array."""
    if out is not None and (L == 1 or H == 1):
        return out.reshape(B, H, L, Dv)
    return new_array((B, H, L, Dv), "the output")


# ----------------------------------------------------------------------------
# flash_attn_func


@foreign_keywords(hints=FLASH_ATTN_KEYWORDS)
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, out=None):
    """FlashAttention's ``flash_attn_func``: attention on ``(B, L, H, D)`` arrays.

    Parameters
    ----------
    q : array_like, shape (B, L, H, D), real floating dtype
        Queries, token-major (FlashAttention's layout).
    k : array_like, shape (B, S, Hkv, D), real floating dtype
        Keys; ``H % Hkv == 0`` (grouped-query heads: query head ``h`` reads kv
        head ``h // (H // Hkv)``; ``Hkv = 1`` is multi-query attention).
    v : array_like, shape (B, S, Hkv, Dv), real floating dtype
        Values. q, k and v are read as ``(B, H, L, D)`` views of the given
        arrays; they are converted to float32 as
        :func:`fastattn.scaled_dot_product_attention` converts its inputs.
    dropout_p : float, default 0.0
        Must be 0.0 (inference only).
    softmax_scale : float, optional
        Score scale; default ``1 / sqrt(D)``.
    causal : bool, default False
        Causal mask aligned to the bottom-right corner: query ``i`` sees keys
        ``j <= i + S - L``. With ``L > S`` the first ``L - S`` rows see no key
        and are 0.
    window_size : (int, int), default (-1, -1)
        ``(left, right)``: query ``i`` sees keys ``p_i - left <= j <= p_i +
        right`` with ``p_i = i + S - L``; a negative side is unbounded.
        Intersects with `causal`.
    softcap : float, default 0.0
        ``> 0``: scores become ``softcap * tanh(s / softcap)``; 0.0 is off.
    alibi_slopes : array_like, shape (H,) or (B, H), optional
        ALiBi: ``-slope * |p_i - j|`` is added to the score of query ``i``
        and key ``j``.
    deterministic : bool, default False
        Accepted for compatibility (it selects FlashAttention's backward pass);
        no effect: results are always bitwise reproducible.
    return_attn_probs : bool, default False
        Also return ``softmax_lse`` and the attention probabilities.
    out : ndarray, optional
        fastattn extension (keyword only): a writeable C-contiguous float32
        array of shape (B, L, H, Dv), not sharing memory with an input, that
        receives the output and is returned.

    Returns
    -------
    out : ndarray, float32, shape (B, L, H, Dv)
    softmax_lse : ndarray, float32, shape (B, H, L)
        Only with `return_attn_probs`: ``log(sum_j exp(s_ij))`` over the
        allowed keys (natural log of the scaled, soft-capped, biased scores).
    attn_probs : ndarray, float32, shape (B, H, L, S)
        Only with `return_attn_probs`: the softmax weights, as
        :func:`fastattn.attention_weights` gives them.

    Raises
    ------
    TypeError
        If an array has a non-floating dtype, a flag is not a bool, a number is
        not a number, or `out` is not a float32 array.
    ValueError
        If `dropout_p` is not 0, an array does not have 4 dimensions, the batch
        sizes, S, D or kv heads of q, k and v disagree, ``H % Hkv != 0``,
        `window_size` is not a pair of ints, `softmax_scale` is not finite
        in float32, `softcap` is negative, not finite in float32 or positive
        but below the smallest normal float32, `alibi_slopes` has a shape other
        than (H,) or (B, H) or is not finite in float32, or `out` has the wrong
        shape or layout or overlaps an input (the caller's arrays, also
        `alibi_slopes`, not the copies made of them).

    Notes
    -----
    Behaviour matched, from FlashAttention 2.x's docstrings and tests:
    bottom-right causal alignment (since 2.1) for ``L != S``; fully masked
    rows give an output of 0. Where FlashAttention differs by code path, fastattn
    picks one rule: the ``softmax_lse`` of a row with no allowed key is -inf (the
    log of an empty sum; FlashAttention's kernels report +inf or -inf depending on
    the path). FlashAttention returns a placeholder for the probabilities unless
    dropout is on ("for testing only"); here they are the exact weights
    (O(B H L S) memory). Any ``D`` >= 1 works (FlashAttention pads D to a
    multiple of 8 and stops at 256).

    References
    ----------
    .. [1] T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism
       and Work Partitioning", ICLR 2024; the ``flash_attn`` package's
       ``flash_attn_interface.py`` for the argument conventions.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.flash_attn import flash_attn_func
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 5, 8, 16), dtype=np.float32)  # (B, L, H, D)
    >>> k = rng.standard_normal((2, 7, 2, 16), dtype=np.float32)  # (B, S, Hkv, D)
    >>> v = rng.standard_normal((2, 7, 2, 16), dtype=np.float32)
    >>> out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    >>> out.shape, lse.shape, probs.shape
    ((2, 5, 8, 16), (2, 8, 5), (2, 8, 5, 7))
    >>> bool(probs[0, 0, 0, 3:].any())  # query 0 sits at key position 0 + 7 - 5 = 2
    False
    """
    return _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                 deterministic, return_attn_probs, out)


def _attn(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
          deterministic, return_attn_probs, out, given=None):
    """flash_attn_func's work. `given`: the caller's arrays that q, k and v are
    views of, as (name, array) pairs for out's overlap check (default: q, k, v)."""
    _check_dropout(dropout_p)
    q = _array(q, "q", 4)
    k = _array(k, "k", 4)
    v = _array(v, "v", 4)
    B, L, H, D = q.shape
    _check_headdim(q, "q")
    S, Hkv = k.shape[1], k.shape[2]
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"q, k and v must have the same batch size, got {B}, {k.shape[0]}, "
                         f"{v.shape[0]}")
    if k.shape[3] != D:
        raise ValueError(f"k's head dimension must be q's ({D}), got k of shape {k.shape}")
    if v.shape[1:3] != (S, Hkv):
        raise ValueError(f"v must have k's sequence length and heads {(S, Hkv)}, got v of "
                         f"shape {v.shape}")
    _check_heads(H, Hkv)
    Dv = v.shape[3]
    kw = _core_options(_bool(causal, "causal"), _check_window(window_size, L + S),
                       _check_scale(softmax_scale), _check_softcap(softcap),
                       _check_alibi(alibi_slopes, B, H))
    _bool(deterministic, "deterministic")
    return_attn_probs = _bool(return_attn_probs, "return_attn_probs")
    given = [("q", q), ("k", k), ("v", v)] if given is None else given
    out = _check_out(out, (B, L, H, Dv), given + [("alibi_slopes", alibi_slopes)])
    # (the probabilities first: where they do not fit, nothing has been written)
    probs = (fastattn.attention_weights(_bhld(q), _bhld(k), enable_gqa=True, **kw)
             if return_attn_probs else None)
    o = _core_out(out, B, L, H, Dv)
    o, lse = fastattn.scaled_dot_product_attention(
        _bhld(q), _bhld(k), _bhld(v), enable_gqa=True, return_lse=True, out=o, **kw)
    o = _token_major(o, out)
    return o if probs is None else (o, lse, probs)


# ----------------------------------------------------------------------------
# flash_attn_varlen_func


def _check_block_table(block_table, B, num_blocks, lengths_end, block_size, source):
    """block_table (B, max_blocks) of ints; the entries that cover positions
    [0, lengths_end[b]) must index the cache's blocks (source: where the
    lengths come from, for the error)."""
    table = _index_array(block_table, "block_table")
    if table.ndim != 2 or table.shape[0] != B:
        raise ValueError(f"block_table must have shape (batch_size, max_num_blocks_per_seq) "
                         f"with batch_size {B}, got {table.shape}")
    capacity = table.shape[1] * block_size
    if B and int(lengths_end.max(initial=0)) > capacity:
        b = int(np.argmax(lengths_end))
        raise ValueError(f"sequence {b} has {int(lengths_end[b])} keys ({source}), more "
                         f"than block_table addresses: {table.shape[1]} blocks of {block_size} "
                         f"= {capacity} positions")
    used = np.arange(table.shape[1]) < -(-lengths_end[:, None] // block_size)
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        b, j = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(f"block_table[{b}, {j}] = {int(table[b, j])} points outside the "
                         f"cache's {num_blocks} blocks")
    return table


def _self_overlapping(arr):
    """True unless `arr`'s elements provably lie at distinct addresses: with
    its axes sorted by stride, each stride must step over everything the
    axes of smaller stride span (a C or F layout, transposed or padded,
    passes; a broadcast view's stride 0 fails). Some exotic interleaved
    layouts fail too: they count as overlapping."""
    if arr.size == 0:
        return False
    span = arr.itemsize  # the bytes the axes of smaller stride span
    for st, n in sorted((abs(st), n) for n, st in zip(arr.shape, arr.strides) if n > 1):
        if st < span:
            return True
        span = st * (n - 1) + span
    return False


def _storage(x):
    """The memory x holds: a QuantizedArray's blocks (indexed by its leading
    axes, as x is), else x itself."""
    return x.blocks if isinstance(x, QuantizedArray) else x


def _first_repeat(ids):
    """The index of the first entry of the 1-d `ids` that repeats an earlier one."""
    _, first = np.unique(ids, return_index=True)
    seen = np.zeros(ids.size, bool)
    seen[first] = True
    return int(np.argmin(seen))


def _check_written_blocks(table, seqlens, end, block_size):
    """A block that k and v are appended into (positions [seqlens[b], end[b]) of
    sequence b) must appear once among the entries of block_table that any
    sequence uses (those covering [0, end[b])): else the append would write
    into positions another entry reads as its own, or write one position
    twice. Blocks that no append writes may be shared (a common prefix)."""
    B, nb = table.shape
    idx = np.arange(nb)
    used = idx < -(-end[:, None] // block_size)
    written = used & (idx >= (seqlens // block_size)[:, None]) & (end > seqlens)[:, None]
    ids, counts = np.unique(table[used], return_counts=True)
    shared = ids[counts > 1]
    bad = written & np.isin(table, shared)
    if bad.any():
        b, j = (int(i[0]) for i in np.nonzero(bad))
        block = int(table[b, j])
        other = next(f"[{int(c)}, {int(e)}]" for c, e in zip(*np.nonzero(used & (table == block)))
                     if (c, e) != (b, j))
        raise ValueError(f"block_table[{b}, {j}] = {block} is written by this call's k and v, "
                         f"but block {block} is also used at block_table{other}: a block that "
                         f"k and v are appended into must appear once in block_table (only "
                         f"blocks that no append writes, e.g. a shared prefix, may repeat)")


def _check_max_seqlen(value, name, lengths):
    """`value` as an int, at least the longest of `lengths` (FlashAttention sizes
    its grid from it: a longer sequence would be cut)."""
    value = _int(value, name)
    if lengths.size and value < lengths.max():
        raise ValueError(f"{name} ({value}) is smaller than the longest sequence "
                         f"({int(lengths.max())})")
    return int(value)


def _gather_pages(cache, table_row, start, end):
    """Positions [start, end) of one sequence of a paged cache, as (end - start,
    Hkv, D): whole blocks are gathered (a copy), then sliced."""
    bs = cache.shape[1]
    b0, b1 = start // bs, -(-end // bs)
    if b1 <= b0:
        return cache[:0].reshape((0,) + cache.shape[2:])
    pages = cache[table_row[b0:b1]].reshape((-1,) + cache.shape[2:])
    return pages[start - b0 * bs:end - b0 * bs]


@foreign_keywords(hints=FLASH_ATTN_KEYWORDS)
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, out=None):
    """FlashAttention's ``flash_attn_varlen_func``: packed variable-length batches.

    Parameters
    ----------
    q : array_like, shape (total_q, H, D), real floating dtype
        The queries of all sequences, one after the other.
    k : array_like, shape (total_k, Hkv, D), real floating dtype
        The keys; with `block_table`, a paged cache (num_blocks, block_size, Hkv, D).
    v : array_like, shape (total_k, Hkv, Dv), real floating dtype
        The values, laid out as `k`.
    cu_seqlens_q : array_like of int, shape (B + 1,)
        Offsets: sequence ``b`` is ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]``.
        Starts at 0, does not decrease, ends at total_q.
    cu_seqlens_k : array_like of int, shape (B + 1,)
        The same for k and v (ends at total_k). With `block_table`, sequence
        ``b`` has ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` keys, stored in the
        blocks ``block_table[b]``.
    max_seqlen_q, max_seqlen_k : int
        At least the longest query (key) sequence, else ValueError (FlashAttention
        sizes its grid from them). They set the shape of the returned
        probabilities.
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        As in :func:`flash_attn_func`, per sequence: query ``i`` of sequence
        ``b`` sits at key position ``i + S_b - L_b``.
    return_attn_probs : bool, default False
        Also return ``softmax_lse`` and the attention probabilities.
    block_table : array_like of int, shape (B, max_num_blocks_per_seq), optional
        Paged keys and values: position ``p`` of sequence ``b`` is row ``p %
        block_size`` of block ``block_table[b, p // block_size]``.
    out : ndarray, optional
        fastattn extension: a float32 (total_q, H, Dv) array receiving the output.

    Returns
    -------
    out : ndarray, float32, shape (total_q, H, Dv)
    softmax_lse : ndarray, float32, shape (H, total_q)
        Only with `return_attn_probs`; FlashAttention's unpadded layout (heads
        first); ``softmax_lse.T`` is the token-major (total_q, H).
    attn_probs : ndarray, float32, shape (B, H, max_seqlen_q, max_seqlen_k)
        Only with `return_attn_probs`: sequence ``b``'s weights in the top-left
        ``(L_b, S_b)`` corner, zeros elsewhere.

    Raises
    ------
    TypeError
        As :func:`flash_attn_func`; also if the offsets or `block_table` are not
        integers (Python ints that no one 64-bit integer dtype holds give a
        ValueError that names the first of them; so does a value of 2**63 or
        more in `block_table` or in the paged `cu_seqlens_k`).
    ValueError
        As :func:`flash_attn_func`; also if the offsets are not as described,
        a `max_seqlen` is smaller than a sequence, or `block_table` has the
        wrong shape, addresses fewer positions than a sequence needs or points
        outside the cache, or the paged `k` has a block size of 0.

    Notes
    -----
    One call of :func:`fastattn.varlen_attention`: each sequence's rows are
    bitwise those of :func:`flash_attn_func` on that sequence alone, and the
    work is ``sum_b L_b S_b``, not that of the padded batch. A paged ``k``/``v``
    is gathered (copied) per call.

    Examples
    --------
    Two sequences of 3 and 2 tokens packed together:

    >>> import numpy as np
    >>> from fastattn.flash_attn import flash_attn_varlen_func, flash_attn_func
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.standard_normal((5, 4, 8), dtype=np.float32) for _ in range(3))
    >>> cu = np.array([0, 3, 5], np.int32)
    >>> out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, causal=True,
    ...                                      return_attn_probs=True)
    >>> out.shape, lse.shape
    ((5, 4, 8), (4, 5))
    >>> alone = flash_attn_func(q[None, 3:], k[None, 3:], v[None, 3:], causal=True)
    >>> bool(np.array_equal(out[3:], alone[0]))
    True
    """
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, block_table, out)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs, block_table, out, given=None):
    """flash_attn_varlen_func's work. `given`: the caller's arrays that q, k, v
    and the offsets come from, as (name, array) pairs for out's overlap check
    (default: q, k, v, cu_seqlens_q, cu_seqlens_k)."""
    _check_dropout(dropout_p)
    q = _array(q, "q", 3)
    paged = block_table is not None
    k = _array(k, "k", 4 if paged else 3)
    v = _array(v, "v", 4 if paged else 3)
    total_q, H, D = q.shape
    _check_headdim(q, "q")
    Hkv = k.shape[-2]
    if k.shape[-1] != D:
        raise ValueError(f"k's head dimension must be q's ({D}), got k of shape {k.shape}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v must have k's shape but for the last axis {k.shape[:-1]}, got v of "
                         f"shape {v.shape}")
    _check_heads(H, Hkv)
    Dv = v.shape[-1]
    # (offsets by varlen_attention's rule, as int64)
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", total_q, "total_q (q.shape[0])")
    B = cu_q.size - 1
    if paged:
        if k.shape[1] < 1:
            raise ValueError(f"k must have a block size (axis 1) >= 1 with block_table, got "
                             f"shape {k.shape}")
        cu_k = _index_array(cu_seqlens_k, "cu_seqlens_k")  # (exact int64: no wrap-around)
        if cu_k.shape != (B + 1,) or cu_k[0] != 0 or (cu_k[1:] < cu_k[:-1]).any():
            raise ValueError(f"cu_seqlens_k must be {B + 1} offsets starting at 0 and not "
                             f"decreasing, got {cu_k.tolist()}")
    else:
        cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], "total_k (k.shape[0])")
        if cu_k.size != B + 1:
            raise ValueError(f"cu_seqlens_k must have the length of cu_seqlens_q ({B + 1}), "
                             f"got {cu_k.size}")
    len_q, len_k = np.diff(cu_q), np.diff(cu_k)
    max_seqlen_q = _check_max_seqlen(max_seqlen_q, "max_seqlen_q", len_q)
    max_seqlen_k = _check_max_seqlen(max_seqlen_k, "max_seqlen_k", len_k)
    causal = _bool(causal, "causal")
    window = _check_window(window_size, total_q + int(cu_k[-1]))
    scale, cap = _check_scale(softmax_scale), _check_softcap(softcap)
    alibi = _check_alibi(alibi_slopes, B, H)
    _bool(deterministic, "deterministic")
    return_attn_probs = _bool(return_attn_probs, "return_attn_probs")
    # (the caller's arrays, as given: out may overlap none of them)
    if given is None:
        given = [("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                 ("cu_seqlens_k", cu_seqlens_k)]
    inputs = given + [("alibi_slopes", alibi_slopes), ("block_table", block_table)]
    probs = None
    if return_attn_probs:  # (before anything is written: its size is the caller's to choose)
        probs = new_array((B, H, max_seqlen_q, max_seqlen_k),
                          "the attention probabilities (batch_size, nheads, max_seqlen_q, "
                          "max_seqlen_k)", fill=0.0)
    if paged:
        table = _check_block_table(block_table, B, k.shape[0], len_k, k.shape[1],
                                   "by cu_seqlens_k")
        k = np.concatenate([_gather_pages(k, table[b], 0, len_k[b]) for b in range(B)]
                           or [k[:0, 0]])
        v = np.concatenate([_gather_pages(v, table[b], 0, len_k[b]) for b in range(B)]
                           or [v[:0, 0]])
        cu_k = np.concatenate([[0], np.cumsum(len_k)])
    out = _check_out(out, (total_q, H, Dv), inputs)
    kw = _core_options(causal, window, scale, cap, alibi)
    o, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, out=out, **kw)
    lse = np.ascontiguousarray(lse.T)  # FlashAttention's (H, total_q)
    if probs is None:
        return o
    for b in range(B):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if alibi is not None:
            kw["alibi_slopes"] = alibi if alibi.ndim == 1 else alibi[b]
        probs[b, :, :q1 - q0, :k1 - k0] = fastattn.attention_weights(
            _bhld(q[q0:q1]), _bhld(k[k0:k1]), enable_gqa=True, **kw)
    return o, lse, probs


# ----------------------------------------------------------------------------
# Packed inputs: q, k and v (or k and v) stacked on one axis. Each function
# hands views of the packed array to flash_attn_func or flash_attn_varlen_func
# (the core reads such strided rows in place): the same checks, rules and bits.


def _packed(x, name, layout):
    """`x` as an ndarray of `layout` (the names of its axes, e.g. ("batch_size",
    "seqlen", 3, "nheads", "headdim")): that many dimensions, the packing axis of
    the stated size, a head dimension >= 1."""
    arr = _array(x, name, len(layout))
    n = next(a for a in layout if isinstance(a, int))
    if arr.shape[layout.index(n)] != n or arr.shape[-1] < 1:
        shape = ", ".join(str(a) for a in layout)
        raise ValueError(f"{name} must have shape ({shape}) with headdim >= 1, got {arr.shape}")
    return arr


def _check_kv(q, kv):
    """kv's batch (fixed-length layout only), heads and head dimension against q's."""
    if kv.ndim == 5 and kv.shape[0] != q.shape[0]:
        raise ValueError(f"kv must have q's batch size ({q.shape[0]}), got kv of shape "
                         f"{kv.shape}")
    if kv.shape[-1] != q.shape[-1]:
        raise ValueError(f"kv's head dimension must be q's ({q.shape[-1]}), got kv of shape "
                         f"{kv.shape}")
    _check_heads(q.shape[-2], kv.shape[-2], "kv")


@foreign_keywords(hints=FLASH_ATTN_KEYWORDS)
def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, out=None):
    """FlashAttention's ``flash_attn_qkvpacked_func``: self-attention on one packed array.

    Parameters
    ----------
    qkv : array_like, shape (B, L, 3, H, D), real floating dtype
        Queries, keys and values stacked on axis 2 (``qkv[:, :, 0]`` is q,
        ``qkv[:, :, 1]`` k, ``qkv[:, :, 2]`` v), as the fused QKV projection
        of a transformer block gives them. All three have H heads; for
        grouped-query attention see :func:`flash_attn_kvpacked_func`.
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        As in :func:`flash_attn_func` (here ``S = L``).
    {outputs}

    Raises
    ------
    TypeError
        If `qkv` does not have a real floating dtype, and as
        :func:`flash_attn_func`.
    ValueError
        If `qkv` does not have 5 dimensions with 3 on axis 2 and a head
        dimension >= 1, and as :func:`flash_attn_func` (`out` checked against
        `qkv` and `alibi_slopes` as given).

    Notes
    -----
    Signature, defaults and return values are those of FlashAttention 2.x's
    ``flash_attn_qkvpacked_func`` (``flash_attn/flash_attn_interface.py``),
    which splits ``qkv`` the same way. Here the three parts are views of
    `qkv`, read in place (no copy), and the result is bitwise that of
    ``flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], ...)``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.flash_attn import flash_attn_qkvpacked_func, flash_attn_func
    >>> rng = np.random.default_rng(0)
    >>> qkv = rng.standard_normal((2, 6, 3, 4, 16), dtype=np.float32)  # (B, L, 3, H, D)
    >>> out = flash_attn_qkvpacked_func(qkv, causal=True)
    >>> out.shape
    (2, 6, 4, 16)
    >>> q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    >>> bool(np.array_equal(out, flash_attn_func(q, k, v, causal=True)))
    True
    """
    given = qkv
    qkv = _packed(qkv, "qkv", ("batch_size", "seqlen", 3, "nheads", "headdim"))
    return _attn(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
                 window_size, softcap, alibi_slopes, deterministic, return_attn_probs, out,
                 given=[("qkv", given)])


@foreign_keywords(hints=FLASH_ATTN_KEYWORDS)
def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, out=None):
    """FlashAttention's ``flash_attn_kvpacked_func``: attention with keys and values packed.

    Parameters
    ----------
    q : array_like, shape (B, L, H, D), real floating dtype
        Queries.
    kv : array_like, shape (B, S, 2, Hkv, D), real floating dtype
        Keys (``kv[:, :, 0]``) and values (``kv[:, :, 1]``) stacked on axis 2;
        ``H % Hkv == 0`` (grouped-query and multi-query attention as in
        :func:`flash_attn_func`).
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        As in :func:`flash_attn_func`.
    {outputs}

    Raises
    ------
    TypeError
        If `q` or `kv` does not have a real floating dtype, and as
        :func:`flash_attn_func`.
    ValueError
        If `kv` does not have 5 dimensions with 2 on axis 2 and a head
        dimension >= 1, or its batch size, head dimension or heads do not
        fit `q`'s, and as :func:`flash_attn_func` (`out` checked against `q`,
        `kv` and `alibi_slopes` as given).

    Notes
    -----
    Signature, defaults and return values are those of FlashAttention 2.x's
    ``flash_attn_kvpacked_func`` (``flash_attn/flash_attn_interface.py``).
    The keys and values are views of `kv`, read in place (no copy); the
    result is bitwise that of ``flash_attn_func(q, kv[:, :, 0], kv[:, :, 1],
    ...)``.

    Examples
    --------
    Cross-attention of 3 queries over 5 packed keys and values, 2 query heads
    per kv head:

    >>> import numpy as np
    >>> from fastattn.flash_attn import flash_attn_kvpacked_func, flash_attn_func
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 3, 4, 8), dtype=np.float32)       # (B, L, H, D)
    >>> kv = rng.standard_normal((2, 5, 2, 2, 8), dtype=np.float32)   # (B, S, 2, Hkv, D)
    >>> out, lse, probs = flash_attn_kvpacked_func(q, kv, return_attn_probs=True)
    >>> out.shape, lse.shape, probs.shape
    ((2, 3, 4, 8), (2, 4, 3), (2, 4, 3, 5))
    >>> bool(np.array_equal(out, flash_attn_func(q, kv[:, :, 0], kv[:, :, 1])))
    True
    """
    given = [("q", q), ("kv", kv)]
    q = _array(q, "q", 4)
    kv = _packed(kv, "kv", ("batch_size", "seqlen_k", 2, "nheads_k", "headdim"))
    _check_kv(q, kv)
    return _attn(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size,
                 softcap, alibi_slopes, deterministic, return_attn_probs, out, given=given)


@foreign_keywords(hints=FLASH_ATTN_KEYWORDS)
def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, out=None):
    """FlashAttention's ``flash_attn_varlen_qkvpacked_func``: packed sequences, packed q, k, v.

    Parameters
    ----------
    qkv : array_like, shape (total, 3, H, D), real floating dtype
        The queries (``qkv[:, 0]``), keys (``qkv[:, 1]``) and values
        (``qkv[:, 2]``) of all sequences, one after the other (as
        :func:`fastattn.flash_attn.bert_padding.unpad_input` packs them).
    cu_seqlens : array_like of int, shape (B + 1,)
        Offsets: sequence ``b`` is ``qkv[cu_seqlens[b]:cu_seqlens[b + 1]]``.
        Starts at 0, does not decrease, ends at total.
    max_seqlen : int
        At least the longest sequence, else ValueError.
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        As in :func:`flash_attn_varlen_func`, each sequence attending to
        itself (``L_b = S_b``).
    {outputs}

    Raises
    ------
    TypeError
        If `qkv` does not have a real floating dtype or `cu_seqlens` is not
        integers, and as :func:`flash_attn_varlen_func`.
    ValueError
        If `qkv` does not have 4 dimensions with 3 on axis 1 and a head
        dimension >= 1, `cu_seqlens` is not as described, `max_seqlen` is
        smaller than a sequence, and as :func:`flash_attn_varlen_func`.

    Notes
    -----
    Signature, defaults and return values are those of FlashAttention 2.x's
    ``flash_attn_varlen_qkvpacked_func`` (``flash_attn/flash_attn_interface.py``),
    which passes ``cu_seqlens`` and ``max_seqlen`` for both queries and keys,
    as here. The three parts are views of `qkv`, read in place; the result
    is bitwise that of ``flash_attn_varlen_func(qkv[:, 0], qkv[:, 1],
    qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, ...)``.

    Examples
    --------
    >>> import numpy as np
    >>> from fastattn.flash_attn import (flash_attn_varlen_qkvpacked_func,
    ...                                  flash_attn_qkvpacked_func)
    >>> rng = np.random.default_rng(0)
    >>> qkv = rng.standard_normal((7, 3, 2, 8), dtype=np.float32)  # 3 + 4 tokens
    >>> cu = np.array([0, 3, 7], np.int32)
    >>> out = flash_attn_varlen_qkvpacked_func(qkv, cu, 4, causal=True)
    >>> out.shape
    (7, 2, 8)
    >>> alone = flash_attn_qkvpacked_func(qkv[None, 3:], causal=True)  # the second one
    >>> bool(np.array_equal(out[3:], alone[0]))
    True
    """
    given = [("qkv", qkv), ("cu_seqlens", cu_seqlens)]
    qkv = _packed(qkv, "qkv", ("total", 3, "nheads", "headdim"))
    cu = check_cu_seqlens(cu_seqlens, "cu_seqlens", qkv.shape[0], "total (qkv.shape[0])")
    _check_max_seqlen(max_seqlen, "max_seqlen", np.diff(cu))
    return _varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, max_seqlen, max_seqlen, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, None, out, given=given)


@foreign_keywords(hints=FLASH_ATTN_KEYWORDS)
def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, out=None):
    """FlashAttention's ``flash_attn_varlen_kvpacked_func``: packed sequences, packed k and v.

    Parameters
    ----------
    q : array_like, shape (total_q, H, D), real floating dtype
        The queries of all sequences, one after the other.
    kv : array_like, shape (total_k, 2, Hkv, D), real floating dtype
        The keys (``kv[:, 0]``) and values (``kv[:, 1]``) of all sequences;
        ``H % Hkv == 0``.
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
        As in :func:`flash_attn_varlen_func` (`cu_seqlens_k` indexes `kv`).
    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        As in :func:`flash_attn_varlen_func`.
    {outputs}

    Raises
    ------
    TypeError
        If `q` or `kv` does not have a real floating dtype, and as
        :func:`flash_attn_varlen_func`.
    ValueError
        If `kv` does not have 4 dimensions with 2 on axis 1 and a head
        dimension >= 1, or its head dimension or heads do not fit `q`'s, and
        as :func:`flash_attn_varlen_func`.

    Notes
    -----
    Signature, defaults and return values are those of FlashAttention 2.x's
    ``flash_attn_varlen_kvpacked_func`` (``flash_attn/flash_attn_interface.py``).
    The keys and values are views of `kv`, read in place; the result is
    bitwise that of ``flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], ...)``.

    Examples
    --------
    Two sequences of 2 and 3 queries over 4 and 1 packed keys and values:

    >>> import numpy as np
    >>> from fastattn.flash_attn import flash_attn_varlen_kvpacked_func, flash_attn_varlen_func
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((5, 4, 8), dtype=np.float32)       # (total_q, H, D)
    >>> kv = rng.standard_normal((5, 2, 1, 8), dtype=np.float32)   # (total_k, 2, Hkv, D)
    >>> cu_q, cu_k = np.array([0, 2, 5]), np.array([0, 4, 5])
    >>> out = flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 3, 4)
    >>> out.shape
    (5, 4, 8)
    >>> same = flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_q, cu_k, 3, 4)
    >>> bool(np.array_equal(out, same))
    True
    """
    given = [("q", q), ("kv", kv), ("cu_seqlens_q", cu_seqlens_q),
             ("cu_seqlens_k", cu_seqlens_k)]
    q = _array(q, "q", 3)
    kv = _packed(kv, "kv", ("total_k", 2, "nheads_k", "headdim"))
    _check_kv(q, kv)
    return _varlen(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap,
                   alibi_slopes, deterministic, return_attn_probs, None, out, given=given)

# The packed forms' shared docstring lines: `return_attn_probs`, `out` and the
# results, with each function's shapes.
_PACKED_OUTPUTS = """return_attn_probs : bool, default False
        Also return ``softmax_lse`` and the attention probabilities.
    out : ndarray, optional
        fastattn extension (keyword only): a writeable C-contiguous float32
        array of shape {out}, sharing no memory with any
        argument (as given), that receives the output and is returned.

    Returns
    -------
    out : ndarray, float32, shape {out}
    softmax_lse : ndarray, float32, shape {lse}
        Only with `return_attn_probs`, as in :func:`{like}`.
    attn_probs : ndarray, float32, shape {probs}
        Only with `return_attn_probs`, as in :func:`{like}`."""
for _f, (_out, _lse, _probs, _like) in {
    flash_attn_qkvpacked_func: ("(B, L, H, D)", "(B, H, L)", "(B, H, L, L)", "flash_attn_func"),
    flash_attn_kvpacked_func: ("(B, L, H, D)", "(B, H, L)", "(B, H, L, S)", "flash_attn_func"),
    flash_attn_varlen_qkvpacked_func: ("(total, H, D)", "(H, total)",
                                       "(B, H, max_seqlen, max_seqlen)", "flash_attn_varlen_func"),
    flash_attn_varlen_kvpacked_func: ("(total_q, H, D)", "(H, total_q)",
                                      "(B, H, max_seqlen_q, max_seqlen_k)",
                                      "flash_attn_varlen_func"),
}.items():
    _f.__doc__ = (_f.__doc__ or "").replace(
        "{outputs}", _PACKED_OUTPUTS.format(out=_out, lse=_lse, probs=_probs, like=_like))
del _f, _out, _lse, _probs, _like


# ----------------------------------------------------------------------------
# flash_attn_with_kvcache


def _rotary_tables(cos, sin, D, cos_name, sin_name):
    """The rotary tables cos and sin (seqlen_ro, rotary_dim / 2) as float32
    copies, with 1 <= rotary_dim <= D (the head dimension)."""
    cos = _array(cos, cos_name, 2).astype(np.float32)
    sin = _array(sin, sin_name, 2).astype(np.float32)
    if sin.shape != cos.shape:
        raise ValueError(f"{sin_name} must have {cos_name}'s shape {cos.shape}, got "
                         f"{sin.shape}")
    if not 1 <= 2 * cos.shape[1] <= D:
        raise ValueError(f"{cos_name} must have shape (seqlen_ro, rotary_dim / 2) with "
                         f"1 <= rotary_dim <= headdim = {D}, got {cos.shape}")
    return cos, sin


def _rotate(x, cos, sin, pos, interleaved, out=None):
    """The rotary embedding, in one place for flash_attn_with_kvcache and
    layers.rotary.apply_rotary_emb: the first ``rd = 2 * cos.shape[1]``
    features of x (..., T, H, D) turned, token t by the angle of row
    ``pos[..., t]`` of the float32 tables cos and sin (rd / 2 columns), the
    same for every head. Feature pairs (2i, 2i + 1) when `interleaved` (GPT-J),
    else (i, i + rd / 2) (GPT-NeoX); the other features are kept.

    The arithmetic is float32 (FlashAttention's rotary kernel loads x, cos and
    sin as float32): ``x1 * cos - x2 * sin`` and ``x1 * sin + x2 * cos``, each
    product rounded, no fused multiply-add. The result goes into `out` (x's
    shape, any real floating dtype: cast on the write; x itself for an update
    in place), else into a new float32 copy of x; returned."""
    half = cos.shape[1]
    rd = 2 * half
    a, b = (slice(0, rd, 2), slice(1, rd, 2)) if interleaved else (slice(0, half),
                                                                    slice(half, rd))
    c = cos[pos][..., None, :]  # (..., T, 1, rd / 2): the heads share the angle
    s = sin[pos][..., None, :]
    x1 = np.array(x[..., a], dtype=np.float32)  # (copies: out may be x)
    x2 = np.array(x[..., b], dtype=np.float32)
    if out is None:
        out = np.array(x, dtype=np.float32, copy=True)
    # Both halves computed and cast to out's dtype before either is written:
    # an overflow that the caller's error state raises leaves `out` (maybe x
    # itself) as it was.
    y1 = (x1 * c - x2 * s).astype(out.dtype, copy=False)
    y2 = (x1 * s + x2 * c).astype(out.dtype, copy=False)
    out[..., a] = y1
    out[..., b] = y2
    return out


def _arith_rows(rows):
    """A basic slice selecting `rows` of the cache when they are an increasing
    arithmetic progression (a view), else None."""
    if rows.size == 1:
        return slice(int(rows[0]), int(rows[0]) + 1)
    step = int(rows[1] - rows[0])
    if step >= 1 and (np.diff(rows) == step).all():
        return slice(int(rows[0]), int(rows[-1]) + 1, step)
    return None


_PAGED_MAX_L = 64  # queries per sequence up to which pages are read in place


def _pages_in_place(qb, k_cache, v_cache, row, start, end, causal, window, kw, ob, lseb):
    """Attention of one sequence's queries qb (L, H, D) over positions [start,
    end) of a paged cache, reading the pages in place: the blocks between the
    lowest and highest block id it uses are one (n, Hkv, block_size, D) view,
    attended as a batch of n partial results under a bool mask (the sequence's
    positions, causal and window with the sequence's own alignment), then
    merged with fastattn.merge_attention into ob (H, L, Dv) and lseb (H, L).

    Returns False (nothing done) when this does not pay or does not apply: many
    queries (the mask is O(L S); gathering costs little next to the attention
    then), a block used twice, or blocks spread over more than twice their span.
    """
    L, bs = qb.shape[0], k_cache.shape[1]
    S_b = end - start
    if L > _PAGED_MAX_L or S_b == 0:
        return False
    left, right = window
    if causal:
        right = 0 if right is None else min(right, 0)
    # The keys some row may see, counted from `start`: row i sits at S_b - L + i.
    lo = 0 if left is None else max(0, S_b - L - left)
    hi = S_b - 1 if right is None else min(S_b - 1, S_b - 1 + right)
    if hi < lo:
        return False
    e0, e1 = (start + lo) // bs, (start + hi) // bs + 1  # the table entries read
    ids = row[e0:e1]
    b_lo, b_hi = int(ids.min()), int(ids.max()) + 1
    n = b_hi - b_lo
    if n > 2 * ids.size + 2 or np.unique(ids).size != ids.size:
        return False
    first = np.full(n, -1, np.int64)  # the position of each block's first row
    first[ids - b_lo] = np.arange(e0, e1) * bs
    rel = first[:, None] + np.arange(bs) - start  # (n, bs): key index from `start`
    mask = ((first >= 0)[:, None] & (rel >= lo) & (rel <= hi))[:, None, :]  # (n, 1, bs)
    p = (np.arange(L) + S_b - L)[:, None]  # (L, 1)
    if left is not None:
        mask = mask & (rel[:, None, :] >= p - left)
    if right is not None:
        mask = mask & (rel[:, None, :] <= p + right)
    po, plse = fastattn.scaled_dot_product_attention(
        _bhld(qb), k_cache[b_lo:b_hi].swapaxes(1, 2), v_cache[b_lo:b_hi].swapaxes(1, 2),
        attn_mask=mask[:, None], enable_gqa=True, return_lse=True, **kw)
    _, lseb[...] = fastattn.merge_attention(po, plse, out=ob)
    return True


@foreign_keywords(hints=FLASH_ATTN_KEYWORDS)
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, out=None):
    """FlashAttention's ``flash_attn_with_kvcache``: attention over a KV cache, for decoding.

    If `k` and `v` are given they are first written into `k_cache` and
    `v_cache` *in place* at positions ``cache_seqlens[b]``,
    ``cache_seqlens[b] + 1``, ...; then q attends to the cache's keys
    ``cache_leftpad[b] <= j < cache_seqlens[b] + k.shape[1]``, as one step of
    incremental decoding.

    Parameters
    ----------
    q : array_like, shape (B, L, H, D), real floating dtype
        The new queries.
    k_cache : ndarray or torch.Tensor, shape (B_cache, S_max, Hkv, D), real floating dtype
        The key cache; with `block_table`, paged: (num_blocks, block_size,
        Hkv, D). float32, float16 and bfloat16 (``ml_dtypes.bfloat16``)
        caches are read in place, as stored (half precision converted exactly
        inside the kernel); a float64 cache is converted to float32 (copied)
        at each call. Must be writeable when `k` is given. A CPU torch tensor
        is used through the NumPy view of its memory (as ``k_cache.numpy()``):
        appends reach the tensor.
    v_cache : ndarray, shape (B_cache, S_max, Hkv, Dv), real floating dtype
        The value cache, laid out as `k_cache`.
    k : array_like, shape (B, L_new, Hkv, D), optional
        New keys appended into `k_cache` (after the rotary embedding, when
        given), cast to the cache's dtype. Needs `v` and `cache_seqlens`.
    v : array_like, shape (B, L_new, Hkv, Dv), optional
        New values appended into `v_cache`. `q`, `k` and `v` may be views of
        the caches (the positions written included): they are read as they
        were before the call (copied first when they share memory with
        `k_cache` or `v_cache`), as NumPy's ``a[idx] = b`` reads an
        overlapping ``b``; FlashAttention's kernel leaves that case undefined.
    rotary_cos, rotary_sin : array_like, shape (seqlen_ro, rotary_dim / 2), optional
        Rotary embedding tables (both or neither; only with `k`): the first
        ``rotary_dim`` features of k are rotated at positions
        ``cache_seqlens[b] + t``; those of q at ``cache_seqlens[b] + i`` when
        `causal` or a window is on, else all rows of q at ``cache_seqlens[b]``.
        ``seqlen_ro`` must cover every position used.
    cache_seqlens : int or array_like of int, shape (B,), optional
        The number of positions of each sequence's cache already filled (the
        index where `k` is written). Default: the whole cache (``S_max``, or
        ``max_num_blocks_per_seq * block_size`` when paged).
    cache_batch_idx : array_like of int, shape (B,), optional
        Row of the cache that batch item ``b`` uses; default ``b`` (then
        ``B_cache`` must equal ``B``). Not with `block_table`. Rows may
        repeat only when nothing is appended (without `k`): two batch items
        would write into the same row.
    cache_leftpad : array_like of int, shape (B,), optional
        The first valid position of each sequence's cache (left padding);
        ``0 <= cache_leftpad[b] <= cache_seqlens[b]``. Default 0.
    block_table : array_like of int, shape (B, max_num_blocks_per_seq), optional
        Paged cache: position ``p`` of sequence ``b`` is row ``p % block_size``
        of block ``block_table[b, p // block_size]``. Any block size >= 1
        (FlashAttention needs a multiple of 256). A block may appear in
        several entries (sequences sharing a prefix) as long as `k` and `v`
        are not appended into it: a block written by this call must appear
        once among the entries in use.
    softmax_scale, causal, window_size, softcap, alibi_slopes
        As in :func:`flash_attn_func`, per sequence over its valid keys:
        query ``i`` sits at key position ``i + S_b - L`` where ``S_b =
        cache_seqlens[b] + L_new - cache_leftpad[b]`` counts from the left pad.
    rotary_interleaved : bool, default True
        True: rotate feature pairs (0, 1), (2, 3), ... (GPT-J); False: pairs
        ``(i, i + rotary_dim / 2)`` (GPT-NeoX, Llama).
    num_splits : int, default 0
        Accepted for compatibility (FlashAttention's split-KV heuristic); the
        core splits long caches over threads itself.
    return_softmax_lse : bool, default False
        Also return ``softmax_lse``.
    out : ndarray, optional
        fastattn extension: a float32 (B, L, H, Dv) array receiving the output.

    Returns
    -------
    out : ndarray, float32, shape (B, L, H, Dv)
    softmax_lse : ndarray, float32, shape (B, H, L)
        Only with `return_softmax_lse`: ``log(sum_j exp(s_ij))`` over the
        allowed keys; -inf for a row with no allowed key.

    Raises
    ------
    TypeError
        If an array has the wrong kind of dtype (indices must be integers), a
        flag is not a bool, `k_cache`/`v_cache` are neither NumPy arrays nor
        CPU torch tensors while `k` is given, an argument is a
        ``numpy.ma.MaskedArray`` (its mask would be ignored), or `out` is not
        a float32 array.
    ValueError
        Before the cache is touched: if shapes disagree (batch, heads, D,
        rotary tables), only one of `k`/`v` or of `rotary_cos`/`rotary_sin` is
        given, `k_cache` and `v_cache` share memory while `k` is given, `k` comes without `cache_seqlens`, rotary tables come without
        `k`, ``cache_seqlens[b] + L_new`` exceeds the cache (or what
        `block_table` addresses), `cache_leftpad` is outside ``[0,
        cache_seqlens]``, `cache_batch_idx` or `block_table` point outside the
        cache, `cache_batch_idx` repeats a row or `block_table` repeats a
        block that `k` and `v` are appended into, `cache_batch_idx` is given
        with `block_table`, the paged cache
        has a block size of 0, an index array holds a value that int64 does
        not (named; never wrapped), the rotary tables do not cover the
        positions used, the cache is read-only while `k` is given, and as
        :func:`flash_attn_func` (`out` checked against every argument as the
        caller gave it: q before the rotary embedding, the index arrays
        before their conversion). Should the attention itself fail after the
        append (e.g. out of memory), the positions written are restored
        before the error propagates: the cache is updated only by a call
        that returns.

    Notes
    -----
    Behaviour matched, from FlashAttention 2.x's docstring, its
    ``test_flash_attn_kvcache`` and its kernel: `cache_seqlens` and the
    rotary positions are absolute cache positions (left padding included);
    the causal and window alignment count from the left pad; causal or any
    window (a side below the cache length) makes q's rotary positions per
    row, else all of q's rows share position ``cache_seqlens[b]``; a row with
    no allowed key outputs 0 (its lse is -inf). fastattn extensions, each
    checked: `cache_leftpad` also works with a paged cache, rotary_dim need
    only be even, and any block size is accepted.

    The cache is read in place, in its own dtype. A contiguous cache: in one
    call when every sequence uses the same key range and the rows form a
    regular slice, else one call per sequence. A paged cache: by the kernel
    itself, with the contiguous cache's bits, when the block size is a
    multiple of 64, every sequence has the same length, there is no left pad,
    softcap or ALiBi; otherwise, for up to 64 queries per sequence without
    ALiBi, as the blocks a sequence spans in one batch of partial results
    under a mask, merged with :func:`fastattn.merge_attention` (equal to the
    contiguous result to float32 rounding, not bitwise); otherwise its
    blocks are gathered (copied) per call.

    Examples
    --------
    One decoding step: two sequences whose caches hold 3 and 5 tokens get one
    new token each, appended in place.

    >>> import numpy as np
    >>> from fastattn.flash_attn import flash_attn_with_kvcache
    >>> rng = np.random.default_rng(0)
    >>> k_cache = np.zeros((2, 8, 2, 16), np.float32)  # (B, S_max, Hkv, D)
    >>> v_cache = np.zeros((2, 8, 2, 16), np.float32)
    >>> q = rng.standard_normal((2, 1, 4, 16), dtype=np.float32)
    >>> k, v = (rng.standard_normal((2, 1, 2, 16), dtype=np.float32) for _ in range(2))
    >>> seqlens = np.array([3, 5], np.int32)
    >>> out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
    ...                                    causal=True, return_softmax_lse=True)
    >>> out.shape, lse.shape
    ((2, 1, 4, 16), (2, 4, 1))
    >>> bool(np.array_equal(k_cache[1, 5], k[1, 0])), bool(k_cache[1, 6].any())
    (True, False)
    """
    q = _array(q, "q", 4)
    B, L, H, D = q.shape
    _check_headdim(q, "q")
    new_kv = k is not None or v is not None
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new keys and values)")
    appended = "k and v are appended into it in place" if new_kv else ""
    k_cache = _array(k_cache, "k_cache", 4, writeable=appended)
    v_cache = _array(v_cache, "v_cache", 4, writeable=appended)
    if new_kv and shares_memory(_storage(k_cache), _storage(v_cache)):
        raise ValueError("k_cache and v_cache must not share memory when k and v are appended "
                         "(each position would be written twice)")
    for cache, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if new_kv and _self_overlapping(_storage(cache)):
            raise ValueError(f"{name}'s positions share memory (a broadcast or expanded view, "
                             f"strides {_storage(cache).strides} for shape {cache.shape}) while "
                             f"k and v "
                             f"are appended: one write would land in several positions")
    paged = block_table is not None
    Hkv = k_cache.shape[2]
    if k_cache.shape[3] != D:
        raise ValueError(f"k_cache's head dimension must be q's ({D}), got k_cache of shape "
                         f"{k_cache.shape}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache must have k_cache's shape but for the last axis "
                         f"{k_cache.shape[:3]}, got {v_cache.shape}")
    _check_heads(H, Hkv, "k_cache")
    Dv = v_cache.shape[3]
    if new_kv:
        k = _array(k, "k", 4)
        v = _array(v, "v", 4)
        L_new = k.shape[1]
        if k.shape != (B, L_new, Hkv, D):
            raise ValueError(f"k must have shape (batch_size, seqlen_new, nheads_k, headdim) = "
                             f"({B}, seqlen_new, {Hkv}, {D}), got {k.shape}")
        if v.shape != (B, L_new, Hkv, Dv):
            raise ValueError(f"v must have shape {(B, L_new, Hkv, Dv)} (as k, with v_cache's "
                             f"head dimension), got {v.shape}")
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is needed with k and v: where to append them")
    else:
        L_new = 0

    # Where each sequence lives.
    if paged:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx cannot be used with block_table (a paged cache "
                             "is addressed through block_table)")
        block_size = k_cache.shape[1]
        if block_size < 1:
            raise ValueError(f"k_cache must have a block size (axis 1) >= 1 with block_table, "
                             f"got shape {k_cache.shape}")
        table = _index_array(block_table, "block_table")
        if table.ndim != 2 or table.shape[0] != B:
            raise ValueError(f"block_table must have shape (batch_size, max_num_blocks_per_seq) "
                             f"with batch_size {B}, got {table.shape}")
        capacity = table.shape[1] * block_size
        rows = None
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is None:
            if k_cache.shape[0] != B:
                raise ValueError(f"k_cache must hold one sequence per batch item ({B}), got "
                                 f"{k_cache.shape[0]}; pass cache_batch_idx to pick rows")
            rows = np.arange(B)
        else:
            rows = _index_array(cache_batch_idx, "cache_batch_idx", (B,))
            if ((rows < 0) | (rows >= k_cache.shape[0])).any():
                raise ValueError(f"cache_batch_idx must index k_cache's {k_cache.shape[0]} rows, "
                                 f"got {rows.tolist()}")
            if new_kv and L_new and np.unique(rows).size != B:
                r = _first_repeat(rows)
                raise ValueError(f"cache_batch_idx repeats row {int(rows[r])} (at {r} and "
                                 f"earlier) while k and v are appended: both batch items would "
                                 f"write into that row of the cache")
    scalar = cache_seqlens is not None and np.ndim(cache_seqlens) == 0
    if cache_seqlens is None:
        seqlens = np.full(B, capacity, np.int64)
    elif scalar:  # an int (or a 0-d integer array): every sequence
        value = _int(cache_seqlens, "cache_seqlens", minimum=-math.inf)
        # (any int: one beyond int64 is out of range, named as such below)
        seqlens = np.full(B, min(max(value, -1), capacity + 1), np.int64)
    else:
        seqlens = _index_array(cache_seqlens, "cache_seqlens", (B,))
    # (seqlens + L_new could wrap past int64: compared the other way round)
    bad = (seqlens < 0) | (seqlens > capacity - L_new)
    if B and bad.any():
        b = int(np.argmax(bad))
        got = value if scalar else int(seqlens[b])
        room = ("block_table addresses" if paged else "k_cache has (k_cache.shape[1])")
        raise ValueError(f"cache_seqlens[{b}] = {got}"
                         + (f" plus seqlen_new = {L_new}" if L_new else "")
                         + f" must lie in [0, {capacity}]: the positions {room}")
    end = seqlens + L_new
    if cache_leftpad is None:
        start = np.zeros(B, np.int64)
    else:
        start = _index_array(cache_leftpad, "cache_leftpad", (B,))
        if ((start < 0) | (start > seqlens)).any():
            raise ValueError(f"cache_leftpad must lie in [0, cache_seqlens] for each sequence, "
                             f"got {start.tolist()} with cache_seqlens {seqlens.tolist()}")
    if paged:
        table = _check_block_table(table, B, k_cache.shape[0], end, block_size,
                                   "cache_seqlens + seqlen_new")
        if new_kv and L_new:
            _check_written_blocks(table, seqlens, end, block_size)

    causal = _bool(causal, "causal")
    window = _check_window(window_size, capacity + L)
    scale, cap = _check_scale(softmax_scale), _check_softcap(softcap)
    alibi = _check_alibi(alibi_slopes, B, H)
    rotary_interleaved = _bool(rotary_interleaved, "rotary_interleaved")
    _int(num_splits, "num_splits")
    return_softmax_lse = _bool(return_softmax_lse, "return_softmax_lse")

    # (every argument as the caller gave it, which `out` must not overlap: not the
    # rotated or converted copies)
    inputs = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
              ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
              ("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
              ("cache_leftpad", cache_leftpad), ("block_table", block_table),
              ("alibi_slopes", alibi_slopes)]

    # Rotary embedding of q and the new k.
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        if not new_kv:
            raise ValueError("rotary_cos and rotary_sin need k and v (the rotary embedding is "
                             "applied to the new keys and the queries)")
        cos, sin = _rotary_tables(rotary_cos, rotary_sin, D, "rotary_cos", "rotary_sin")
        # FlashAttention: "local" is a window side below the cache length.
        local = any(side is not None and side < capacity for side in window)
        q_pos = seqlens[:, None] + (np.arange(L) if causal or local else np.zeros(L, np.int64))
        k_pos = seqlens[:, None] + np.arange(L_new)
        need = int(max(q_pos.max(initial=-1), k_pos.max(initial=-1))) + 1
        if need > cos.shape[0]:
            raise ValueError(f"rotary_cos and rotary_sin have {cos.shape[0]} positions, the "
                             f"rotary embedding needs {need}")
        q = _rotate(q, cos, sin, q_pos, rotary_interleaved)
        k = _rotate(k, cos, sin, k_pos, rotary_interleaved)

    out = _check_out(out, (B, L, H, Dv), inputs)
    lse = new_array((B, H, L), "softmax_lse")
    o = _core_out(out, B, L, H, Dv)

    # Append k and v into the cache, in place (everything has been checked).
    # q, k or v that share memory with the cache are read as they were before
    # the call (copied first, as NumPy's `a[idx] = b` reads an overlapping b).
    # The positions written are kept: should anything below fail, they are put
    # back, so that a call either updates the cache and returns, or raises
    # with the cache as it was.
    written = None
    if new_kv and L_new and B:
        q, k, v = (np.array(x) if shares_memory(_storage(x), _storage(k_cache))
                   or shares_memory(_storage(x), _storage(v_cache)) else x
                   for x in (q, k, v))
        pos = seqlens[:, None] + np.arange(L_new)  # (B, L_new)
        if paged:
            where = (np.take_along_axis(table, pos // block_size, axis=1), pos % block_size)
        else:
            where = (rows[:, None], pos)
        # (cast to the caches' dtypes, or quantized for a quantized cache,
        # before anything is written: an overflow that the caller's warning
        # filters turn into an error, or a value no block holds, stops here)
        k, v = (quantize_rows(x, c.format, name) if isinstance(c, QuantizedArray)
                else np.asarray(x, c.dtype)
                for x, c, name in ((k, k_cache, "k"), (v, v_cache, "v")))
        # (copies: fancy indexing; a quantized cache's bytes, put back as they were)
        written = (where, _storage(k_cache)[where], _storage(v_cache)[where])
    try:
        if written is not None:
            k_cache[written[0]] = k
            v_cache[written[0]] = v
        _kvcache_attention(q, k_cache, v_cache, table if paged else None, rows, start, end,
                           causal, window, scale, cap, alibi, o, lse)
    except BaseException:
        if written is not None:
            where, k_old, v_old = written
            _storage(k_cache)[where] = k_old
            _storage(v_cache)[where] = v_old
        raise
    o = _token_major(o, out)
    return (o, lse) if return_softmax_lse else o


def _kvcache_attention(q, k_cache, v_cache, table, rows, start, end, causal, window, scale, cap,
                       alibi, o, lse):
    """flash_attn_with_kvcache's attention of q (B, L, H, D) over the keys
    [start[b], end[b]) of each sequence's cache (paged with `table`, else rows
    `rows` of the contiguous cache) into o (B, H, L, Dv) and lse (B, H, L)."""
    B = q.shape[0]
    paged = table is not None
    block_size = k_cache.shape[1]
    uniform = B > 0 and (start == start[0]).all() and (end == end[0]).all()
    if (uniform and paged and not start.any() and block_size % PAGE_MULTIPLE == 0
            and cap is None and alibi is None):
        o[...], lse[...] = paged_sdpa(_bhld(q), k_cache, v_cache, table, int(end[0]),
                                      is_causal=causal, window=window, scale=scale,
                                      return_lse=True)
    elif uniform and not paged and _arith_rows(rows) is not None:
        sl, s0, s1 = _arith_rows(rows), int(start[0]), int(end[0])
        _, lse[...] = fastattn.scaled_dot_product_attention(
            _bhld(q), _bhld(k_cache[sl, s0:s1]), _bhld(v_cache[sl, s0:s1]), enable_gqa=True,
            return_lse=True, out=o, **_core_options(causal, window, scale, cap, alibi))
    else:
        for b in range(B):
            if paged and alibi is None and _pages_in_place(
                    q[b], k_cache, v_cache, table[b], int(start[b]), int(end[b]), causal, window,
                    _core_options(False, (None, None), scale, cap, None), o[b], lse[b]):
                continue
            if paged:
                kb = _gather_pages(k_cache, table[b], int(start[b]), int(end[b]))
                vb = _gather_pages(v_cache, table[b], int(start[b]), int(end[b]))
            else:
                kb = k_cache[rows[b], start[b]:end[b]]
                vb = v_cache[rows[b], start[b]:end[b]]
            slopes = None if alibi is None else alibi if alibi.ndim == 1 else alibi[b]
            kw = _core_options(causal, window, scale, cap, slopes)
            _, lse[b] = fastattn.scaled_dot_product_attention(
                _bhld(q[b]), _bhld(kb), _bhld(vb), enable_gqa=True, return_lse=True,
                out=o[b], **kw)
