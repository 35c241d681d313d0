"""Pure-NumPy twins of fastattn's public functions: the oracle of the tests.

Same names, signatures and semantics as the computing functions of
:mod:`fastattn` (thread control and show_config have no twin: the reference is
plain NumPy; quantize_kv and QuantizedArray are NumPy already, and are
fastattn's own), written as the
textbook steps (scores, scale, mask, softmax, weighted sum) so that a reader can
check the compiled results by eye. Arguments go through the same checks as the
compiled API (``fastattn._validate``) and are rounded to float32 like its
inputs; the arithmetic is float64 and the results are returned as float32.
Attention here forms the full (..., L, S) score matrix: O(L x S) memory, for
checking, not for speed.
"""
from __future__ import annotations  # help() shows the annotations as written

from typing import Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fastattn._grad import sum_to_shape
from fastattn._quant import QuantizedArray, quantize_kv
from fastattn._typing import AttentionResult, Float32Array, SegmentIds, Window, WithLse

from fastattn._validate import (
    as_bool,
    as_float32,
    attention_inputs,
    backward_inputs,
    check_out,
    CAUSAL_KEYWORDS,
    check_window_size,
    foreign_keywords,
    merge_inputs,
    normalize_axis,
    varlen_backward_inputs,
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
    "merge_attention",
    "quantize_kv",
    "QuantizedArray",
    "attention_backward",
    "varlen_attention_backward",
]


def _values(a):
    """Validated inputs with a QuantizedArray k or v replaced by the float32
    values it stands for (the compiled kernels give the bits of those)."""
    deq = {name: x.dequantize() for name, x in (("k", a.k), ("v", a.v))
           if isinstance(x, QuantizedArray)}
    return a._replace(**deq) if deq else a


def _finish(result64, out, inputs):
    """float32 result, written into `out` when given (after the same checks as fastattn's)."""
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf, as fastattn gives
        result = result64.astype(np.float32)
    if out is None:
        return result
    check_out(out, result.shape, inputs)
    out[...] = result
    return out


# ----------------------------------------------------------------------------
# softmax, log_softmax, logsumexp: m = max(x); IEEE arithmetic on the formulas.


def _slices(x, axis):
    x64 = as_float32(x, "x").astype(np.float64)
    return x64, normalize_axis(axis, x64.ndim)


@foreign_keywords
def softmax(x: ArrayLike, axis: int = -1, *,
            out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
    """Reference softmax: ``exp(x - m) / sum(exp(x - m))`` along `axis`."""
    x64, ax = _slices(x, axis)
    with np.errstate(all="ignore"):
        m = np.max(x64, axis=ax, keepdims=True, initial=-np.inf)
        e = np.exp(x64 - m)  # inf - inf and -inf + inf give NaN, as IEEE says
        result = e / np.sum(e, axis=ax, keepdims=True)
    return _finish(result, out, [("x", x)])


def _log_sum(x64, m, ax):
    """log(sum(exp(x - m))) along `ax`. Where m is finite the entries equal to
    m add exactly 1 each and the rest add less, so the log is taken as
    log1p((count - 1) + rest): accurate also when the sum is 1 + a tiny rest
    (log(1 + 1e-16) would lose it). Elsewhere, IEEE arithmetic as written."""
    with np.errstate(all="ignore"):
        e = np.exp(x64 - m)
        top = x64 == m
        rest = np.sum(np.where(top, 0.0, e), axis=ax, keepdims=True)
        log1p_form = np.log1p((np.sum(top, axis=ax, keepdims=True) - 1.0) + rest)
        return np.where(np.isfinite(m), log1p_form, np.log(np.sum(e, axis=ax, keepdims=True)))


@foreign_keywords
def log_softmax(x: ArrayLike, axis: int = -1, *,
                out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
    """Reference log_softmax: ``(x - m) - log(sum(exp(x - m)))`` along `axis`."""
    x64, ax = _slices(x, axis)
    with np.errstate(all="ignore"):
        m = np.max(x64, axis=ax, keepdims=True, initial=-np.inf)
        result = (x64 - m) - _log_sum(x64, m, ax)
    return _finish(result, out, [("x", x)])


@foreign_keywords
def logsumexp(x: ArrayLike, axis: int = -1, *, keepdims: bool = False,
              out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
    """Reference logsumexp: ``m + log(sum(exp(x - m)))`` along `axis`.

    As in SciPy, an infinite max is replaced by 0 in the shift, so a +inf
    gives +inf and an all -inf (or empty) slice gives -inf.
    """
    x64, ax = _slices(x, axis)
    keepdims = as_bool(keepdims, "keepdims")
    with np.errstate(all="ignore"):
        m = np.max(x64, axis=ax, keepdims=True, initial=-np.inf)
        shift = np.where(np.isfinite(m), m, 0.0)
        result = shift + _log_sum(x64, shift, ax)
    if not keepdims:
        result = np.squeeze(result, axis=ax)
    return _finish(result, out, [("x", x)])


# ----------------------------------------------------------------------------
# Attention


def _per_query_head(x, a):
    """k or v as float64 with one head per query head: under grouped-query
    attention query head h reads kv head h // group."""
    x = x.astype(np.float64)
    return np.repeat(x, a.group, axis=-3) if a.group > 1 else x


def _raw_scores(a):
    """s = scale * q @ k^T, shape batch + (L, S), float64."""
    q = a.q.astype(np.float64)
    k = _per_query_head(a.k, a)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 in q . k is NaN, as IEEE says
        s = a.scale * (q @ np.swapaxes(k, -1, -2))
    return np.broadcast_to(s, a.batch + (a.L, a.S))


def _scores(a, s=None):
    """Scores in the documented order: s = scale * q @ k^T (`s`: those of
    _raw_scores, when already at hand), soft-capped (c * tanh(s / c)), the
    ALiBi bias -slope * |p_i - j| subtracted, the float mask added; then -inf
    wherever a key is not allowed. Shape batch + (L, S), float64."""
    if s is None:
        s = _raw_scores(a)

    p = np.arange(a.L)[:, None] + a.S - a.L  # query i sits at key position p_i
    j = np.arange(a.S)[None, :]
    if a.softcap:  # Gemma 2's soft-capping
        c = float(a.softcap)
        s = c * np.tanh(s / c)
    if a.alibi_slopes is not None:  # ALiBi: -slope * |p_i - j|, one slope per query head
        slopes = a.alibi_slopes.astype(np.float64)[..., None, None]
        s = s - slopes * np.abs(p - j).astype(np.float64)

    allowed = np.ones((a.L, a.S), dtype=bool)
    left, right = a.window
    if a.is_causal:
        allowed &= j <= p
    if left is not None:
        allowed &= j >= p - left
    if right is not None:
        allowed &= j <= p + right
    if a.segments is not None:  # document masking: equal ids only
        allowed = allowed & (a.segments.q[..., :, None] == a.segments.kv[..., None, :])
    if a.mask is not None and a.mask.dtype == np.bool_:
        allowed = allowed & a.mask
    elif a.mask is not None:  # float mask: added; -inf there masks the key
        fmask = a.mask.astype(np.float64)
        with np.errstate(invalid="ignore"):
            s = np.where(fmask == -np.inf, -np.inf, s + fmask)  # IEEE: -inf + inf is NaN
    return np.where(allowed, s, -np.inf)


def _softmax_rows(s, sinks=None):
    """The softmax of each row over its allowed (> -inf) scores, and its
    log-sum-exp, with the documented row rules; `sinks` (shape batch, or None)
    add one key of score `sink` and value 0 to every row of their batch item.
    Returns (w, lse, nan_row)."""
    sink = np.full(s.shape[:-1] + (1,), -np.inf) if sinks is None else \
        np.broadcast_to(sinks.astype(np.float64)[..., None, None], s.shape[:-1] + (1,))
    with np.errstate(all="ignore"):
        m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)  # NaN propagates
        top = np.maximum(m, sink)  # NaN propagates
        shift = np.where(np.isfinite(top), top, 0.0)
        e = np.exp(s - shift)
        total = np.sum(e, axis=-1, keepdims=True) + np.exp(sink - shift)
        w = e / total
        lse = shift + np.log(total)
    nan_row = np.isnan(m) | np.isnan(sink) | (m == np.inf)
    w = np.where((m == -np.inf) | (sink == np.inf), 0.0, w)  # no allowed key, or a +inf sink
    w = np.where(nan_row, np.nan, w)  # NaN or +inf allowed, NaN sink: NaN
    lse = np.where(np.isnan(m) | np.isnan(sink), np.nan,
                   np.where((m == np.inf) | (sink == np.inf), np.inf,
                            np.where(m == -np.inf, sink, lse)))
    return w, lse[..., 0], nan_row[..., 0]


def _allowed_sum(w, allowed, x):
    """r_i = sum_j w_ij x_j over the j with allowed[i, j] (w is 0 elsewhere);
    the rows of x of every other j are never read, so that a NaN or inf
    there does not reach r_i (0 * inf is NaN)."""
    if np.isfinite(x).all():
        return w @ x  # the other j have w_ij = 0 and finite x: no effect
    r = np.empty(w.shape[:-1] + x.shape[-1:])
    xb = np.broadcast_to(x, w.shape[:-2] + x.shape[-2:])
    for idx in np.ndindex(*w.shape[:-1]):  # rare path: non-finite values in x
        keys = allowed[idx]
        r[idx] = w[idx][keys] @ xb[idx[:-1]][keys]
    return r


def _weighted_sum(w, s, v):
    """o_i = sum_j w_ij v_j over the keys j with a score above -inf;
    the rows of v of every other key are never read."""
    return _allowed_sum(w, s != -np.inf, v)


def _attention(a, return_lse, out, inputs):
    if 0 in a.batch:  # no batch item (e.g. no query heads under GQA): empty results
        o, lse = np.zeros(a.batch + (a.L, a.Dv)), np.zeros(a.batch + (a.L,))
        result = _finish(o, out, inputs)
        return (result, lse.astype(np.float32)) if return_lse else result
    s = _scores(a)
    w, lse, nan_row = _softmax_rows(s, a.sinks)
    assert a.v is not None
    o = _weighted_sum(w, s, _per_query_head(a.v, a))
    o = np.where(nan_row[..., None], np.nan, o)
    o = np.broadcast_to(o, a.batch + (a.L, a.Dv))
    result = _finish(o, out, inputs)
    return (result, lse.astype(np.float32)) if return_lse else result


@foreign_keywords
def scaled_dot_product_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                                 attn_mask: Optional[ArrayLike] = None, *,
                                 is_causal: bool = False, window: Window = None,
                                 scale: Optional[float] = None, softcap: Optional[float] = None,
                                 alibi_slopes: Optional[ArrayLike] = None,
                                 sinks: Optional[ArrayLike] = None,
                                 segment_ids: SegmentIds = None, enable_gqa: bool = False,
                                 return_lse: bool = False,
                                 out: Optional[Float32Array] = None) -> AttentionResult:
    """Reference SDPA: ``softmax(scale * q @ k^T + mask) @ v`` over the allowed
    keys, step by step in float64 (see :func:`fastattn.scaled_dot_product_attention`)."""
    a = attention_inputs(q, k, v, attn_mask, is_causal, window, scale, enable_gqa,
                         softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                         segment_ids=segment_ids)
    return_lse = as_bool(return_lse, "return_lse")
    inputs = a.arrays()
    a = _values(a)
    return _attention(a, return_lse, out, [("q", q), ("k", k), ("v", v),
                                           ("attn_mask", attn_mask),
                                           ("alibi_slopes", alibi_slopes), ("sinks", sinks),
                                           ("segment_ids", segment_ids)] + inputs)


@foreign_keywords(hints=CAUSAL_KEYWORDS)
def causal_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike,
                     attn_mask: Optional[ArrayLike] = None, *, window: Window = None,
                     scale: Optional[float] = None, softcap: Optional[float] = None,
                     alibi_slopes: Optional[ArrayLike] = None, sinks: Optional[ArrayLike] = None,
                     segment_ids: SegmentIds = None, enable_gqa: bool = False,
                     return_lse: bool = False,
                     out: Optional[Float32Array] = None) -> AttentionResult:
    """Reference causal attention: ``is_causal=True``."""
    return scaled_dot_product_attention(
        q, k, v, attn_mask, is_causal=True, window=window, scale=scale, softcap=softcap,
        alibi_slopes=alibi_slopes, sinks=sinks, segment_ids=segment_ids,
        enable_gqa=enable_gqa, return_lse=return_lse, out=out)


@foreign_keywords
def sliding_window_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, window_size: int,
                             attn_mask: Optional[ArrayLike] = None, *, is_causal: bool = False,
                             scale: Optional[float] = None, softcap: Optional[float] = None,
                             alibi_slopes: Optional[ArrayLike] = None,
                             sinks: Optional[ArrayLike] = None, segment_ids: SegmentIds = None,
                             enable_gqa: bool = False, return_lse: bool = False,
                             out: Optional[Float32Array] = None) -> AttentionResult:
    """Reference sliding-window attention: ``window=(window_size - 1, 0)``."""
    return scaled_dot_product_attention(
        q, k, v, attn_mask, is_causal=is_causal, window=check_window_size(window_size),
        scale=scale, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
        segment_ids=segment_ids, enable_gqa=enable_gqa, return_lse=return_lse, out=out)


@foreign_keywords
def attention_weights(q: ArrayLike, k: ArrayLike, attn_mask: Optional[ArrayLike] = None, *,
                      is_causal: bool = False, window: Window = None,
                      scale: Optional[float] = None, softcap: Optional[float] = None,
                      alibi_slopes: Optional[ArrayLike] = None, sinks: Optional[ArrayLike] = None,
                      segment_ids: SegmentIds = None, enable_gqa: bool = False) -> Float32Array:
    """Reference attention weights, shape (..., L, S)."""
    a = attention_inputs(q, k, None, attn_mask, is_causal, window, scale, enable_gqa,
                         with_v=False, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                         segment_ids=segment_ids)
    a = _values(a)
    if 0 in a.batch:
        return np.zeros(a.batch + (a.L, a.S), np.float32)
    w, _, _ = _softmax_rows(_scores(a), a.sinks)
    return np.ascontiguousarray(w, dtype=np.float32)



# ----------------------------------------------------------------------------
# Packed variable-length batches


@foreign_keywords
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, is_causal=False, window=None,
                     scale=None, softcap=None, alibi_slopes=None, sinks=None, return_lse=False,
                     out=None):
    """Reference varlen attention: :func:`scaled_dot_product_attention` on each
    packed sequence in turn (see :func:`fastattn.varlen_attention`)."""
    a = varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, window, scale, softcap,
                      alibi_slopes, sinks)
    return_lse = as_bool(return_lse, "return_lse")
    inputs = a.arrays()
    a = _values(a)
    total_q = a.q.shape[0]
    o = np.zeros((total_q, a.Hq, a.Dv))
    lse = np.full((total_q, a.Hq), -np.inf)
    for b in range(a.B):
        rows = slice(int(a.cu_q[b]), int(a.cu_q[b + 1]))
        keys = slice(int(a.cu_k[b]), int(a.cu_k[b + 1]))
        if rows.stop == rows.start or a.Hq == 0:
            continue
        ob, lb = scaled_dot_product_attention(
            np.swapaxes(a.q[rows], 0, 1), np.swapaxes(a.k[keys].astype(np.float32), 0, 1),
            np.swapaxes(a.v[keys].astype(np.float32), 0, 1), is_causal=a.is_causal,
            window=a.window, scale=a.scale, softcap=a.softcap or None,
            alibi_slopes=None if a.alibi_slopes is None else a.alibi_slopes[b],
            sinks=None if a.sinks is None else a.sinks[b], enable_gqa=True, return_lse=True)
        o[rows] = np.swapaxes(ob, 0, 1)
        lse[rows] = np.swapaxes(lb, 0, 1)
    result = _finish(o, out, [("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                              ("cu_seqlens_k", cu_seqlens_k), ("alibi_slopes", alibi_slopes),
                              ("sinks", sinks)] + inputs)
    return (result, lse.astype(np.float32)) if return_lse else result


# ----------------------------------------------------------------------------
# The attention backward


def _grads(bi):
    """(dq, dk, dv, dsinks) of attention_backward in float64, each summed back
    to its argument's shape (dsinks None without sinks). P is the softmax of
    the forward recomputed in float64 (its exp(s - lse) with the exact lse),
    then FlashAttention-2's formulas over the allowed pairs only."""
    a = bi.a
    if 0 in a.batch:  # no batch item: nothing depends on any input
        dsinks = None if bi.sinks_shape is None else np.zeros(bi.sinks_shape)
        return (np.zeros(bi.q_shape), np.zeros(bi.k_shape), np.zeros(bi.v_shape), dsinks)
    raw = _raw_scores(a)
    s = _scores(a, raw)
    w, lse, _ = _softmax_rows(s, a.sinks)
    # The allowed pairs: a score above -inf, as the forward reads them, and
    # not in a row whose lse is -inf (no key and no sink: it contributes nothing).
    dead = bi.lse == -np.inf
    pairs = (s != -np.inf) & ~dead[..., None]
    q = a.q.astype(np.float64)
    k = _per_query_head(a.k, a)
    assert a.v is not None
    v = _per_query_head(a.v, a)
    do = bi.do.astype(np.float64)
    o = bi.o.astype(np.float64)
    with np.errstate(all="ignore"):  # IEEE arithmetic: NaN in, NaN out
        p = np.where(pairs, w, 0.0)                             # P_ij
        # Only pairs of nonzero weight enter the sums: one of weight 0 adds
        # nothing, even where dout . v or dout is not finite.
        live = pairs & (p != 0.0)
        live_t = np.swapaxes(live, -1, -2)
        delta = np.sum(do * o, axis=-1)                         # Delta_i = do_i . o_i
        dv = _allowed_sum(np.swapaxes(p, -1, -2), live_t, do)   # dv_j = sum_i P_ij do_i
        dp = do @ np.swapaxes(v, -1, -2)                        # dP_ij = do_i . v_j
        ds = np.where(live, p * (dp - delta[..., None]), 0.0)   # P_ij (dP_ij - Delta_i)
        if a.softcap:  # d(c tanh(x / c))/dx = 1 - tanh^2(x / c)
            t = np.tanh(raw / float(a.softcap))
            ds = np.where(live, ds * (1.0 - t * t), 0.0)
        dq = a.scale * _allowed_sum(ds, live, k)                # scale sum_j dS_ij k_j
        dk = a.scale * _allowed_sum(np.swapaxes(ds, -1, -2), live_t, q)  # scale sum_i dS_ij q_i
        dsinks = None
        if a.sinks is not None:  # dsink = -sum_i exp(sink - lse_i) Delta_i
            sink = a.sinks.astype(np.float64)[..., None]
            dsinks = -np.sum(np.where(dead, 0.0, np.exp(sink - lse) * delta), axis=-1)
    return (sum_to_shape(dq, bi.q_shape), sum_to_shape(dk, bi.k_shape, a.group),
            sum_to_shape(dv, bi.v_shape, a.group),
            None if dsinks is None else sum_to_shape(dsinks, bi.sinks_shape))


def _float32_grads(grads):
    """The gradients as new C-contiguous float32 arrays (dsinks only with sinks)."""
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf
        return tuple(np.asarray(g, dtype=np.float32, order="C") for g in grads if g is not None)


@foreign_keywords
def attention_backward(do: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, o: ArrayLike,
                       lse: ArrayLike, attn_mask: Optional[ArrayLike] = None, *,
                       is_causal: bool = False, window: Window = None,
                       scale: Optional[float] = None, softcap: Optional[float] = None,
                       alibi_slopes: Optional[ArrayLike] = None,
                       sinks: Optional[ArrayLike] = None, segment_ids: SegmentIds = None,
                       enable_gqa: bool = False) -> Tuple[Float32Array, ...]:
    """Reference gradients of :func:`scaled_dot_product_attention`, step by step in float64.

    Given ``o, lse = scaled_dot_product_attention(q, k, v, attn_mask, ...,
    return_lse=True)`` and ``do``, the gradient of a loss with respect to
    ``o``, returns the gradients of that loss with respect to q, k, v (and
    the sinks): FlashAttention-2's backward [1]_ written out on the full
    (..., L, S) matrices.

    Each gradient is a new C-contiguous float32 array in the shape of its
    argument as given: where the argument was broadcast against the others
    (a batch dim of 1 or missing) its gradient is summed over the broadcast
    axes, as NumPy's rules and PyTorch's autograd make it; under
    `enable_gqa` the gradient of a kv head sums those of the query heads it
    serves.

    Parameters
    ----------
    do : array_like, shape batch + (L, Dv), real floating dtype
        dLoss/do, of exactly the shape of `o` (no broadcasting). Converted
        to float32.
    q, k, v : array_like, real floating dtype
        As in :func:`scaled_dot_product_attention`: shapes (..., L, D),
        (..., S, D), (..., S, Dv) broadcasting in their leading dims to the
        batch (with `enable_gqa`, (..., Hq, L, D) and (..., Hkv, S, D / Dv));
        k and v may be float16 or bfloat16 (read as their float32 values).
    o : array_like, shape batch + (L, Dv), real floating dtype
        The forward's output for these arguments. Converted to float32.
    lse : array_like, shape batch + (L,), real floating dtype
        The forward's log-sum-exp of each row (``return_lse=True``).
        Converted to float32.
    attn_mask, is_causal, window, scale, softcap, alibi_slopes, sinks, segment_ids, enable_gqa
        As in :func:`scaled_dot_product_attention`, with the same checks.
        The mask, the ALiBi slopes and the segment ids are constants: they
        get no gradient.

    Returns
    -------
    dq : ndarray, float32, the shape of `q`
    dk : ndarray, float32, the shape of `k`
    dv : ndarray, float32, the shape of `v`
    dsinks : ndarray, float32, the shape of `sinks`
        Only when `sinks` is given: returned as ``(dq, dk, dv, dsinks)``.

    Raises
    ------
    TypeError
        If `do`, `o` or `lse` is not a real floating array, or as
        :func:`scaled_dot_product_attention` raises for the other arguments.
    ValueError
        If `do` or `o` does not have exactly the shape batch + (L, Dv) of
        the output, or `lse` exactly batch + (L,), or as
        :func:`scaled_dot_product_attention` raises for the other arguments.

    Notes
    -----
    With ``s_raw = scale * q_i . k_j``, the scores ``s_ij`` of the forward
    (soft-capped ``c * tanh(s_raw / c)``, ALiBi's ``-slope * |p_i - j|``
    and the float mask added, ``p_i = i + S - L``) and ``P_ij = exp(s_ij -
    lse_i)`` on the allowed pairs, 0 on all others (Dao 2023 [1]_,
    Algorithm 2)::

        Delta_i = sum_c do_ic o_ic
        dv_j    = sum_i P_ij do_i
        dP_ij   = do_i . v_j
        dS_ij   = P_ij (dP_ij - Delta_i)
        dS_raw  = dS * (1 - tanh(s_raw / c)**2)     (softcap c; else dS)
        dq_i    = scale * sum_j dS_raw_ij k_j
        dk_j    = scale * sum_i dS_raw_ij q_i
        dsink   = -sum_i exp(sink - lse_i) Delta_i  (over its batch item and head)

    The allowed pairs are those the forward reads: a key outside the causal
    bound or the window, of another segment, False in a bool mask or -inf
    in a float mask enters no sum, so a NaN or inf in that key's row of k
    or v reaches no gradient of a query that may not see it. Nor does an
    allowed pair whose weight ``P_ij`` is exactly 0 (here in float64; the
    kernels' float32 weights underflow sooner, below about 1e-45). A row whose
    lse is -inf (no allowed key and no sink: its output was 0) contributes
    nothing and gets ``dq = 0``. Otherwise the formulas hold as written:
    non-finite values on allowed pairs propagate by IEEE rules.

    This reference recomputes ``P`` and ``lse`` in float64 from q, k and the
    options (the forward's softmax); `lse` as given only marks the rows of
    the rule above. The two differ only by the rounding of the given
    float32 `lse`, except where ``|lse|`` is so large that float32 holds
    little of it (a float mask of ``finfo(float32).min`` on every key of a
    row, whose weights are then equal): float64 keeps the exact weights.

    References
    ----------
    .. [1] T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism
       and Work Partitioning", ICLR 2024, Algorithm 2.
    """
    bi = backward_inputs(do, q, k, v, o, lse, attn_mask, is_causal, window, scale, enable_gqa,
                         softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                         segment_ids=segment_ids)
    return _float32_grads(_grads(bi))


@foreign_keywords
def varlen_attention_backward(do: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike,
                              o: ArrayLike, lse: ArrayLike, cu_seqlens_q: ArrayLike,
                              cu_seqlens_k: ArrayLike, *, is_causal: bool = False,
                              window: Window = None, scale: Optional[float] = None,
                              softcap: Optional[float] = None,
                              alibi_slopes: Optional[ArrayLike] = None,
                              sinks: Optional[ArrayLike] = None) -> Tuple[Float32Array, ...]:
    """Reference gradients of :func:`varlen_attention`: :func:`attention_backward`
    on each packed sequence in turn, in float64.

    Parameters
    ----------
    do, o : array_like, shape (total_q, Hq, Dv), real floating dtype
        dLoss/do and the forward's output, exactly the output's shape.
    q, k, v, cu_seqlens_q, cu_seqlens_k
        As in :func:`varlen_attention`: q (total_q, Hq, D), k and v
        (total_k, Hkv, D / Dv), ``Hq % Hkv == 0``.
    lse : array_like, shape (total_q, Hq), real floating dtype
        The forward's lse (``varlen_attention(..., return_lse=True)``).
    is_causal, window, scale, softcap, alibi_slopes, sinks
        As in :func:`varlen_attention`, for each sequence.

    Returns
    -------
    dq : ndarray, float32, shape (total_q, Hq, D)
    dk : ndarray, float32, shape (total_k, Hkv, D)
    dv : ndarray, float32, shape (total_k, Hkv, Dv)
    dsinks : ndarray, float32, the shape of `sinks`
        Only when `sinks` is given (summed over the sequences where `sinks`
        broadcast to (B, Hq), e.g. from shape (Hq,)).

    Raises
    ------
    TypeError, ValueError
        As :func:`varlen_attention`, and if `do`, `o` or `lse` is not a real
        floating array of exactly the shape above.

    Notes
    -----
    Sequence ``b``'s rows of dq and its keys' rows of dk and dv are those of
    :func:`attention_backward` on that sequence alone (the slices of q, k,
    v, do, o, lse with the head axis first, ``enable_gqa=True``); the keys of
    a sequence without queries get 0.
    """
    bi = varlen_backward_inputs(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, is_causal,
                                window, scale, softcap, alibi_slopes, sinks)
    a = bi.a
    dq = np.zeros(a.q.shape)
    dk = np.zeros(a.k.shape)
    dv = np.zeros(a.v.shape)
    dsinks = np.zeros((a.B, a.Hq))

    def heads_first(x, part):
        return np.swapaxes(x[part].astype(np.float32), 0, 1)

    for b in range(a.B):
        rows = slice(int(a.cu_q[b]), int(a.cu_q[b + 1]))
        keys = slice(int(a.cu_k[b]), int(a.cu_k[b + 1]))
        if rows.stop == rows.start or a.Hq == 0:
            continue
        gq, gk, gv, gs = _grads(backward_inputs(
            heads_first(bi.do, rows), heads_first(a.q, rows), heads_first(a.k, keys),
            heads_first(a.v, keys), heads_first(bi.o, rows), heads_first(bi.lse, rows), None,
            a.is_causal, a.window, a.scale, True, softcap=a.softcap or None,
            alibi_slopes=None if a.alibi_slopes is None else a.alibi_slopes[b],
            sinks=None if a.sinks is None else a.sinks[b]))
        dq[rows] = np.swapaxes(gq, 0, 1)
        dk[keys] = np.swapaxes(gk, 0, 1)
        dv[keys] = np.swapaxes(gv, 0, 1)
        if gs is not None:
            dsinks[b] = gs
    return _float32_grads((dq, dk, dv, None if bi.sinks_shape is None
                           else sum_to_shape(dsinks, bi.sinks_shape)))


# ----------------------------------------------------------------------------
# Merging partial results


@foreign_keywords
def merge_attention(outs: ArrayLike, lses: ArrayLike, *,
                    out: Optional[Float32Array] = None) -> WithLse:
    """Reference merge of partial attention results over disjoint key sets:
    ``lse = log(sum_p exp(lse_p))``, ``o = sum_p exp(lse_p - lse) * o_p``, in
    float64 (see :func:`fastattn.merge_attention`)."""
    parts, part_lses, shape = merge_inputs(outs, lses)
    P = len(parts)
    o_p = np.stack([a.astype(np.float64) for a in parts]) if P else np.zeros((0,) + shape)
    l_p = (np.stack([a.astype(np.float64) for a in part_lses]) if P
           else np.zeros((0,) + shape[:-1]))
    with np.errstate(all="ignore"):
        m = np.max(l_p, axis=0, initial=-np.inf)  # NaN propagates
        shift = np.where(np.isfinite(m), m, 0.0)
        w = np.exp(l_p - shift)                  # -inf partials: weight exactly 0
        total = np.sum(w, axis=0)
        lse = shift + np.log(total)
        coef = np.where(l_p == -np.inf, 0.0, w / total)
        # a partial of lse -inf is never read: its o_p (maybe NaN) is replaced by 0
        o = np.sum(coef[..., None] * np.where((l_p == -np.inf)[..., None], 0.0, o_p), axis=0)
    # the row rules: no partial with a key -> 0, -inf; NaN -> NaN; +inf -> NaN, +inf
    none, nan, inf = m == -np.inf, np.isnan(m), m == np.inf
    lse = np.where(none, -np.inf, np.where(nan, np.nan, np.where(inf, np.inf, lse)))
    o = np.where(none[..., None], 0.0, np.where((nan | inf)[..., None], np.nan, o))
    return (_finish(o, out, [("outs", parts), ("lses", part_lses), ("outs", outs),
                             ("lses", lses)]),
            lse.astype(np.float32))
