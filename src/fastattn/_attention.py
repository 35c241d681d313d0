"""Attention over dense inputs: scaled_dot_product_attention, its causal and
sliding-window forms, attention_weights; and the entry points behind them.

The public functions check nothing themselves: each hands its arguments to
sdpa(), the one entry point of dense attention, which front ends call too
(fastattn.dask, for the blocks of a long sequence). sdpa() offers the call
to _core.sdpa_plain first, the fast form of the kernel's argument record for
the common call, which takes it in one step or declines it; a declined call
is validated (fastattn._validate.attention_inputs) and run
(fastattn._kernel.run) with the same record. paged_sdpa() is the same over a
paged KV cache (fastattn.flash_attn's flash_attn_with_kvcache).
"""
from __future__ import annotations  # help() shows the annotations as written

from typing import Any, Literal, Optional, overload

from numpy.typing import ArrayLike

from fastattn import _core
from fastattn._docs import ATTENTION_RULES, fill
from fastattn._kernel import run
from fastattn._threads import get_num_threads
from fastattn._typing import AttentionResult, Float32Array, SegmentIds, Window, WithLse
from fastattn._validate import (as_bool, attention_inputs, CAUSAL_KEYWORDS, check_window_size,
                                foreign_keywords, reject_foreign, new_array, paged_inputs,
                                result_array)

__all__ = ["scaled_dot_product_attention", "causal_attention", "sliding_window_attention",
           "attention_weights"]

PAGE_MULTIPLE = _core.KEY_TILE  # a page of a paged cache holds whole key tiles of the kernels


def sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: Any = False,
         window: Any = None, scale: Any = None, softcap: Any = None, alibi_slopes: Any = None,
         sinks: Any = None, segment_ids: Any = None, enable_gqa: Any = False,
         return_lse: Any = False, out: Any = None, alibi_shift: int = 0) -> Any:
    """Dense attention: the entry point of scaled_dot_product_attention and its forms.

    The arguments are :func:`fastattn.scaled_dot_product_attention`'s, as
    the caller gave them (every check is made here, with its errors), plus
    `alibi_shift`: added to each query's position in ALiBi's ``|p_i - j|``
    (the offset of a block of a longer sequence; 0 otherwise). Front ends
    pass the options by keyword; the public functions pass all of them by
    position, the cheapest call, since the common call costs only a few
    microseconds in all.
    """
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
    out = result_array(out, shape, [("q", q), ("k", k), ("v", v), ("attn_mask", attn_mask),
                                    ("alibi_slopes", alibi_slopes), ("sinks", sinks),
                                    ("segment_ids", segment_ids)] + a.arrays())
    lse = new_array(a.batch + (a.L,), "lse") if return_lse else None
    run(a, out, lse, alibi_shift=alibi_shift)
    return (out, lse) if return_lse else out


def paged_sdpa(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seqlen: Any, *,
               is_causal: bool = False, window: Any = None, scale: Any = None,
               return_lse: bool = False) -> Any:
    """Attention over a paged KV cache, read in place (fastattn.flash_attn's entry point).

    q (B, Hq, L, D) float32 (any strides with contiguous rows); k_cache,
    v_cache (num_pages, block_size, Hkv, D / Dv) of float32, float16 or
    bfloat16, with ``block_size`` a multiple of PAGE_MULTIPLE (64);
    block_table (B, max_pages) of ints: key ``j`` of batch item ``b`` is row
    ``j % block_size`` of page ``block_table[b, j // block_size]``; every
    batch item has ``seqlen`` keys. Query head ``h`` reads kv head
    ``h // (Hq // Hkv)``. Returns out (B, Hq, L, Dv) (and lse (B, Hq, L)),
    bitwise those of scaled_dot_product_attention on the gathered cache.
    """
    a = paged_inputs(q, k_cache, v_cache, block_table, seqlen, is_causal, window, scale,
                     PAGE_MULTIPLE)
    out = new_array((a.B, a.Hq, a.L, a.Dv), "the output")
    lse = new_array((a.B, a.Hq, a.L), "lse") if return_lse else None
    run(a, out, lse)
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
                                 out: Optional[Float32Array] = None, **_foreign: Any) -> AttentionResult:
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
    if _foreign:
        reject_foreign(scaled_dot_product_attention, _foreign)
    return sdpa(q, k, v, attn_mask, is_causal, window, scale, softcap, alibi_slopes, sinks,
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
                     out: Optional[Float32Array] = None, **_foreign: Any) -> AttentionResult:
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
    if _foreign:
        reject_foreign(causal_attention, _foreign)
    return sdpa(q, k, v, attn_mask, True, window, scale, softcap, alibi_slopes, sinks,
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
                             out: Optional[Float32Array] = None, **_foreign: Any) -> AttentionResult:
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
    if _foreign:
        reject_foreign(sliding_window_attention, _foreign)
    return sdpa(q, k, v, attn_mask, is_causal, check_window_size(window_size), scale, softcap,
                 alibi_slopes, sinks, segment_ids, enable_gqa, return_lse, out)


@foreign_keywords
@fill(rules=ATTENTION_RULES)
def attention_weights(q: ArrayLike, k: ArrayLike, attn_mask: Optional[ArrayLike] = None, *,
                      is_causal: bool = False, window: Window = None,
                      scale: Optional[float] = None, softcap: Optional[float] = None,
                      alibi_slopes: Optional[ArrayLike] = None, sinks: Optional[ArrayLike] = None,
                      segment_ids: SegmentIds = None, enable_gqa: bool = False, **_foreign: Any) -> Float32Array:
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
    if _foreign:
        reject_foreign(attention_weights, _foreign)
    a = attention_inputs(q, k, None, attn_mask, is_causal, window, scale, enable_gqa,
                         with_v=False, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                         segment_ids=segment_ids)
    weights = new_array(a.batch + (a.L, a.S), "the weights", fill=0.0)
    run(a, weights, weights=True)
    return weights
