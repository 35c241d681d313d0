"""fastattn.torch: fastattn's attention as a differentiable PyTorch operator.

:func:`scaled_dot_product_attention` takes the arguments of
``torch.nn.functional.scaled_dot_product_attention`` and returns a tensor:
the forward runs fastattn's compiled kernels on the tensors' memory, and the
backward :func:`fastattn.attention_backward`, so that a model trains with it.
Both are registered with ``torch.library`` as the custom operators
``fastattn::sdpa`` (returning the output and its log-sum-exp, in float32)
and ``fastattn::sdpa_backward``, each with a fake (meta) implementation:
``fastattn::sdpa`` works under ``torch.compile`` and passes
``torch.library.opcheck``, and its autograd formula calls
``fastattn::sdpa_backward``, which is not differentiable itself (second
derivatives raise NotImplementedError).

PyTorch is an optional dependency of fastattn: ``import fastattn`` does not
import this module, and this module needs ``torch`` (its CPU build suffices,
``pip install torch --index-url https://download.pytorch.org/whl/cpu``).
"""
import importlib
import math
import operator
from typing import Any, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from fastattn._attention import scaled_dot_product_attention as _np_sdpa
from fastattn._backward import attention_backward as _np_backward

__all__ = ["scaled_dot_product_attention"]

# The dtypes of q, k and v; the result is computed in float32 whatever they are.
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_ml_dtypes: Any
try:  # bfloat16 tensors are read in place as ml_dtypes.bfloat16 arrays
    _ml_dtypes = importlib.import_module("ml_dtypes")
except ImportError:  # pragma: no cover - ml_dtypes comes with the test extra
    _ml_dtypes = None


def _as_numpy(t: Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory (no copy): float32, float16 and
    bool directly, bfloat16 as ``ml_dtypes.bfloat16`` (a float32 copy without
    ml_dtypes)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        if _ml_dtypes is None:
            return t.float().numpy()
        return t.view(torch.int16).numpy().view(_ml_dtypes.bfloat16)
    return t.numpy()


def _optional(t: Optional[Tensor]) -> Optional[np.ndarray]:
    return None if t is None else _as_numpy(t)


def _window(left: Optional[int], right: Optional[int]) -> Optional[Tuple[Optional[int],
                                                                         Optional[int]]]:
    return None if left is None and right is None else (left, right)


def _tensor(a: np.ndarray) -> Tensor:
    """A fresh float32 array as a tensor sharing its memory."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


# ---------------------------------------------------------------- the operators
# Their semantics are fastattn's (query row i at key position i + S - L, so
# is_causal is bottom-right); the public function maps torch's onto them.

@torch.library.custom_op("fastattn::sdpa", mutates_args=())
def _sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
          is_causal: bool, scale: Optional[float], enable_gqa: bool,
          window_left: Optional[int], window_right: Optional[int], softcap: Optional[float],
          alibi_slopes: Optional[Tensor], sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """fastattn.scaled_dot_product_attention(..., return_lse=True) on tensors:
    (out, lse), both float32."""
    _check_cpu(query, key, value, attn_mask, alibi_slopes, sinks)
    out, lse = _np_sdpa(_as_numpy(query), _as_numpy(key), _as_numpy(value), _optional(attn_mask),
                        is_causal=is_causal, window=_window(window_left, window_right),
                        scale=scale, softcap=softcap, alibi_slopes=_optional(alibi_slopes),
                        sinks=_optional(sinks), enable_gqa=enable_gqa, return_lse=True)
    return _tensor(out), _tensor(lse)


def _batch(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> Tuple[Any, ...]:
    """The broadcast batch shape of an attention call (fastattn's rule)."""
    if enable_gqa:
        return tuple(torch.broadcast_shapes(query.shape[:-3], key.shape[:-3],
                                            value.shape[:-3])) + (query.shape[-3],)
    return tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2]))


@_sdpa.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left,
               window_right, softcap, alibi_slopes, sinks):
    batch = _batch(query, key, value, enable_gqa)
    L, Dv = query.shape[-2], value.shape[-1]
    return (query.new_empty(batch + (L, Dv), dtype=torch.float32),
            query.new_empty(batch + (L,), dtype=torch.float32))


@torch.library.custom_op("fastattn::sdpa_backward", mutates_args=())
def _sdpa_backward(grad_out: Tensor, grad_lse: Optional[Tensor], query: Tensor, key: Tensor,
                   value: Tensor, out: Tensor, lse: Tensor, attn_mask: Optional[Tensor],
                   is_causal: bool, scale: Optional[float], enable_gqa: bool,
                   window_left: Optional[int], window_right: Optional[int],
                   softcap: Optional[float], alibi_slopes: Optional[Tensor],
                   sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """fastattn.attention_backward on tensors: (dq, dk, dv, dsinks), float32 in
    the shapes of query, key, value and sinks (dsinks of shape (0,) without
    sinks). grad_lse, the gradient with respect to lse, may be None."""
    _check_cpu(grad_out, grad_lse, query, key, value, out, lse, attn_mask, alibi_slopes, sinks)
    do, o, v = _as_numpy(grad_out), _as_numpy(out), _as_numpy(value)
    g_lse = None if grad_lse is None else _as_numpy(grad_lse)
    with_lse = g_lse is not None and bool(np.any(g_lse))
    if g_lse is not None and with_lse:
        # d lse_i / d s_ij = P_ij, so the gradient of lse adds P_ij * dlse_i to
        # that of the scores, dS_ij = P_ij (do_i . v_j - Delta_i + dlse_i), and
        # P_sink_i * dlse_i to that of the sink: Delta_i = do_i . o_i becomes
        # Delta_i - dlse_i. One column more on do (dlse), o (-1) and v (0)
        # makes the kernels compute exactly that.
        dlse = np.asarray(g_lse, np.float32)[..., None]
        do = np.concatenate([np.asarray(do, np.float32), dlse], axis=-1)
        o = np.concatenate([o, np.full(o.shape[:-1] + (1,), -1.0, np.float32)], axis=-1)
        v = np.concatenate([np.asarray(v, np.float32), np.zeros(v.shape[:-1] + (1,),
                                                                np.float32)], axis=-1)
    grads = _np_backward(do, _as_numpy(query), _as_numpy(key), v, o, _as_numpy(lse),
                         _optional(attn_mask), is_causal=is_causal,
                         window=_window(window_left, window_right), scale=scale,
                         softcap=softcap, alibi_slopes=_optional(alibi_slopes),
                         sinks=_optional(sinks), enable_gqa=enable_gqa)
    dq, dk, dv = grads[:3]
    if with_lse:
        dv = dv[..., :-1]
    dsinks = grads[3] if sinks is not None else np.zeros(0, np.float32)
    return _tensor(dq), _tensor(dk), _tensor(dv), _tensor(dsinks)


@_sdpa_backward.register_fake
def _sdpa_backward_fake(grad_out, grad_lse, query, key, value, out, lse, attn_mask, is_causal,
                        scale, enable_gqa, window_left, window_right, softcap, alibi_slopes,
                        sinks):
    f32 = torch.float32
    return (query.new_empty(query.shape, dtype=f32), query.new_empty(key.shape, dtype=f32),
            query.new_empty(value.shape, dtype=f32),
            query.new_empty(sinks.shape if sinks is not None else (0,), dtype=f32))


def _setup_context(ctx, inputs, output):
    (query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left, window_right,
     softcap, alibi_slopes, sinks) = inputs
    out, lse = output
    ctx.set_materialize_grads(False)  # the gradient of an unused output (lse) stays None
    ctx.save_for_backward(query, key, value, out, lse, attn_mask, alibi_slopes, sinks)
    ctx.options = (is_causal, scale, enable_gqa, window_left, window_right, softcap)


def _sdpa_grad(ctx, grad_out, grad_lse):
    query, key, value, out, lse, attn_mask, alibi_slopes, sinks = ctx.saved_tensors
    is_causal, scale, enable_gqa, window_left, window_right, softcap = ctx.options
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dsinks = torch.ops.fastattn.sdpa_backward(
        grad_out, grad_lse, query, key, value, out, lse, attn_mask, is_causal, scale,
        enable_gqa, window_left, window_right, softcap, alibi_slopes, sinks)
    return (dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), None, None, None, None,
            None, None, None, None, dsinks.to(sinks.dtype) if sinks is not None else None)


_sdpa.register_autograd(_sdpa_grad, setup_context=_setup_context)


def _no_second_derivative(ctx, *grads):
    raise NotImplementedError(
        "fastattn.torch: second derivatives of attention (a backward through the backward, "
        "e.g. a gradient penalty or a Hessian-vector product) are not implemented; use "
        "torch.nn.functional.scaled_dot_product_attention for them")


_sdpa_backward.register_autograd(_no_second_derivative,
                                 setup_context=lambda ctx, inputs, output: None)


# ------------------------------------------------------------------ the checks

def _check_cpu(*tensors: Optional[Tensor]) -> None:
    for t in tensors:
        if t is not None and t.device.type != "cpu":
            raise ValueError(f"fastattn.torch runs on the CPU: got a tensor on {t.device} "
                             f"(move the tensors with .cpu())")


def _check_qkv(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is a tensor on {t.device}; fastattn.torch runs on the CPU: "
                         f"pass {name}.cpu()")
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16 (fastattn computes in "
                        f"float32), got {t.dtype}")
    if t.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions (..., rows, features), got "
                         f"shape {tuple(t.shape)}")


def _constant(name: str, x: Any) -> Optional[Tensor]:
    """An optional tensor argument that has no gradient here (mask, slopes)."""
    if x is None:
        return None
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.device.type != "cpu":
        raise ValueError(f"{name} is a tensor on {t.device}; fastattn.torch runs on the CPU: "
                         f"pass {name}.cpu()")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, but fastattn.torch computes no gradient "
                         f"for it: pass {name}.detach()")
    if name != "attn_mask" and t.dtype != torch.float32:
        t = t.float()
    return t


def _window_pair(window: Any) -> Tuple[Optional[int], Optional[int]]:
    if window is None:
        return None, None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair (left, right) of ints >= 0 or None, got "
                         f"{window!r}") from None
    sides = []
    for side in (left, right):
        if side is not None:
            try:  # an int, a NumPy integer or a 0-d integer tensor; not a bool
                side = None if isinstance(side, bool) else operator.index(side)
            except TypeError:
                side = None
            if side is None or side < 0:
                raise ValueError(f"window must be a pair (left, right) of ints >= 0 or None, "
                                 f"got {window!r}")
        sides.append(side)
    return sides[0], sides[1]


def _top_left(L: int, S: int, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
              left: Optional[int], right: Optional[int], alibi_slopes: Optional[Tensor],
              sinks: Optional[Tensor]):
    """torch's causal rule for ``L != S`` (key j for query row i when j <= i,
    top-left) in fastattn's terms (row i at key position p_i = i + S - L).

    Returns (key, value, attn_mask, is_causal, left, right). With L > S,
    ``j <= i`` is ``j <= p_i + (L - S)``: a right window bound, free. With
    L < S, keys ``j >= L`` are allowed to no row, so key, value and the mask
    are cut to the first L keys (views), where top-left and bottom-right
    agree: the kernels skip the rest, and autograd gives the cut keys zero
    gradient. A left window bound moves with the cut; where that leaves
    no key, or where ALiBi (whose per-row constant the cut changes) meets
    sinks (against which that constant counts), the rule becomes a bool
    mask instead.
    """
    if L > S:
        right = L - S if right is None else min(right, L - S)
        return key, value, attn_mask, False, left, right
    shift = S - L
    if (left is None or left >= shift) and (alibi_slopes is None or sinks is None):
        if attn_mask is not None and attn_mask.dim() >= 1 and attn_mask.shape[-1] == S:
            attn_mask = attn_mask[..., :L]
        left = None if left is None else left - shift
        return key[..., :L, :], value[..., :L, :], attn_mask, True, left, None
    allowed = torch.ones(L, S, dtype=torch.bool).tril()
    if attn_mask is None:
        attn_mask = allowed
    elif attn_mask.dtype == torch.bool:
        attn_mask = attn_mask & allowed
    else:
        attn_mask = attn_mask.masked_fill(~allowed, -math.inf)
    return key, value, attn_mask, False, left, right


# ------------------------------------------------------------------ the function

def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *,
                                 window: Optional[Tuple[Optional[int], Optional[int]]] = None,
                                 softcap: Optional[float] = None,
                                 alibi_slopes: Optional[Tensor] = None,
                                 sinks: Optional[Tensor] = None) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``, computed by fastattn, differentiable.

    ``softmax(scale * query @ key.T + mask) @ value`` with the signature and
    semantics of PyTorch's function, on CPU tensors, through fastattn's
    kernels: exact in float32, tiled (no L x S matrix), deterministic. It
    supports autograd (the backward is :func:`fastattn.attention_backward`),
    ``torch.compile`` (as the custom operator ``fastattn::sdpa``) and
    fastattn's extra score options as keywords.

    Parameters
    ----------
    query : torch.Tensor, shape (..., L, E), float32, float16 or bfloat16
        Queries; with `enable_gqa`, shape (..., Hq, L, E).
    key : torch.Tensor, shape (..., S, E), float32, float16 or bfloat16
        Keys; with `enable_gqa`, shape (..., Hkv, S, E).
    value : torch.Tensor, shape (..., S, Ev), float32, float16 or bfloat16
        Values; with `enable_gqa`, shape (..., Hkv, S, Ev). The leading
        dims of the three broadcast; their dtypes may differ. All three on
        the CPU.
    attn_mask : torch.Tensor, optional
        Bool (True = the key takes part) or floating (added to the scores,
        -inf masks), broadcastable to (..., L, S). Never expanded.
    dropout_p : float, default 0.0
        Must be 0: fastattn has no dropout.
    is_causal : bool, default False
        Query row i attends to key j when ``j <= i``: aligned top-left, as
        in PyTorch (``torch.ones(L, S).tril()``), whatever L and S.
    scale : float, optional
        Score scale; default ``1 / sqrt(E)``.
    enable_gqa : bool, default False
        Grouped-query attention: query head h (axis -3) reads kv head
        ``h // (Hq // Hkv)``; key and value are never repeated.
    window : (int or None, int or None), optional
        Sliding window ``(left, right)``: query row i, placed at key position
        ``p_i = i + S - L`` (aligned bottom-right, as in fastattn and
        FlashAttention), attends to keys ``p_i - left <= j <= p_i + right``;
        None on a side is unbounded. ``window=(None, 0)`` is causal attention
        aligned bottom-right (the rule for new queries after a KV cache).
    softcap : float, optional
        Soft-capping of the scores, ``softcap * tanh(s / softcap)``.
    alibi_slopes : torch.Tensor or array_like, optional
        ALiBi slopes, one per query head, broadcasting to
        ``query.shape[:-2]``; the bias is ``-slope * |p_i - j|``.
    sinks : torch.Tensor or array_like, optional
        Attention-sink logits, one per query head, broadcasting to
        ``query.shape[:-2]``: a virtual key of that score and value 0. The
        only option with a gradient (when it requires grad).

    Returns
    -------
    torch.Tensor, shape (..., L, Ev), the dtype of `query`
        The attention output. float16 and bfloat16 queries are computed in
        float32 and the output rounded to their dtype at the end.

    Raises
    ------
    TypeError
        If query, key or value is not a dense torch tensor of float32,
        float16 or bfloat16 (fastattn does not compute in float64), and for
        the arguments that :func:`fastattn.scaled_dot_product_attention`
        refuses.
    ValueError
        If `dropout_p` is not 0, a tensor is not on the CPU, `attn_mask` or
        `alibi_slopes` requires grad (they get no gradient here), `window`
        is not a pair of ints >= 0 or None, and for the shapes and values
        that :func:`fastattn.scaled_dot_product_attention` refuses.

    Notes
    -----
    Differences from PyTorch's function:

    - No dropout (`dropout_p` must be 0).
    - No second derivatives (a backward of the backward raises
      NotImplementedError), and no ``torch.func`` transforms of the
      backward (``torch.func.grad``).
    - `attn_mask` and `is_causal` may be given together (both apply);
      PyTorch refuses the pair.
    - The masks and slopes get no gradient (an error if they require one).
    - float16 and bfloat16 are computed in float32 (key and value read as
      stored), the output rounded once to the query's dtype and each
      gradient to its argument's; float64 is refused rather than computed
      in float32.
    - query, key and value may differ in dtype (a float32 query against a
      bfloat16 cache, say); PyTorch wants one dtype.
    - `window`, `softcap`, `alibi_slopes` and `sinks` are fastattn's extras.

    The forward and backward run fastattn's OpenMP threads
    (:func:`fastattn.set_num_threads`, not ``torch.set_num_threads``), with
    results bitwise identical for every thread count, gradients included.
    Tensors with contiguous rows (last axis) are read in place (bfloat16
    ones through ``ml_dtypes``, when it is installed); others are copied
    once. The saved state for the backward is the inputs, the output and one
    float per query row. A query row that no key may attend to gives zeros,
    as in PyTorch, and passes no gradient back.

    With ``L != S``, torch's causal rule is put in fastattn's terms at no
    cost: ``L > S`` adds a right window bound, ``L < S`` drops the keys past
    L, which no row may see (they get zero gradient).

    Examples
    --------
    Against PyTorch's own function, then a backward pass:

    .. doctest::
       :skipif: no_torch

       >>> import torch
       >>> from fastattn.torch import scaled_dot_product_attention
       >>> q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
       >>> out = scaled_dot_product_attention(q, k, v, is_causal=True)
       >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
       >>> bool(torch.allclose(out, ref, atol=1e-5))
       True
       >>> out.sum().backward()
       >>> q.grad.shape
       torch.Size([2, 4, 16, 8])
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_qkv(name, t)
        if enable_gqa and t.dim() < 3:
            raise ValueError(f"with enable_gqa=True, {name} must have a head axis "
                             f"(..., heads, rows, features), got shape {tuple(t.shape)}")
    if dropout_p != 0.0:
        raise ValueError(f"fastattn has no dropout: dropout_p must be 0.0, got {dropout_p!r} "
                         f"(pass dropout_p=0.0, e.g. a model's attention dropout set to 0)")
    attn_mask = _constant("attn_mask", attn_mask)
    alibi_slopes = _constant("alibi_slopes", alibi_slopes)
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            sinks = torch.as_tensor(np.asarray(sinks), dtype=torch.float32)
        _check_cpu(sinks)
        if sinks.dtype not in (torch.float32, torch.float64):
            sinks = sinks.float()  # (differentiable: the gradient comes back in its dtype)
    left, right = _window_pair(window)
    scale = None if scale is None else float(scale)
    softcap = None if softcap is None else float(softcap)
    is_causal, enable_gqa = bool(is_causal), bool(enable_gqa)
    L, S = query.shape[-2], key.shape[-2]
    if is_causal and L != S:
        key, value, attn_mask, is_causal, left, right = _top_left(
            L, S, key, value, attn_mask, left, right, alibi_slopes, sinks)
    out, _ = torch.ops.fastattn.sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                     left, right, softcap, alibi_slopes, sinks)
    return out if query.dtype == torch.float32 else out.to(query.dtype)
