"""The attention kernel's argument record, built in one place, and its one runner.

Every attention call reaches C through ``_core.attention``, whose keywords are
the fields of the kernel's argument record (``fa_attn_args`` in
csrc/fastattn.h). A record has two parts:

- where each row lies: the offsets of every batch item's q, k and v (and
  mask, segment ids) and their row strides, in elements from each array's
  element [0, ..., 0]. This part depends on the layout of the inputs, and
  each layout has its function here, from the validated inputs that
  fastattn._validate makes of the caller's arguments:
  ``AttentionInputs`` (dense, broadcast batch) -> _dense,
  ``VarlenInputs`` (packed sequences) -> _varlen,
  ``PagedInputs`` (a paged KV cache) -> _paged;
- what to compute: the element types of k and v, the scale, causal, window,
  softcap, ALiBi slopes and sinks, the result and lse buffers and the thread
  count. This part is the same for every layout, and run() adds it.

So each operation is validate -> run(inputs, result, lse): run() is the only
caller of ``_core.attention``.

The common dense call takes a shorter road to the same record:
``_core.sdpa_plain`` (the fast path of dense attention) accepts only
inputs that _validate.attention_inputs would pass through unconverted, and
fills ``fa_attn_args`` from their buffers in one step, with the offsets,
strides, scale and options that _dense and run() give them, so the kernel
sees the same record and gives the same bits (tests/test_call_cost.py holds
the two to that). It declines everything else, which then comes here.
"""
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from fastattn import _core
from fastattn._quant import QuantizedArray
from fastattn._threads import get_num_threads
from fastattn._validate import AttentionInputs, PagedInputs, VarlenInputs

Layout = Optional[Dict[str, Any]]


def _strides(arr: np.ndarray, ndim: int) -> List[int]:
    """Element strides of `arr` broadcast to `ndim` dimensions (its axes
    right-aligned; 0 on length-1 axes, which broadcast). Any strides that are
    whole elements (see fastattn._validate.rows_in_place)."""
    strides = [0] * ndim
    size = arr.itemsize
    for axis in range(1, arr.ndim + 1):
        if arr.shape[-axis] != 1:
            strides[-axis] = arr.strides[-axis] // size
    return strides


def _layout(arr: np.ndarray, batch: Tuple[int, ...],
            group: int = 1) -> Tuple[np.ndarray, int, int]:
    """(offsets, stride of axis -2, stride of axis -1) of `arr` broadcast over
    `batch` + its last two axes. offsets[j] is the element offset of the
    trailing 2-d block of item j of `batch` (flattened in C order) from
    arr's element [0, ..., 0]. With group > 1 (GQA) arr's head axis has
    batch[-1] // group heads and query head h reads head h // group: an index
    map, k and v are never repeated."""
    strides = _strides(arr, len(batch) + 2)
    return _core.block_offsets(tuple(batch), strides[:-2], group), strides[-2], strides[-1]


def _units(arr: Any) -> np.ndarray:
    """k or v as an ndarray of the units its offsets and strides count: the
    array itself, or a QuantizedArray's blocks as one item per block (the
    last axis D // 32 long), which the kernels' bounds are checked in."""
    if isinstance(arr, QuantizedArray):
        return arr._items()
    return arr


def kv_operand(arr: Any) -> Tuple[np.ndarray, int]:
    """(array the kernel reads, its dtype code): k or v as stored, of one of
    the kernels' element types (_core.DTYPE_CODES, the rows of csrc/dtypes.h,
    by NumPy name, or a QuantizedArray's format); a type NumPy's buffer
    protocol cannot export (ml_dtypes' bfloat16) as the unsigned integers of
    its bits."""
    if isinstance(arr, QuantizedArray):
        return _units(arr), _core.DTYPE_CODES[arr.format]
    code = _core.DTYPE_CODES[arr.dtype.name]
    if arr.dtype.kind == "V":
        arr = arr.view(np.dtype(f"u{arr.dtype.itemsize}"))
    return arr, code


def _dense(a: AttentionInputs, result: np.ndarray, lse: Optional[np.ndarray]) -> Layout:
    """Where the rows of dense inputs lie: q, k, v, the mask and the segment
    ids broadcast over the batch a.batch, read in place with their strides."""
    if result.size == 0 and (lse is None or lse.size == 0):
        return None  # (no batch item has a row to write: no offsets to make either)
    flat_mask, mask_off, mask_sl, mask_ss = None, None, 0, 0
    if a.mask is not None:
        mask_off, mask_sl, mask_ss = _layout(a.mask, a.batch)
        flat = a.mask.reshape(-1)
        flat_mask = flat.view(np.uint8) if flat.dtype == np.bool_ else flat
    segments = None
    if a.segments is not None:
        ids_q, ids_kv = a.segments.q, a.segments.kv
        nd = len(a.batch) + 1
        segments = (ids_q.reshape(-1), ids_kv.reshape(-1),
                    _core.block_offsets(tuple(a.batch), _strides(ids_q, nd)[:-1], 1),
                    _core.block_offsets(tuple(a.batch), _strides(ids_kv, nd)[:-1], 1),
                    _strides(ids_q, nd)[-1], _strides(ids_kv, nd)[-1], a.segments.sorted)
    q_off, q_rs, _ = _layout(a.q, a.batch)
    k_off, k_rs, _ = _layout(_units(a.k), a.batch, a.group)
    v_off, v_rs = _layout(_units(a.v), a.batch, a.group)[:2] if a.v is not None else (None, 0)
    return dict(q_off=q_off, k_off=k_off, v_off=v_off, q_rs=q_rs, k_rs=k_rs, v_rs=v_rs,
                nbatch=math.prod(a.batch), L=a.L, S=a.S, mask=flat_mask, mask_off=mask_off,
                mask_sl=mask_sl, mask_ss=mask_ss, segments=segments)


def _varlen(a: VarlenInputs, result: np.ndarray, lse: Optional[np.ndarray]) -> Layout:
    """Where the rows of packed sequences lie: a batch item per (sequence, query
    head), the result's rows packed as q's (fa_varlen_f32)."""
    total_q = a.q.shape[0]
    if not (a.B > 0 and total_q > 0 and a.Hq > 0):
        return None
    group = a.Hq // a.Hkv

    def rows(arr, cu, g):  # row 0 of each (sequence, query head) of arr, and the row stride
        arr = _units(arr)
        rs, hs = (x // arr.itemsize for x in arr.strides[:2])
        return _core.varlen_offsets(cu, a.Hq, g, rs, hs), rs

    q_off, q_rs = rows(a.q, a.cu_q, 1)
    k_off, k_rs = rows(a.k, a.cu_k, group)
    v_off, v_rs = rows(a.v, a.cu_k, group)
    o_off = _core.varlen_offsets(a.cu_q, a.Hq, 1, a.Hq * a.Dv, a.Dv)
    lse_off = _core.varlen_offsets(a.cu_q, a.Hq, 1, a.Hq, 1)
    return dict(q_off=q_off, k_off=k_off, v_off=v_off, q_rs=q_rs, k_rs=k_rs, v_rs=v_rs,
                nbatch=a.Hq, L=0, S=0,
                varlen=(a.cu_q, a.cu_k, o_off, lse_off, a.Hq * a.Dv, a.Hq))


def _paged(a: PagedInputs, result: np.ndarray, lse: Optional[np.ndarray]) -> Layout:
    """Where the rows of a paged KV cache lie: q as dense inputs, key j of
    batch item b at row j % block_size of page table[b, j // block_size]."""
    if not (a.B * a.Hq and a.L):
        return None
    k, v = _units(a.k), _units(a.v)
    kst = [st // k.itemsize for st in k.strides]
    vst = [st // v.itemsize for st in v.strides]
    batch = (a.B, a.Hq)
    q_off, q_rs, _ = _layout(a.q, batch)
    return dict(q_off=q_off, k_off=_core.block_offsets(batch, [0, kst[2]], a.group),
                v_off=_core.block_offsets(batch, [0, vst[2]], a.group),
                q_rs=q_rs, k_rs=kst[1], v_rs=vst[1], nbatch=a.B * a.Hq, L=a.L, S=a.S,
                block_table=a.table.reshape(-1),
                bt_off=_core.block_offsets(batch, [a.table.shape[1], 0], 1),
                block_size=a.block_size, num_pages=a.num_pages, k_ps=kst[0], v_ps=vst[0])


_LAYOUTS: Dict[type, Callable[..., Layout]] = {
    AttentionInputs: _dense, VarlenInputs: _varlen, PagedInputs: _paged}


def run(a: Any, result: np.ndarray, lse: Optional[np.ndarray] = None, *,
        weights: bool = False, alibi_shift: int = 0) -> None:
    """Run the attention kernel on validated inputs `a` (AttentionInputs,
    VarlenInputs or PagedInputs) into `result` (the output, or with `weights`
    the attention weights: dense inputs without v only) and `lse` (None, or
    the log-sum-exp of each row), both new C-contiguous float32 arrays or an
    `out=` that fastattn._validate.check_out passed.

    alibi_shift: added to each query's position in ALiBi's |p - j| (the
    offset of a block of a longer sequence: fastattn.dask; 0 otherwise).
    """
    where = _LAYOUTS[type(a)](a, result, lse)
    if where is None:
        return  # nothing to compute
    k_arr, k_dtype = kv_operand(a.k)
    v_arr, v_dtype = kv_operand(a.v) if a.v is not None else (None, k_dtype)
    left, right = a.window
    _core.attention(
        a.q, k_arr, v_arr, k_dtype=k_dtype, v_dtype=v_dtype, D=a.D, Dv=a.Dv, scale=a.scale,
        out=result.reshape(-1), nthreads=get_num_threads(),
        lse=None if lse is None else lse.reshape(-1), is_causal=a.is_causal,
        win_left=-1 if left is None else left, win_right=-1 if right is None else right,
        weights=weights, softcap=a.softcap,
        alibi_slopes=None if a.alibi_slopes is None else a.alibi_slopes.reshape(-1),
        sinks=None if a.sinks is None else a.sinks.reshape(-1), alibi_shift=alibi_shift,
        **where,
    )


def run_backward(a: Any, dout: np.ndarray, out: np.ndarray, lse: np.ndarray, dq: np.ndarray,
                 dk: np.ndarray, dv: np.ndarray, dsinks: Optional[np.ndarray]) -> None:
    """Run the attention backward on validated forward inputs `a`
    (AttentionInputs or VarlenInputs) into new C-contiguous float32 arrays:
    dense inputs: dq (nbatch, L, D), dk (nbatch // group, S, D), dv
    (nbatch // group, S, Dv), dsinks (nbatch,) or None, with dout and out
    C-contiguous (nbatch, L, Dv) and lse (nbatch, L), nbatch the flattened
    a.batch (kv item c serves batch items c * group ... c * group + group -
    1); packed inputs: dq, dk, dv, dout, out and lse packed as q, k, v, the
    output and lse of the forward, C-contiguous."""
    if a.Dv == 0:  # o has no columns: no loss depends on q, k or the sinks (zeros)
        return
    if not out.flags.writeable:  # the backward only reads o, through the output's slot
        out = out.copy()
    where = _LAYOUTS[type(a)](a, out, lse)
    if where is None:
        return
    group = a.group if isinstance(a, AttentionInputs) else a.Hq // a.Hkv
    if isinstance(a, VarlenInputs):
        Hkv = a.Hkv
        dq_off, dq_rs = _core.varlen_offsets(a.cu_q, a.Hq, 1, a.Hq * a.D, a.D), a.Hq * a.D
        dk_off, dk_rs = _core.varlen_offsets(a.cu_k, Hkv, 1, Hkv * a.D, a.D), Hkv * a.D
        dv_off, dv_rs = _core.varlen_offsets(a.cu_k, Hkv, 1, Hkv * a.Dv, a.Dv), Hkv * a.Dv
    else:
        nbatch = where["nbatch"]
        dq_off, dq_rs = np.arange(nbatch, dtype=np.int64) * (a.L * a.D), a.D
        kv = np.arange(nbatch // group, dtype=np.int64)
        dk_off, dk_rs = kv * (a.S * a.D), a.D
        dv_off, dv_rs = kv * (a.S * a.Dv), a.Dv
    k_arr, k_dtype = kv_operand(a.k)
    v_arr, v_dtype = kv_operand(a.v)
    left, right = a.window
    _core.attention(
        a.q, k_arr, v_arr, k_dtype=k_dtype, v_dtype=v_dtype, D=a.D, Dv=a.Dv, scale=a.scale,
        out=out.reshape(-1), nthreads=get_num_threads(), is_causal=a.is_causal,
        win_left=-1 if left is None else left, win_right=-1 if right is None else right,
        softcap=a.softcap,
        alibi_slopes=None if a.alibi_slopes is None else a.alibi_slopes.reshape(-1),
        sinks=None if a.sinks is None else a.sinks.reshape(-1),
        backward=(group, dout.reshape(-1), lse.reshape(-1), dq.reshape(-1), dq_off, dq_rs,
                  dk.reshape(-1), dk_off, dk_rs, dv.reshape(-1), dv_off, dv_rs,
                  None if dsinks is None else dsinks.reshape(-1)),
        **where,
    )
