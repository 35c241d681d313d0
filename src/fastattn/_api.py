"""The public functions of fastattn: checks, shaping and docstrings.

Python validates and shapes (fastattn._validate), fastattn._core releases the
GIL and calls one C entry point, and C works on contiguous float32 buffers.
The common attention call (float32 ndarrays with contiguous rows, k and v
also float16 or bfloat16, at most a bool or float32 mask, an `out=` that is
plainly fine) skips the Python checks:
_core.sdpa_plain takes it in one step, with the same kernel arguments as
fastattn._kernel.run, and declines everything else.
"""
from __future__ import annotations  # help() shows the annotations as written

import math
from typing import Literal, Optional, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fastattn._typing import AttentionResult, Float32Array, SegmentIds, Window, WithLse

from fastattn import _core
from fastattn._docs import ATTENTION_RULES, ROWWISE_NOTES, ROWWISE_RAISES, fill
from fastattn._kernel import run
from fastattn._threads import get_num_threads, set_num_threads
from fastattn._validate import (
    as_bool,
    aligned,
    as_float32,
    attention_inputs,
    check_out,
    CAUSAL_KEYWORDS,
    check_window_size,
    foreign_keywords,
    merge_inputs,
    normalize_axis,
    new_array,
    paged_inputs,
    varlen_inputs,
)

__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "scaled_dot_product_attention",
    "causal_attention",
    "sliding_window_attention",
    "attention_weights",
    "varlen_attention",
    "set_num_threads",
    "get_num_threads",
    "merge_attention",
]

# ----------------------------------------------------------------------------
# softmax, log_softmax, logsumexp


def _rowwise(x, axis, out, op, keepdims=False):
    xa = as_float32(x, "x")
    ax = normalize_axis(axis, xa.ndim)
    if op == _core.OP_LOGSUMEXP:
        dims = list(xa.shape)
        if keepdims:
            dims[ax] = 1
        else:
            del dims[ax]
        shape = tuple(dims)
    else:
        shape = xa.shape
    if out is not None:
        check_out(out, shape, [("x", x), ("x", xa)])
    last = ax == xa.ndim - 1
    # xa is C-contiguous: along the last axis its rows are already in place.
    rows = xa if last else np.ascontiguousarray(np.moveaxis(xa, ax, -1))
    n = rows.shape[-1]
    nrows = math.prod(rows.shape[:-1])
    if op == _core.OP_LOGSUMEXP or last:
        # The result's memory order is that of `rows`: write it in place.
        result = out if out is not None else new_array(shape, "the result")
        _core.rowwise(rows.reshape(-1), result.reshape(-1), nrows, n, op, get_num_threads())
        return result
    tmp = new_array(rows.shape, "the result")
    _core.rowwise(rows.reshape(-1), tmp.reshape(-1), nrows, n, op, get_num_threads())
    moved = np.moveaxis(tmp, -1, ax)
    if out is None:
        return np.ascontiguousarray(moved)
    np.copyto(out, moved)
    return out


@foreign_keywords
@fill(raises=ROWWISE_RAISES, notes=ROWWISE_NOTES)
def softmax(x: ArrayLike, axis: int = -1, *,
            out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
    """Numerically stable softmax along an axis.

    Parameters
    ----------
    x : array_like, shape (...), real floating dtype
        Input; converted to float32 (no copy when C-contiguous float32).
    axis : int, default -1
        The axis along which the weights sum to 1; negative counts from the end.
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape ``x.shape``, not sharing
        memory with `x`; receives the result and is returned.

    Returns
    -------
    ndarray, float32, shape ``x.shape``
        ``exp(x - m) / sum(exp(x - m))`` along `axis`.

    Raises
    ------{raises}

    Notes
    -----{notes}
    References
    ----------
    .. [1] J. S. Bridle, "Probabilistic interpretation of feedforward
       classification network outputs", 1990 (the softmax).

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> fastattn.softmax(np.array([1.0, 2.0, 3.0])).round(4)
    array([0.09  , 0.2447, 0.6652], dtype=float32)
    >>> fastattn.softmax(np.array([1e30, -np.inf, 0.0]))
    array([1., 0., 0.], dtype=float32)
    """
    return _rowwise(x, axis, out, _core.OP_SOFTMAX)


@foreign_keywords
@fill(raises=ROWWISE_RAISES, notes=ROWWISE_NOTES)
def log_softmax(x: ArrayLike, axis: int = -1, *,
                out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
    """Numerically stable log of the softmax along an axis.

    Parameters
    ----------
    x : array_like, shape (...), real floating dtype
        Input; converted to float32 (no copy when C-contiguous float32).
    axis : int, default -1
        The axis of the softmax; negative counts from the end.
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape ``x.shape``, not sharing
        memory with `x`; receives the result and is returned.

    Returns
    -------
    ndarray, float32, shape ``x.shape``
        ``(x - m) - log(sum(exp(x - m)))`` along `axis`.

    Raises
    ------{raises}

    Notes
    -----{notes}
    Examples
    --------
    >>> import numpy as np, fastattn
    >>> fastattn.log_softmax(np.array([0.0, 0.0])).round(4)
    array([-0.6931, -0.6931], dtype=float32)
    """
    return _rowwise(x, axis, out, _core.OP_LOG_SOFTMAX)


@foreign_keywords
@fill(raises=ROWWISE_RAISES, notes=ROWWISE_NOTES)
def logsumexp(x: ArrayLike, axis: int = -1, *, keepdims: bool = False,
              out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
    """Numerically stable ``log(sum(exp(x)))`` along an axis.

    Parameters
    ----------
    x : array_like, shape (...), real floating dtype
        Input; converted to float32 (no copy when C-contiguous float32).
    axis : int, default -1
        The axis reduced; negative counts from the end.
    keepdims : bool, default False
        Keep the reduced axis with length 1, as in NumPy reductions.
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of the result's shape, not
        sharing memory with `x`; receives the result and is returned.

    Returns
    -------
    ndarray, float32, shape ``x.shape`` without `axis` (length 1 with keepdims)
        ``m + log(sum(exp(x - m)))`` along `axis`.

    Raises
    ------{raises}

    Notes
    -----{notes}
    Examples
    --------
    >>> import numpy as np, fastattn
    >>> fastattn.logsumexp(np.array([[0.0, 0.0], [1e30, 1e30]])).round(4)
    array([6.931e-01, 1.000e+30], dtype=float32)
    >>> fastattn.logsumexp(np.zeros((2, 0)))
    array([-inf, -inf], dtype=float32)
    """
    keepdims = as_bool(keepdims, "keepdims")
    return _rowwise(x, axis, out, _core.OP_LOGSUMEXP, keepdims=keepdims)


# ----------------------------------------------------------------------------
# Attention


def _paged_sdpa(q, k_cache, v_cache, block_table, seqlen, *, is_causal=False, window=None,
                scale=None, return_lse=False):
    """Attention over a paged KV cache, read in place (private: for fastattn.flash_attn).

    q (B, Hq, L, D) float32 (any strides with contiguous rows); k_cache,
    v_cache (num_pages, block_size, Hkv, D / Dv) of float32, float16 or
    bfloat16, with ``block_size`` a multiple of 64 (_validate.PAGE_MULTIPLE);
    block_table (B, max_pages) of ints: key ``j`` of batch item ``b`` is row
    ``j % block_size`` of page ``block_table[b, j // block_size]``; every
    batch item has ``seqlen`` keys. Query head ``h`` reads kv head
    ``h // (Hq // Hkv)``. Returns out (B, Hq, L, Dv) (and lse (B, Hq, L)),
    bitwise those of scaled_dot_product_attention on the gathered cache.
    """
    a = paged_inputs(q, k_cache, v_cache, block_table, seqlen, is_causal, window, scale)
    out = new_array((a.B, a.Hq, a.L, a.Dv), "the output")
    lse = new_array((a.B, a.Hq, a.L), "lse") if return_lse else None
    run(a, out, lse)
    return (out, lse) if return_lse else out


def _sdpa(q, k, v, attn_mask, is_causal, window, scale, softcap, alibi_slopes, sinks,
          segment_ids, enable_gqa, return_lse, out, alibi_shift=0):
    if softcap is None and alibi_slopes is None and sinks is None and segment_ids is None:
        # The common call (float32 ndarrays with contiguous rows, k and v also
        # float16 or bfloat16, at most a mask, an out= it can take) in one step;
        # None when it does not apply (see _core.sdpa_plain): the general path
        # then checks everything, out included.
        result = _core.sdpa_plain(q, k, v, attn_mask, is_causal, window, scale, enable_gqa,
                                  return_lse, get_num_threads(), out)
        if result is not None:
            return result
    a = attention_inputs(q, k, v, attn_mask, is_causal, window, scale, enable_gqa,
                         softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                         segment_ids=segment_ids)
    shape = a.batch + (a.L, a.Dv)
    return_lse = as_bool(return_lse, "return_lse")
    if out is not None:
        check_out(out, shape, [("q", q), ("k", k), ("v", v), ("attn_mask", attn_mask),
                               ("alibi_slopes", alibi_slopes), ("sinks", sinks),
                               ("segment_ids", segment_ids)] + a.arrays())
    else:
        out = new_array(shape, "the output")
    lse = new_array(a.batch + (a.L,), "lse") if return_lse else None
    run(a, out, lse, alibi_shift=alibi_shift)
    return (out, lse) if return_lse else out


@overload
def scaled_dot_product_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                                 attn_mask: Optional[ArrayLike] = ..., *, is_causal: bool = ...,
                                 window: Window = ..., scale: Optional[float] = ...,
                                 softcap: Optional[float] = ...,
                                 alibi_slopes: Optional[ArrayLike] = ...,
                                 sinks: Optional[ArrayLike] = ..., segment_ids: SegmentIds = ...,
                                 enable_gqa: bool = ..., return_lse: Literal[False] = ...,
                                 out: Optional[Float32Array] = ...) -> Float32Array: ...
@overload
def scaled_dot_product_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                                 attn_mask: Optional[ArrayLike] = ..., *, is_causal: bool = ...,
                                 window: Window = ..., scale: Optional[float] = ...,
                                 softcap: Optional[float] = ...,
                                 alibi_slopes: Optional[ArrayLike] = ...,
                                 sinks: Optional[ArrayLike] = ..., segment_ids: SegmentIds = ...,
                                 enable_gqa: bool = ..., return_lse: Literal[True],
                                 out: Optional[Float32Array] = ...) -> WithLse: ...
@overload
def scaled_dot_product_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                                 attn_mask: Optional[ArrayLike] = ..., *, is_causal: bool = ...,
                                 window: Window = ..., scale: Optional[float] = ...,
                                 softcap: Optional[float] = ...,
                                 alibi_slopes: Optional[ArrayLike] = ...,
                                 sinks: Optional[ArrayLike] = ..., segment_ids: SegmentIds = ...,
                                 enable_gqa: bool = ..., return_lse: bool = ...,
                                 out: Optional[Float32Array] = ...) -> AttentionResult: ...

@foreign_keywords
@fill(rules=ATTENTION_RULES)
def scaled_dot_product_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                                 attn_mask: Optional[ArrayLike] = None, *,
                                 is_causal: bool = False, window: Window = None,
                                 scale: Optional[float] = None, softcap: Optional[float] = None,
                                 alibi_slopes: Optional[ArrayLike] = None,
                                 sinks: Optional[ArrayLike] = None,
                                 segment_ids: SegmentIds = None, enable_gqa: bool = False,
                                 return_lse: bool = False,
                                 out: Optional[Float32Array] = None) -> AttentionResult:
    """Scaled dot-product attention, fused, tiled and exact in float32.

    ``softmax(scale * q @ k.T + mask) @ v`` over the allowed keys, computed
    tile by tile with an online softmax: no (L, S) matrix is ever formed.

    Parameters
    ----------
    q : array_like, shape (..., L, D), real floating dtype
        Queries; with `enable_gqa`, shape (..., Hq, L, D). Converted to
        float32 (float16 and bfloat16 too).
    k : array_like, shape (..., S, D), real floating dtype
        Keys; with `enable_gqa`, shape (..., Hkv, S, D).
    v : array_like, shape (..., S, Dv), real floating dtype
        Values; with `enable_gqa`, shape (..., Hkv, S, Dv).
        The leading dims of q, k and v broadcast by NumPy rules (``k`` of shape
        (B, 1, S, D) serves every head: multi-query attention). k and v of
        dtype float32, float16 or bfloat16 (``ml_dtypes.bfloat16``, when
        ml_dtypes is installed) are read as stored, a half-precision KV cache
        at half the memory traffic; k and v may differ in dtype. float64 is
        converted to float32 (values beyond its range become -inf or +inf,
        as a cast makes them, without a warning). Any q, k, v whose rows (last axis) are
        contiguous are read in place whatever their other strides: a
        ``(B, L, H, D)`` array viewed as ``(B, H, L, D)`` with
        ``swapaxes(-3, -2)`` is not copied. Others are copied once.
    attn_mask : array_like of bool or real floating dtype, optional
        Broadcastable to (..., L, S). Bool: True = may attend. Float: added
        to the scores (-inf masks); float16 and float64 are converted to
        float32, values beyond its range becoming -inf or +inf as a cast
        makes them (a float64 mask of -1e300 masks), without a warning.
        Read in place, with zero strides where broadcast: never expanded
        per batch or head.
    is_causal : bool, default False
        Allow key ``j`` only when ``j <= p_i`` (bottom-right aligned).
    window : (int or None, int or None), optional
        ``(left, right)``: allow ``p_i - left <= j <= p_i + right``; None on a
        side is unbounded. FlashAttention's ``window_size=(l, r)`` with -1 for
        unbounded is ``window=(l, r)`` with None.
    scale : float, optional
        Score scale; default ``1 / sqrt(D)``. Any finite value, 0 included
        (equal weights over the allowed keys).
    softcap : float, optional
        Soft-capping of the scores, ``c * tanh(s / c)`` (Gemma 2,
        FlashAttention's ``softcap``): a finite float > 0 (at least the
        smallest normal float32); None (default) = off.
    alibi_slopes : array_like of real floats, optional
        ALiBi slopes (Press et al. 2022), one per query head: broadcasting to
        ``q.shape[:-2]``, e.g. shape (Hq,) or (B, Hq); finite. The bias is
        ``-slope * |p_i - j|`` (FlashAttention's form; under `is_causal` it
        equals BLOOM's ``+slope * j`` up to a per-row constant, which the
        softmax cancels).
    sinks : array_like of real floats, optional
        Attention-sink logits, one per query head, broadcasting to
        ``q.shape[:-2]`` (gpt-oss, ONNX Runtime's ``head_sink``): a virtual
        key of that score and value 0 in every row's softmax and lse. -inf is
        no sink; NaN gives NaN rows.
    segment_ids : (array_like of int, array_like of int) or array_like of int, optional
        Document masking for packed sequences (JAX's segment ids, a
        FlexAttention document mask): ``(q_ids, kv_ids)`` broadcasting to
        (..., L) and (..., S), or one array for both when ``L == S``; key
        ``j`` is allowed for query ``i`` only when their ids are equal (with
        `is_causal` and ``L == S`` each document is causal on its own). When
        the key ids are non-decreasing along the sequence each query row's
        keys are one range, found by bisection, and the tiles outside it are
        skipped: the cost is that of the documents, not of ``L x S``; when
        the query ids are also non-decreasing and shared by every batch item
        and head, the blocks of query rows are also cut where a document
        starts, so that no block walks the keys of two documents (the same
        bits). Other ids are checked key by key. The pair must be a tuple:
        a list (``[[0, 0, 1], [0, 1, 1]]``) is one array of ids, here those
        of a batch of two, as NumPy reads it.
    enable_gqa : bool, default False
        Grouped-query attention: the head axis is -3 and query head ``h``
        reads kv head ``h // (Hq // Hkv)``; k and v are never repeated.
    return_lse : bool, default False
        Also return ``lse[..., i] = log(sum over allowed j of exp(s_ij))``
        (natural log; with `sinks`, ``exp(sink)`` joins the sum), so results
        over disjoint key sets can be merged exactly.
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape (..., L, Dv), not sharing
        memory with any input; receives the output and is returned.

    Returns
    -------
    out : ndarray, float32, shape (..., L, Dv)
        The attention output.
    lse : ndarray, float32, shape (..., L)
        Only with `return_lse`: returned as ``(out, lse)``.

    Raises
    ------
    TypeError
        If an input is not of a real floating dtype (a mask: bool or real
        floating), `scale` or `softcap` is not a real number, `alibi_slopes`
        or `sinks` are not real floats, `segment_ids` are not integers,
        `is_causal`, `enable_gqa` are not bools, an argument is a
        ``numpy.ma.MaskedArray`` (its mask would be ignored: pass
        ``numpy.ma.filled(x, value)`` or an `attn_mask`), `out` is not a
        float32 ndarray, or a keyword is unknown (another library's name for
        an argument, such as ``dropout_p``, ``causal`` or ``attention_mask``,
        gets a message saying what to pass instead).
    ValueError
        If an input has fewer than 2 dimensions, D < 1, q's and k's D differ,
        k's and v's S differ, leading dims or the mask do not broadcast (a
        broadcast view's shape as given), heads do not divide under
        `enable_gqa`, `scale` is not finite, `softcap` is not a finite float >
        0, `alibi_slopes` or `sinks` do not broadcast to ``q.shape[:-2]``,
        `alibi_slopes` are not finite, `segment_ids` do not broadcast to
        (..., L) and (..., S) (or are one array while ``L != S``), `window` is
        not a pair of ints >= 0 or None, the result would not fit in this
        platform's address space (named with its shape), or `out` has the
        wrong shape or layout, is read-only or overlaps an argument (as the
        caller gave it, or as converted).
    MemoryError
        If the result or the kernel's working memory (O(threads x tile))
        cannot be allocated.

    Notes
    -----{rules}
    The result is bitwise identical for every thread count, and a query row's
    result does not depend on the other rows, batches or heads of the call.
    Work is parallel over (batch x heads, query tiles) with the GIL released;
    key tiles wholly outside the causal, window or (non-decreasing) segment
    bounds are skipped, so causal attention costs about half of full
    attention and a window of w keys costs O(L w D). Working memory is
    O(threads x tile).

    References
    ----------
    .. [1] A. Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    .. [2] T. Dao et al., "FlashAttention: Fast and Memory-Efficient Exact
       Attention with IO-Awareness", NeurIPS 2022 (tiling, online softmax).
    .. [3] J. Ainslie et al., "GQA: Training Generalized Multi-Query
       Transformer Models from Multi-Head Checkpoints", EMNLP 2023.
    .. [4] O. Press, N. A. Smith, M. Lewis, "Train Short, Test Long: Attention
       with Linear Biases Enables Input Length Extrapolation", ICLR 2022 (ALiBi).
    .. [5] Gemma Team, "Gemma 2: Improving Open Language Models at a Practical
       Size", 2024 (logit soft-capping).
    .. [6] G. Xiao et al., "Efficient Streaming Language Models with Attention
       Sinks", ICLR 2024; OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", 2025.

    Examples
    --------
    The worked example every explanation of attention starts from (scale 1/sqrt(2)):

    >>> import numpy as np, fastattn
    >>> q = np.array([[1.0, 0.0]])
    >>> k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> v = np.array([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])
    >>> o = fastattn.scaled_dot_product_attention(q, k, v)
    >>> o.shape, o.round(4)
    ((1, 2), array([[6.0167, 3.9833]], dtype=float32))

    Causal attention with a KV cache: 2 new queries over 5 keys, bottom-right
    aligned, and the log-sum-exp of each row:

    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((2, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    >>> o, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
    >>> o.shape, lse.shape
    ((2, 3), (2,))

    Two documents packed in one sequence, each causal on its own; a sink of
    log(3) per head adds 3 to every row's softmax denominator:

    >>> x = np.ones((1, 4, 1))  # 1 head, 4 tokens, equal scores
    >>> vals = np.arange(4.0).reshape(1, 4, 1)
    >>> ids = np.array([0, 0, 1, 1])
    >>> fastattn.causal_attention(x, x, vals, segment_ids=ids).ravel()
    array([0. , 0.5, 2. , 2.5], dtype=float32)
    >>> o, lse = fastattn.causal_attention(x, x, vals, sinks=[np.log(3.0)], scale=0.0,
    ...                                    return_lse=True)
    >>> o.ravel().round(4), np.exp(lse).round(4)
    (array([0.    , 0.2   , 0.5   , 0.8571], dtype=float32), array([[4., 5., 6., 7.]], dtype=float32))
    """
    return _sdpa(q, k, v, attn_mask, is_causal, window, scale, softcap, alibi_slopes, sinks,
                 segment_ids, enable_gqa, return_lse, out)


@overload
def causal_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                     attn_mask: Optional[ArrayLike] = ..., *, window: Window = ...,
                     scale: Optional[float] = ..., softcap: Optional[float] = ...,
                     alibi_slopes: Optional[ArrayLike] = ..., sinks: Optional[ArrayLike] = ...,
                     segment_ids: SegmentIds = ..., enable_gqa: bool = ...,
                     return_lse: Literal[False] = ...,
                     out: Optional[Float32Array] = ...) -> Float32Array: ...
@overload
def causal_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                     attn_mask: Optional[ArrayLike] = ..., *, window: Window = ...,
                     scale: Optional[float] = ..., softcap: Optional[float] = ...,
                     alibi_slopes: Optional[ArrayLike] = ..., sinks: Optional[ArrayLike] = ...,
                     segment_ids: SegmentIds = ..., enable_gqa: bool = ...,
                     return_lse: Literal[True], out: Optional[Float32Array] = ...) -> WithLse: ...
@overload
def causal_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                     attn_mask: Optional[ArrayLike] = ..., *, window: Window = ...,
                     scale: Optional[float] = ..., softcap: Optional[float] = ...,
                     alibi_slopes: Optional[ArrayLike] = ..., sinks: Optional[ArrayLike] = ...,
                     segment_ids: SegmentIds = ..., enable_gqa: bool = ...,
                     return_lse: bool = ...,
                     out: Optional[Float32Array] = ...) -> AttentionResult: ...

@foreign_keywords(hints=CAUSAL_KEYWORDS)
def causal_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                     attn_mask: Optional[ArrayLike] = None, *, window: Window = None,
                     scale: Optional[float] = None, softcap: Optional[float] = None,
                     alibi_slopes: Optional[ArrayLike] = None, sinks: Optional[ArrayLike] = None,
                     segment_ids: SegmentIds = None, enable_gqa: bool = False,
                     return_lse: bool = False,
                     out: Optional[Float32Array] = None) -> AttentionResult:
    """Causal scaled dot-product attention: ``is_causal=True``.

    Query row ``i`` attends to keys ``j <= i + S - L`` (bottom-right aligned).
    PyTorch's ``is_causal=True`` with ``L != S`` is top-left aligned instead:
    pass ``attn_mask=np.tril(np.ones((L, S), bool))`` to
    :func:`scaled_dot_product_attention` for that.

    Parameters
    ----------
    q, k, v, attn_mask, window, scale, softcap, alibi_slopes, sinks, segment_ids, enable_gqa, return_lse, out
        As in :func:`scaled_dot_product_attention`.

    Returns
    -------
    ndarray or (ndarray, ndarray)
        As :func:`scaled_dot_product_attention`.

    Raises
    ------
    TypeError, ValueError
        As :func:`scaled_dot_product_attention`.

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> q = k = np.eye(3)
    >>> v = np.array([[1.0], [2.0], [3.0]])
    >>> fastattn.causal_attention(q, k, v)[0]  # the first query sees only key 0
    array([1.], dtype=float32)
    """
    return _sdpa(q, k, v, attn_mask, True, window, scale, softcap, alibi_slopes, sinks,
                 segment_ids, enable_gqa, return_lse, out)


@overload
def sliding_window_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, window_size: int,
                             attn_mask: Optional[ArrayLike] = ..., *, is_causal: bool = ...,
                             scale: Optional[float] = ..., softcap: Optional[float] = ...,
                             alibi_slopes: Optional[ArrayLike] = ...,
                             sinks: Optional[ArrayLike] = ..., segment_ids: SegmentIds = ...,
                             enable_gqa: bool = ..., return_lse: Literal[False] = ...,
                             out: Optional[Float32Array] = ...) -> Float32Array: ...
@overload
def sliding_window_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, window_size: int,
                             attn_mask: Optional[ArrayLike] = ..., *, is_causal: bool = ...,
                             scale: Optional[float] = ..., softcap: Optional[float] = ...,
                             alibi_slopes: Optional[ArrayLike] = ...,
                             sinks: Optional[ArrayLike] = ..., segment_ids: SegmentIds = ...,
                             enable_gqa: bool = ..., return_lse: Literal[True],
                             out: Optional[Float32Array] = ...) -> WithLse: ...
@overload
def sliding_window_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, window_size: int,
                             attn_mask: Optional[ArrayLike] = ..., *, is_causal: bool = ...,
                             scale: Optional[float] = ..., softcap: Optional[float] = ...,
                             alibi_slopes: Optional[ArrayLike] = ...,
                             sinks: Optional[ArrayLike] = ..., segment_ids: SegmentIds = ...,
                             enable_gqa: bool = ..., return_lse: bool = ...,
                             out: Optional[Float32Array] = ...) -> AttentionResult: ...

@foreign_keywords
def sliding_window_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, window_size: int,
                             attn_mask: Optional[ArrayLike] = None, *, is_causal: bool = False,
                             scale: Optional[float] = None, softcap: Optional[float] = None,
                             alibi_slopes: Optional[ArrayLike] = None,
                             sinks: Optional[ArrayLike] = None, segment_ids: SegmentIds = None,
                             enable_gqa: bool = False, return_lse: bool = False,
                             out: Optional[Float32Array] = None) -> AttentionResult:
    """Causal attention over a sliding window of `window_size` keys.

    Each query sees itself and the ``window_size - 1`` keys before it:
    ``window=(window_size - 1, 0)``, which is Mistral's / Hugging Face's
    ``sliding_window=W`` and llama.cpp's ``n_swa=W`` for ``window_size=W``.
    (ONNX Runtime's ``local_window_size=w`` is ``window=(w, 0)`` instead.)

    Parameters
    ----------
    q, k, v, attn_mask
        As in :func:`scaled_dot_product_attention`.
    window_size : int
        Keys seen by each query, itself included; >= 1.
    is_causal, scale, softcap, alibi_slopes, sinks, segment_ids, enable_gqa, return_lse, out
        As in :func:`scaled_dot_product_attention` (`is_causal` changes
        nothing: the window already ends at the query).

    Returns
    -------
    ndarray or (ndarray, ndarray)
        As :func:`scaled_dot_product_attention`.

    Raises
    ------
    TypeError
        As :func:`scaled_dot_product_attention`.
    ValueError
        If `window_size` is not an int >= 1, and as
        :func:`scaled_dot_product_attention`.

    Notes
    -----
    Key tiles outside the window are skipped: time O(L * window_size * D).

    Examples
    --------
    >>> import numpy as np, fastattn
    >>> q = k = np.zeros((4, 2))
    >>> v = np.arange(4.0).reshape(4, 1)
    >>> fastattn.sliding_window_attention(q, k, v, 2).ravel()  # mean of v[i-1], v[i]
    array([0. , 0.5, 1.5, 2.5], dtype=float32)
    """
    return _sdpa(q, k, v, attn_mask, is_causal, check_window_size(window_size), scale, softcap,
                 alibi_slopes, sinks, segment_ids, enable_gqa, return_lse, out)


@foreign_keywords
@fill(rules=ATTENTION_RULES)
def attention_weights(q: ArrayLike, k: ArrayLike, attn_mask: Optional[ArrayLike] = None, *,
                      is_causal: bool = False, window: Window = None,
                      scale: Optional[float] = None, softcap: Optional[float] = None,
                      alibi_slopes: Optional[ArrayLike] = None, sinks: Optional[ArrayLike] = None,
                      segment_ids: SegmentIds = None, enable_gqa: bool = False) -> Float32Array:
    """The attention weights of :func:`scaled_dot_product_attention`.

    For inspection and plotting: O(L x S) memory by nature.

    Parameters
    ----------
    q, k, attn_mask, is_causal, window, scale, softcap, alibi_slopes, sinks, segment_ids, enable_gqa
        As in :func:`scaled_dot_product_attention`.

    Returns
    -------
    ndarray, float32, shape (..., L, S)
        ``w[..., i, j]``: the softmax over the allowed keys of row ``i``;
        each row sums to 1 (with `sinks`, to 1 minus the sink's weight), or
        is all 0 when it has no allowed key (or all its allowed scores are
        -inf, or its sink is +inf), or is NaN when a NaN or +inf score or a
        NaN sink is allowed.

    Raises
    ------
    TypeError, ValueError
        As :func:`scaled_dot_product_attention`.

    Notes
    -----{rules}
    Examples
    --------
    >>> import numpy as np, fastattn
    >>> q = np.array([[1.0, 0.0]])
    >>> k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> w = fastattn.attention_weights(q, k)
    >>> w.round(4), float(w.sum())
    (array([[0.4011, 0.1978, 0.4011]], dtype=float32), 1.0)
    """
    a = attention_inputs(q, k, None, attn_mask, is_causal, window, scale, enable_gqa,
                         with_v=False, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                         segment_ids=segment_ids)
    weights = new_array(a.batch + (a.L, a.S), "the weights", fill=0.0)
    run(a, weights, weights=True)
    return weights


# ----------------------------------------------------------------------------
# Packed variable-length batches


@foreign_keywords
def varlen_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, cu_seqlens_q: ArrayLike,
                     cu_seqlens_k: ArrayLike, *, is_causal: bool = False, window: Window = None,
                     scale: Optional[float] = None, softcap: Optional[float] = None,
                     alibi_slopes: Optional[ArrayLike] = None,
                     sinks: Optional[ArrayLike] = None, return_lse: bool = False,
                     out: Optional[Float32Array] = None) -> AttentionResult:
    """Attention over packed sequences of different lengths (FlashAttention's varlen form).

    The sequences lie one after another along the token axis; sequence ``b``
    is query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` against keys
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``, each with its own bottom-right
    alignment (``p_i = i + S_b - L_b``). No padding is computed: the work is
    ``sum_b L_b * S_b``.

    Parameters
    ----------
    q : array_like, shape (total_q, Hq, D), real floating dtype
        The queries of all sequences, token-major.
    k : array_like, shape (total_k, Hkv, D), real floating dtype
        The keys; ``Hq % Hkv == 0`` (grouped-query heads follow from the
        shapes: query head ``h`` reads kv head ``h // (Hq // Hkv)``). May be
        float16 or bfloat16, read as stored.
    v : array_like, shape (total_k, Hkv, Dv), real floating dtype
        The values, as `k`.
        q, k and v are read in place when their last axis is contiguous.
    cu_seqlens_q, cu_seqlens_k : array_like of int, shape (B + 1,)
        Cumulative sequence lengths: start at 0, non-decreasing, end at
        ``total_q`` and ``total_k``. Empty sequences are allowed. Any NumPy
        integer dtype (a list of Python ints as NumPy reads it; one with
        offsets of 2**63 or more as uint64).
    is_causal, window, scale, softcap
        As in :func:`scaled_dot_product_attention`, for each sequence.
    alibi_slopes, sinks : array_like of real floats, optional
        Broadcasting to (B, Hq): one value per query head, e.g. shape (Hq,),
        or one per sequence and head.
    return_lse : bool, default False
        Also return ``lse`` of shape (total_q, Hq) (FlashAttention's
        ``softmax_lse`` is its transpose).
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape (total_q, Hq, Dv), not
        sharing memory with any input; receives the output and is returned.

    Returns
    -------
    out : ndarray, float32, shape (total_q, Hq, Dv)
    lse : ndarray, float32, shape (total_q, Hq)
        Only with `return_lse`: returned as ``(out, lse)``.

    Raises
    ------
    TypeError
        If q, k or v are not real floating arrays, `cu_seqlens_q` or
        `cu_seqlens_k` are not integer arrays, `alibi_slopes` or `sinks` are
        not real floats, a flag is not a bool, an argument is a
        ``numpy.ma.MaskedArray``, or `out` is not a float32 ndarray (or a
        keyword is unknown, as in :func:`scaled_dot_product_attention`).
    ValueError
        If q, k or v are not 3-d, D < 1 or differs, k and v disagree, ``Hq %
        Hkv != 0``, a `cu_seqlens` is not 1-d or is empty, holds an offset
        outside [0, 2**64), does not start at 0, decreases, does not end at
        the total, or the two differ in length, or another
        argument is out of range as in :func:`scaled_dot_product_attention`
        (`out` may overlap no argument, `cu_seqlens` as given included).

    Notes
    -----
    Each sequence's rows are bitwise identical to
    :func:`scaled_dot_product_attention` on that sequence alone
    (``q[cq[b]:cq[b+1]].swapaxes(0, 1)`` against the same slices of k and v,
    with ``enable_gqa=True``): a row's arithmetic depends only on its own
    sequence. The work units (up to 96 query rows of one head, or of the
    heads of a GQA group; up to 192 where each value tile is copied, as for
    float16 values or value rows a multiple of 1 KiB apart, or where a full
    (non-causal) sequence's k and v overflow half of a core's level-2
    cache) of all sequences
    are handed to the threads from one pool, the biggest first, so the
    threads stay busy when one sequence is much longer than the others. The
    score rules, non-finite values and sinks are those of
    :func:`scaled_dot_product_attention`.

    References
    ----------
    .. [1] T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism
       and Work Partitioning", ICLR 2024 (``flash_attn_varlen_func``).

    Examples
    --------
    Two sequences of 2 and 3 tokens, one head, causal: the first token of each
    sequence sees only itself.

    >>> import numpy as np, fastattn
    >>> x = np.zeros((5, 1, 4))
    >>> v = np.arange(5.0).reshape(5, 1, 1)
    >>> cu = np.array([0, 2, 5])
    >>> fastattn.varlen_attention(x, x, v, cu, cu, is_causal=True).ravel()
    array([0. , 0.5, 2. , 2.5, 3. ], dtype=float32)
    """
    a = varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, window, scale, softcap,
                      alibi_slopes, sinks)
    total_q = a.q.shape[0]
    shape = (total_q, a.Hq, a.Dv)
    return_lse = as_bool(return_lse, "return_lse")
    if out is not None:
        check_out(out, shape, [("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                               ("cu_seqlens_k", cu_seqlens_k), ("alibi_slopes", alibi_slopes),
                               ("sinks", sinks)] + a.arrays())
    else:
        out = new_array(shape, "the output")
    lse = new_array((total_q, a.Hq), "lse") if return_lse else None
    run(a, out, lse)
    if lse is not None:
        return out, lse
    return out


# ----------------------------------------------------------------------------
# Merging partial results


@foreign_keywords
def merge_attention(outs: ArrayLike, lses: ArrayLike, *,
                    out: Optional[Float32Array] = None) -> WithLse:
    """Merge attention results computed over disjoint sets of keys.

    With the keys split into parts and ``o_p, lse_p =
    scaled_dot_product_attention(q, k_p, v_p, ..., return_lse=True)`` for each
    part, the merge gives the result over all keys (to float32 rounding): the
    log-sum-exp combination of FlashAttention's split-KV ("flash-decoding")
    and of ring attention.

    Parameters
    ----------
    outs : sequence of array_like, or array_like, real floating dtype
        P partial outputs, each of shape (..., L, Dv): a sequence of arrays, or
        one array of shape (P, ..., L, Dv) with the partials on its first axis.
        Converted to float32; C-contiguous float32 arrays (and the slices
        ``outs[p]`` of one such array) are read in place, never copied.
    lses : sequence of array_like, or array_like, real floating dtype
        The P matching log-sum-exps, each of shape (..., L) (or one array of
        shape (P, ..., L)).
    out : ndarray, optional
        Writeable, C-contiguous, aligned float32 array of shape (..., L, Dv), not sharing
        memory with any partial; receives the merged output and is returned.

    Returns
    -------
    o : ndarray, float32, shape (..., L, Dv)
        ``sum_p exp(lse_p - lse) * o_p``.
    lse : ndarray, float32, shape (..., L)
        ``log(sum_p exp(lse_p))``.

    Raises
    ------
    TypeError
        If `outs` or `lses` is neither a list or tuple nor an array (a
        generator, None), a partial is not of a real floating dtype or is a
        ``numpy.ma.MaskedArray``, or `out` is not a float32 ndarray.
    ValueError
        If outs and lses hold different numbers of partials, there is no
        partial (an empty sequence), the partial outputs do not all have the
        same shape (..., L, Dv) with at least 2 dimensions, a partial lse's
        shape is not (..., L), or `out` has the wrong shape or layout, is
        read-only or overlaps a partial (as given, e.g. a float64 partial
        that is read through its float32 copy, or as converted).

    Notes
    -----
    Per row, with ``m = max_p lse_p``: ``lse = m + log(sum_p exp(lse_p - m))``
    in float64, and ``o = sum_p c_p * o_p`` with ``c_p = exp(lse_p - lse)``,
    summed in float32 (as attention accumulates its output), both sums in the
    order p = 0, 1, ..., P - 1, so the same inputs give the same bits whatever
    the thread count. Partials merge associatively up to rounding: merging
    merged results (a tree, as :mod:`fastattn.dask` does) agrees with one
    merge of all the partials to float32 rounding.

    Non-finite values, per row: a partial whose ``lse_p`` is -inf (no
    allowed key in its part) is skipped and its ``o_p`` row is never read (it
    may hold anything); when every ``lse_p`` is -inf (or P = 0) the row is
    ``o = 0``, ``lse = -inf``, as attention gives a row with no allowed key; a
    NaN ``lse_p`` gives ``o`` NaN and ``lse`` NaN; otherwise a +inf ``lse_p``
    gives ``o`` NaN and ``lse`` +inf. A NaN inside a read ``o_p`` propagates.

    Time O(P x rows x Dv), memory-bound (each partial is read once); rows are
    split over OpenMP threads with the GIL released. No working memory.

    References
    ----------
    .. [1] M. Milakov and N. Gimelshein, "Online normalizer calculation for
       softmax", 2018 (the log-sum-exp rescaling).
    .. [2] T. Dao et al., "Flash-Decoding for long-context inference", 2023
       (split-KV partials merged by their log-sum-exp).

    Examples
    --------
    Attention over 6 keys equals the merge of attention over keys 0-3 and 4-5:

    >>> import numpy as np, fastattn
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((2, 8)), rng.standard_normal((6, 8)), rng.standard_normal((6, 4))
    >>> o1, l1 = fastattn.scaled_dot_product_attention(q, k[:4], v[:4], return_lse=True)
    >>> o2, l2 = fastattn.scaled_dot_product_attention(q, k[4:], v[4:], return_lse=True)
    >>> o, lse = fastattn.merge_attention([o1, o2], [l1, l2])
    >>> full, full_lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    >>> bool(np.allclose(o, full, atol=1e-6)), bool(np.allclose(lse, full_lse, atol=1e-6))
    (True, True)

    A part with no allowed key (lse -inf) is never read:

    >>> o, lse = fastattn.merge_attention([np.full((1, 2), np.nan), [[1.0, 2.0]]],
    ...                                   [[-np.inf], [0.5]])
    >>> o, lse
    (array([[1., 2.]], dtype=float32), array([0.5], dtype=float32))
    """
    parts, part_lses, shape = merge_inputs(outs, lses)
    if out is not None:
        check_out(out, shape, [("outs", parts), ("lses", part_lses), ("outs", outs),
                               ("lses", lses)])
    else:
        out = new_array(shape, "the output")
    lse = new_array(shape[:-1], "lse")
    _core.merge([a.reshape(-1) for a in parts], [a.reshape(-1) for a in part_lses],
                math.prod(shape[:-1]), shape[-1], out.reshape(-1), lse.reshape(-1),
                get_num_threads())
    return out, lse
