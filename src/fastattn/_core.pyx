# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Thin nogil wrappers over the C kernels in csrc/ (see csrc/fastattn.h).

Every argument arrives validated and shaped by fastattn._validate and
fastattn._kernel: 1-d C-contiguous float32 / uint8 / int64 buffers and Python
ints (attention's q, k and v: arrays of any strides, read in place from their
first element). Each wrapper releases the GIL for the one C call and maps the
returned status to an exception in _check.
The one exception is sdpa_plain, attention's fast path for the common call:
it checks its own arguments and hands anything it does not take back to the
general path (it returns None), which then raises the errors.
"""
from cpython.buffer cimport (PyBUF_FORMAT, PyBUF_STRIDES, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.float cimport FLT_MAX
from libc.math cimport fabs, isfinite, sqrt
from libc.stdint cimport INT64_MAX, int64_t, intptr_t, uint8_t, uintptr_t
from libc.string cimport memset

import numpy as np

from fastattn._core cimport *


cdef int _check(int status) except -1:
    if status == FA_OK:
        return 0
    if status == FA_ERR_NOMEM:
        raise MemoryError("fastattn: a kernel could not allocate its working memory")
    if status == FA_ERR_ARG:
        raise ValueError("fastattn: a kernel rejected its arguments (a bug in fastattn's "
                         "argument checks; please report it)")
    raise RuntimeError(f"fastattn: internal error in a kernel (status {status})")


cdef inline const float *_fptr(const float[::1] a) noexcept nogil:
    return &a[0] if a.shape[0] > 0 else NULL


cdef inline float *_wptr(float[::1] a) noexcept nogil:
    return &a[0] if a.shape[0] > 0 else NULL


cdef inline const int64_t *_iptr(const int64_t[::1] a) noexcept nogil:
    return &a[0] if a.shape[0] > 0 else NULL


cdef inline fa_span _span(int64_t n) noexcept nogil:
    """The span of a 1-d contiguous array of n elements."""
    cdef fa_span s
    s.lo = 0
    s.hi = n
    return s


cdef fa_span _buffer_span(Py_buffer *view) noexcept:
    """The elements [lo, hi) a strided buffer spans around view.buf, in its
    items (strides that are not whole items count as the items they reach
    into); {0, 0} when it is empty."""
    cdef fa_span s
    cdef Py_ssize_t i
    cdef uintptr_t lo, hi
    cdef int64_t below, above, size = view.itemsize
    s.lo = 0
    s.hi = 0
    for i in range(view.ndim):
        if view.shape[i] == 0:
            return s
    _extent(view, &lo, &hi)
    below = <intptr_t>(lo - <uintptr_t>view.buf)  # (<= 0)
    above = <intptr_t>(hi - <uintptr_t>view.buf)  # (past the last item's last byte)
    s.lo = -((-below + size - 1) // size)
    s.hi = above // size
    return s


OP_SOFTMAX = FA_OP_SOFTMAX
OP_LOG_SOFTMAX = FA_OP_LOG_SOFTMAX
OP_LOGSUMEXP = FA_OP_LOGSUMEXP


def rowwise(const float[::1] x, float[::1] out, int64_t nrows, int64_t n, int op,
            int nthreads):
    """op over nrows contiguous rows of length n of x, into out."""
    cdef int status
    if nrows < 0 or n < 0 or (n > 0 and nrows > INT64_MAX // n):
        raise ValueError("rowwise: bad sizes")
    if x.shape[0] < nrows * n or out.shape[0] < (nrows if op == FA_OP_LOGSUMEXP else nrows * n):
        raise ValueError("rowwise: x or out is smaller than its rows")
    with nogil:
        status = fa_rowwise_f32(_fptr(x), _wptr(out), nrows, n, op, nthreads)
    _check(status)


def block_offsets(tuple batch, strides, int64_t group):
    """offsets[j] = sum_i index_i * strides[i] over the C-order index of item j
    of `batch` (an int64 array of prod(batch) items), the last index divided by
    `group` (under GQA query head h reads kv head h // group)."""
    cdef Py_ssize_t nd = len(batch), i
    cdef int64_t n = 1, j, r, c, off
    cdef int64_t shp[64]  # numpy arrays have at most 64 dimensions
    cdef int64_t st[64]
    cdef int64_t[::1] o
    if nd > 64 or len(strides) != nd or group < 1:
        raise ValueError("block_offsets: bad arguments")
    for i in range(nd):
        shp[i] = batch[i]
        st[i] = strides[i]
        if shp[i] < 0:
            raise ValueError("block_offsets: bad arguments")
        if shp[i] == 0:
            n = 0
        elif n > 0 and shp[i] > (INT64_MAX // 8) // n:
            raise MemoryError(f"fastattn: a batch of shape {batch} has too many items "
                              f"to hold one offset each")
        else:
            n *= shp[i]
    out = np.empty(n, dtype=np.int64)
    o = out
    for j in range(n):
        r = j
        off = 0
        for i in range(nd - 1, -1, -1):
            c = r % shp[i]
            r = r // shp[i]
            if i == nd - 1:
                c = c // group
            off += c * st[i]
        o[j] = off
    return out


def varlen_offsets(const int64_t[::1] cu, int64_t heads, int64_t group, int64_t rs,
                   int64_t hs):
    """offsets[s * heads + h] = cu[s] * rs + (h // group) * hs for the len(cu) - 1
    sequences of a packed batch (an int64 array): where row 0 of head h of
    sequence s starts, rows rs and heads hs elements apart."""
    cdef Py_ssize_t nseq = cu.shape[0] - 1
    cdef int64_t s, h
    cdef int64_t[::1] o
    if nseq < 0 or heads < 0 or group < 1:
        raise ValueError(f"varlen_offsets: expected len(cu) >= 1, heads >= 0 and group >= 1, "
                         f"got {nseq + 1}, {heads} and {group}")
    if heads > 0 and nseq > INT64_MAX // heads:
        raise ValueError(f"varlen_offsets: {nseq} sequences of {heads} heads overflow int64")
    out = np.empty(nseq * heads, dtype=np.int64)
    o = out
    for s in range(nseq):
        for h in range(heads):
            o[s * heads + h] = cu[s] * rs + (h // group) * hs
    return out


def dtype_table():
    """The element types of k and v that the kernels read (csrc/dtypes.h), as
    a tuple of (name, code, bytes, block) rows: the NumPy dtype's name
    (bfloat16: ml_dtypes'), its code in the kernels' arguments, and the bytes
    of a block of `block` elements (1 for a plain element type)."""
    cdef int i, code, nbytes, block
    cdef const char *name
    rows = []
    for i in range(fa_dtype_count()):
        fa_dtype_row(i, &code, &name, &nbytes, &block)
        rows.append((name.decode(), code, nbytes, block))
    return tuple(rows)


DTYPE_CODES = {row[0]: row[1] for row in dtype_table()}  # NumPy name -> code
KEY_TILE = FA_KEY_TILE  # keys of the kernels' tile: a paged cache's pages hold whole tiles
DTYPE_F32 = FA_DTYPE_F32
DTYPE_F16 = FA_DTYPE_F16
DTYPE_BF16 = FA_DTYPE_BF16


cdef int _get(object arr, Py_buffer *view) except -1:
    # Strided, read-only access: view.buf is the address of element [0, ..., 0].
    PyObject_GetBuffer(arr, view, PyBUF_STRIDES)
    return 0


def attention(q, k, v, *, int k_dtype, int v_dtype,
              const int64_t[::1] q_off, const int64_t[::1] k_off,
              const int64_t[::1] v_off, int64_t q_rs, int64_t k_rs, int64_t v_rs,
              int64_t nbatch, int64_t L, int64_t S, int64_t D, int64_t Dv,
              float scale, float[::1] out, int nthreads, lse=None,
              mask=None, const int64_t[::1] mask_off=None, int64_t mask_sl=0,
              int64_t mask_ss=0, bint is_causal=False,
              int64_t win_left=-1, int64_t win_right=-1, bint weights=False,
              block_table=None, bt_off=None, int64_t block_size=0, int64_t num_pages=0,
              int64_t k_ps=0, int64_t v_ps=0,
              float softcap=0.0, alibi_slopes=None, sinks=None, segments=None,
              varlen=None, int64_t alibi_shift=0, backward=None):
    """SDPA (weights=False: out is (nbatch*L*Dv), lse None or (nbatch*L)) or the
    attention weights (weights=True: out is (nbatch*L*S); v and v_off None, Dv
    0: the weights read no values). Every argument after v by keyword.

    q, k, v: arrays (any buffer) whose element [0, ..., 0] the offsets count
    from, in elements: q float32, k and v of k_dtype / v_dtype (DTYPE_F32, or
    DTYPE_F16 / DTYPE_BF16 as uint16 bits). Row i of batch item b of q is at
    q_off[b] + i * q_rs, and likewise for k and v (row strides k_rs, v_rs).
    mask is None, a 1-d uint8 array (bool mask) or a 1-d float32 array, with
    mask_off (per batch item), mask_sl and mask_ss (row and key strides).
    win_left, win_right: the window's sides, -1 unbounded.
    Paged k and v: block_table (1-d int64), bt_off (int64 per batch item: the
    start of its row of block_table), block_size (a multiple of 64),
    num_pages (every entry used must be below it) and the page strides k_ps,
    v_ps: see fa_attn_args in csrc/fastattn.h. The kernel checks the table
    and raises ValueError for an entry out of range.

    softcap: 0 = off. alibi_slopes, sinks: None or nbatch float32 values.
    alibi_shift: added to each query's position in ALiBi's |p - j| (the
    offset of a block of a longer sequence; 0 otherwise).
    segments: None or (q_ids, kv_ids, q_off, kv_off, q_sl, kv_ss, sorted) with
    int64 1-d arrays of ids and per-item offsets.

    varlen: None, or (cu_q, cu_k, o_off, lse_off, o_rs, lse_rs) for a packed
    batch (fa_varlen_f32): nbatch is the heads per sequence, the per-item
    arrays have nseq * nbatch entries, L and S are ignored.

    backward: None, or the gradients of this forward call
    (fa_attention_backward_f32, fa_varlen_backward_f32): a tuple (group,
    dout, lse, dq, dq_off, dq_rs, dk, dk_off, dk_rs, dv, dv_off, dv_rs,
    dsinks) of 1-d float32 and int64 arrays (dsinks None without sinks).
    `out` is then the forward's output, read at the output layout as dout
    is; `lse` (the argument) must be None: the backward's lse is read-only.
    """
    cdef const int64_t[::1] cu_q
    cdef const int64_t[::1] cu_k
    cdef const int64_t[::1] o_off
    cdef const int64_t[::1] lse_off
    cdef int64_t nseq = 0
    cdef bint is_varlen = varlen is not None
    cdef fa_attn_args a
    cdef const uint8_t[::1] bmask
    cdef const float[::1] fmask
    cdef const int64_t[::1] bt_view
    cdef const int64_t[::1] bt_off_view
    cdef const float[::1] slopes_view
    cdef const float[::1] sinks_view
    cdef const int64_t[::1] seg_q
    cdef const int64_t[::1] seg_k
    cdef const int64_t[::1] seg_q_off
    cdef const int64_t[::1] seg_k_off
    cdef float[::1] lse_view
    cdef float *lse_ptr = NULL
    cdef Py_buffer qb, kb, vb
    cdef int status = FA_OK, held = 0
    cdef fa_bwd_args g
    cdef const float[::1] bw_dout
    cdef const float[::1] bw_out
    cdef const float[::1] bw_lse
    cdef float[::1] bw_dq
    cdef float[::1] bw_dk
    cdef float[::1] bw_dv
    cdef float[::1] bw_dsinks
    cdef bint is_backward = backward is not None
    memset(&a, 0, sizeof(a))
    a.nbatch = nbatch
    a.L = L
    a.S = S
    a.D = D
    a.Dv = Dv
    a.k_dtype = k_dtype
    a.v_dtype = v_dtype
    a.q_off = _iptr(q_off)
    a.k_off = _iptr(k_off)
    a.v_off = _iptr(v_off) if v_off is not None else NULL
    a.q_rs = q_rs
    a.k_rs = k_rs
    a.v_rs = v_rs
    if block_table is not None:
        bt_view = block_table
        bt_off_view = bt_off
        a.block_table = &bt_view[0] if bt_view.shape[0] > 0 else NULL
        a.bt_len = bt_view.shape[0]
        a.bt_off = _iptr(bt_off_view)
        a.block_size = block_size
        a.num_pages = num_pages
        a.k_ps = k_ps
        a.v_ps = v_ps
        if a.block_table == NULL and nbatch > 0 and L > 0 and S > 0:
            raise ValueError("block_table is empty")
    a.mask_kind = FA_MASK_NONE
    a.mask_sl = mask_sl
    a.mask_ss = mask_ss
    if mask is not None:
        if mask_off is None:
            raise ValueError("mask_off is required with a mask")
        a.mask_off = _iptr(mask_off)
        if mask.dtype.kind == "u":
            bmask = mask
            a.mask_kind = FA_MASK_BOOL
            a.bool_mask = &bmask[0] if bmask.shape[0] > 0 else NULL
            a.mask_span = _span(bmask.shape[0])
        else:
            fmask = mask
            a.mask_kind = FA_MASK_FLOAT
            a.float_mask = _fptr(fmask)
            a.mask_span = _span(fmask.shape[0])
    a.is_causal = is_causal
    a.win_left = win_left
    a.win_right = win_right
    a.scale = scale
    a.softcap = softcap
    a.alibi_slopes = NULL
    a.alibi_shift = alibi_shift
    a.sinks = NULL
    a.seg_q = NULL
    a.seg_k = NULL
    a.seg_q_off = NULL
    a.seg_k_off = NULL
    a.seg_q_sl = 0
    a.seg_k_ss = 0
    a.seg_sorted = 0
    if alibi_slopes is not None:
        slopes_view = alibi_slopes
        a.alibi_slopes = _fptr(slopes_view)
        a.slopes_len = slopes_view.shape[0]
    if sinks is not None:
        sinks_view = sinks
        a.sinks = _fptr(sinks_view)
        a.sinks_len = sinks_view.shape[0]
    if segments is not None:
        seg_q, seg_k, seg_q_off, seg_k_off = segments[:4]
        a.seg_q = _iptr(seg_q)
        a.seg_k = _iptr(seg_k)
        a.seg_q_span = _span(seg_q.shape[0])
        a.seg_k_span = _span(seg_k.shape[0])
        a.seg_q_off = _iptr(seg_q_off)
        a.seg_k_off = _iptr(seg_k_off)
        a.seg_q_sl = segments[4]
        a.seg_k_ss = segments[5]
        a.seg_sorted = bool(segments[6])
    if lse is not None:
        lse_view = lse
        lse_ptr = _wptr(lse_view)
        a.lse_span = _span(lse_view.shape[0])
    a.out_span = _span(out.shape[0])
    memset(&g, 0, sizeof(g))
    if is_backward:
        if lse is not None or weights:
            raise ValueError("backward: lse must be None (it is in the backward tuple)")
        g.group = backward[0]
        bw_out = out
        bw_dout = backward[1]
        bw_lse = backward[2]
        bw_dq = backward[3]
        bw_dk = backward[6]
        bw_dv = backward[9]
        g.out = _fptr(bw_out)
        g.out_span = _span(bw_out.shape[0])
        g.dout = _fptr(bw_dout)
        g.dout_span = _span(bw_dout.shape[0])
        g.lse = _fptr(bw_lse)
        g.lse_span = _span(bw_lse.shape[0])
        g.dq = _wptr(bw_dq)
        g.dq_span = _span(bw_dq.shape[0])
        g.dq_off = _iptr(backward[4])
        g.dq_rs = backward[5]
        g.dk = _wptr(bw_dk)
        g.dk_span = _span(bw_dk.shape[0])
        g.dk_off = _iptr(backward[7])
        g.dk_rs = backward[8]
        g.dv = _wptr(bw_dv)
        g.dv_span = _span(bw_dv.shape[0])
        g.dv_off = _iptr(backward[10])
        g.dv_rs = backward[11]
        if backward[12] is not None:
            bw_dsinks = backward[12]
            g.dsinks = _wptr(bw_dsinks)
            g.dsinks_len = bw_dsinks.shape[0]
    if varlen is not None:
        cu_q, cu_k, o_off, lse_off = varlen[:4]
        nseq = cu_q.shape[0] - 1
        if nseq < 0 or cu_k.shape[0] != cu_q.shape[0]:
            raise ValueError("varlen: cu_q and cu_k must have the same length >= 1")
        a.o_off = _iptr(o_off)
        a.lse_off = _iptr(lse_off)
        a.o_rs = varlen[4]
        a.lse_rs = varlen[5]
    try:
        _get(q, &qb)
        held = 1
        _get(k, &kb)
        held = 2
        if v is not None:
            _get(v, &vb)
            held = 3
        a.q = <const float *>qb.buf
        a.k = kb.buf
        a.v = vb.buf if held == 3 else NULL
        a.q_span = _buffer_span(&qb)
        a.k_span = _buffer_span(&kb)
        if held == 3:
            a.v_span = _buffer_span(&vb)
        with nogil:
            if is_backward and is_varlen:
                status = fa_varlen_backward_f32(&a, &g, nseq, &cu_q[0], &cu_k[0], nthreads)
            elif is_backward:
                status = fa_attention_backward_f32(&a, &g, nthreads)
            elif is_varlen:
                status = fa_varlen_f32(&a, nseq, &cu_q[0], &cu_k[0], _wptr(out), lse_ptr,
                                       nthreads)
            elif weights:
                status = fa_attention_weights_f32(&a, _wptr(out), nthreads)
            else:
                status = fa_sdpa_f32(&a, _wptr(out), lse_ptr, nthreads)
    finally:
        if held >= 3:
            PyBuffer_Release(&vb)
        if held >= 2:
            PyBuffer_Release(&kb)
        if held >= 1:
            PyBuffer_Release(&qb)
    _check(status)


# ----------------------------------------------------------------------------
# The plain call: attention's fast path for the common case

cdef object _ndarray = np.ndarray
# The most batch items sdpa_plain takes: its four offsets each fit a
# PyMem_Malloc size (and anything near this size is refused by the result's
# allocation anyway).
cdef int64_t _MAX_ITEMS = (<int64_t>1) << 56
cdef object _empty = np.empty
cdef object _float32 = np.float32


cdef object _new_result(tuple shape, int64_t rows, int64_t cols):
    """A new float32 array of `shape` (rows x cols elements, rows those of
    an input): np.empty's, or, from RESULT_MIN_BYTES on, one on memory kept
    for reuse (result_array, as _validate.new_array does)."""
    if rows > 0 and cols <= INT64_MAX // 4 // rows and rows * cols * 4 >= FA_RESULT_MIN_BYTES:
        return result_array(shape, _float32, rows * cols * 4)
    return _empty(shape, _float32)


cdef bint _take(object x, Py_buffer *view, char code, Py_ssize_t itemsize, bint contiguous,
                int64_t *st):
    """Take x's buffer into view when x is a numpy.ndarray (no subclass) of
    elements `code` ('f': native float32, '?': bool), aligned, with its rows in
    place (the last axis contiguous, every stride a whole number of elements,
    as fastattn._validate.rows_in_place) or, with `contiguous`, C-contiguous;
    st[i] is then axis i's stride in elements, 0 on a length-1 axis (as
    _kernel._strides). 1 then (the caller releases view), else 0, nothing held."""
    cdef Py_ssize_t i, n, s, expect = itemsize
    if type(x) is not _ndarray:
        return 0
    try:
        PyObject_GetBuffer(x, view, PyBUF_STRIDES | PyBUF_FORMAT)
    except Exception:  # e.g. a dtype with no buffer format
        return 0
    if (view.itemsize == itemsize and view.format != NULL and view.format[0] == code
            and view.format[1] == 0 and 1 <= view.ndim <= 64
            and <uintptr_t>view.buf % <uintptr_t>itemsize == 0):
        for i in range(view.ndim - 1, -1, -1):
            n, s = view.shape[i], view.strides[i]
            st[i] = 0
            if n == 1:
                continue
            if contiguous and s != expect:
                break
            if s % itemsize != 0 or (i == view.ndim - 1 and s != itemsize):
                break
            st[i] = s // itemsize
            expect *= n
        else:
            return 1
    PyBuffer_Release(view)
    return 0


cdef object _uint16 = np.uint16
cdef object _bfloat16 = None  # ml_dtypes' bfloat16 dtype, once an array of it was seen


cdef object _QuantizedArray = None  # fastattn.QuantizedArray, once the first k or v was seen


cdef int _take_blocks(object x, Py_buffer *view, int64_t *st, int64_t *per) except -2:
    """_take_kv for a fastattn.QuantizedArray: its blocks as one item per
    block (what _kernel._units passes), the strides in st in blocks, *per the
    elements of a block; its dtype code, else -1, nothing held."""
    cdef Py_ssize_t i, n, s, bb = x.block_bytes
    try:
        PyObject_GetBuffer(x._items(), view, PyBUF_STRIDES)
    except Exception:
        return -1
    if view.itemsize == bb and 1 <= view.ndim <= 64:
        for i in range(view.ndim - 1, -1, -1):
            n, s = view.shape[i], view.strides[i]
            st[i] = 0
            if n == 1:
                continue
            if s % bb != 0:
                break
            st[i] = s // bb
        else:
            per[0] = 32
            return DTYPE_CODES[x.format]
    PyBuffer_Release(view)
    return -1


cdef int _take_kv(object x, Py_buffer *view, int64_t *st, int64_t *per) except -2:
    """Take k or v for sdpa_plain as _take takes q: a numpy.ndarray (no
    subclass), aligned, rows in place, of native float32, float16 or
    bfloat16 (ml_dtypes', read as its uint16 bits, as _kernel.kv_operand
    passes it), or a fastattn.QuantizedArray (_take_blocks). Its dtype code
    (FA_DTYPE_*) then, the strides in st in units of that dtype (elements, or
    blocks of *per elements; *per is 1 for an element type) (the caller
    releases view); else -1, nothing held."""
    global _bfloat16, _QuantizedArray
    per[0] = 1
    if type(x) is not _ndarray:
        if _QuantizedArray is None:
            from fastattn._quant import QuantizedArray
            _QuantizedArray = QuantizedArray
        if type(x) is _QuantizedArray:
            return _take_blocks(x, view, st, per)
        return -1
    c = x.dtype.char
    if c == 'f':
        return FA_DTYPE_F32 if _take(x, view, b'f', 4, 0, st) else -1
    if c == 'e':
        return FA_DTYPE_F16 if _take(x, view, b'e', 2, 0, st) else -1
    if c == 'E':
        d = x.dtype
        if d is not _bfloat16:
            from fastattn._validate import is_bfloat16
            if not (d.isnative and is_bfloat16(d)):
                return -1
            _bfloat16 = d
        if _take(x.view(_uint16), view, b'H', 2, 0, st):
            return FA_DTYPE_BF16
    return -1


cdef inline bint _is_bool(object x):
    return x is True or x is False


cdef bint _window_side(object side, int64_t bound, int64_t *out):
    """A window side as the general path takes it (fastattn._validate.check_window):
    None -> -1 (unbounded), an int >= 0 (not a bool) -> min(side, bound); 0 for
    anything else (the general path then checks it)."""
    if side is None:
        out[0] = -1
        return 1
    if type(side) is not int or side < 0:
        return 0
    out[0] = bound if side > bound else side
    return 1


cdef bint _takes_out(object out, Py_buffer *qb, Py_buffer *kb, Py_buffer *vb, Py_buffer *mb,
                     int nd, int64_t Dv):
    """True when sdpa_plain may write into `out` (see its docstring): the result's
    shape q.shape[:-1] + (Dv,), C-contiguous float32, aligned, writeable, and
    no byte in common with q, k, v or the mask (mb, NULL without one)."""
    cdef Py_buffer ob
    cdef int64_t ost[64]
    cdef uintptr_t lo, hi
    cdef int i
    cdef bint ok
    if not _take(out, &ob, b'f', 4, 1, ost):
        return 0
    ok = ob.ndim == nd and not ob.readonly and ob.shape[nd - 1] == Dv
    for i in range(nd - 1):
        ok = ok and ob.shape[i] == qb.shape[i]
    if ok:
        lo = <uintptr_t>ob.buf
        hi = lo + <uintptr_t>ob.len
        ok = (_disjoint(qb, lo, hi) and _disjoint(kb, lo, hi) and _disjoint(vb, lo, hi)
              and (mb == NULL or _disjoint(mb, lo, hi)))
    PyBuffer_Release(&ob)
    return ok


cdef void _extent(Py_buffer *view, uintptr_t *lo, uintptr_t *hi) noexcept:
    """The bytes [lo, hi) that a strided buffer (every dimension >= 1) can touch."""
    cdef Py_ssize_t i, step
    cdef intptr_t below = 0, above = 0
    for i in range(view.ndim):
        step = (view.shape[i] - 1) * view.strides[i]
        if step < 0:
            below += step
        else:
            above += step
    lo[0] = <uintptr_t>view.buf + below
    hi[0] = <uintptr_t>view.buf + above + view.itemsize


cdef bint _disjoint(Py_buffer *view, uintptr_t lo, uintptr_t hi) noexcept:
    """True when the bytes [lo, hi) lie wholly outside view's extent (no overlap
    possible; numpy.may_share_memory's bounds test, the first step of
    fastattn._validate.shares_memory)."""
    cdef uintptr_t a, b
    _extent(view, &a, &b)
    return hi <= a or b <= lo


def sdpa_plain(q, k, v, mask, is_causal, window, scale, enable_gqa, return_lse,
               int nthreads, out=None):
    """scaled_dot_product_attention for the common case, or None where it does not apply.

    Applies when q, k and v are aligned numpy.ndarrays (no subclass) of
    native float32 (k and v also float16 or ml_dtypes' bfloat16, read as
    stored: a half-precision KV cache, or fastattn.QuantizedArrays whose
    strides are whole blocks: a quantized one) with their rows in place (any
    strides a whole number of elements, the last axis contiguous) and the same number
    of dimensions >= 2, each of k's and v's leading dimensions equal to q's or 1 (with
    enable_gqa: but for the head axis, where q's heads are a multiple of k's
    = v's), every dimension >= 1, D equal and v's rows those of k; mask None
    or a C-contiguous ndarray of bool or float32 that broadcasts to
    q.shape[:-1] + (S,) with no more dimensions; is_causal, enable_gqa and
    return_lse Python bools; window None or a tuple of two sides, each None or
    a Python int >= 0; scale None or a finite Python float within float32's
    range; out None or a writeable, aligned, C-contiguous native float32
    numpy.ndarray (no subclass) of exactly the result's shape whose bytes lie
    outside those of q, k, v and the mask (then the result is written into it
    and it is returned; an out whose bytes interleave an input's without
    sharing any is left to the general path, fastattn._validate.check_out,
    which decides). The caller passes no other option. Anything else
    returns None, for the general path (fastattn._validate and
    fastattn._kernel.run) to convert and check, with its errors: this path
    never raises on its arguments. It gives the kernel exactly the arguments
    the general path gives it (the same offsets, strides and scale), so the
    bits are the same.
    """
    cdef Py_buffer qb, kb, vb, mb, ob, lb
    cdef int held = 0, status = FA_OK, i, nd, nb, mnd, gqa, k_dt, v_dt
    cdef int64_t L, S, D, Dv, nbatch = 1, group = 1, j, r, c, n, qo, ko, vo, mo, kper, vper
    cdef int64_t win_left = -1, win_right = -1
    cdef int64_t qst[64]
    cdef int64_t kst[64]
    cdef int64_t vst[64]
    cdef int64_t mst[64]
    cdef int64_t mview[64]
    cdef int64_t *offs = NULL
    cdef double sc = 0.0
    cdef fa_attn_args a
    if not (_is_bool(is_causal) and _is_bool(enable_gqa) and _is_bool(return_lse)):
        return None
    if type(scale) is float:
        sc = scale
        if not isfinite(sc) or fabs(sc) > FLT_MAX:
            return None
    elif scale is not None:
        return None
    gqa = enable_gqa is True
    if not _take(q, &qb, b'f', 4, 0, qst):
        return None
    held = 1
    try:
        k_dt = _take_kv(k, &kb, kst, &kper)
        if k_dt < 0:
            return None
        held = 2
        v_dt = _take_kv(v, &vb, vst, &vper)
        if v_dt < 0:
            return None
        held = 3
        nd = qb.ndim
        nb = nd - 2  # batch axes: q.shape[:-2] (with GQA its last is the head axis)
        if nd < 2 + gqa or kb.ndim != nd or vb.ndim != nd:
            return None
        L, D = qb.shape[nd - 2], qb.shape[nd - 1]
        S, Dv = kb.shape[nd - 2], vb.shape[nd - 1] * vper  # (a block format's items: blocks)
        if (L < 1 or S < 1 or D < 1 or Dv < 1 or kb.shape[nd - 1] * kper != D
                or vb.shape[nd - 2] != S):
            return None
        if window is not None:
            # A side wider than any query-key distance is unbounded: clamped to L + S.
            if (type(window) is not tuple or len(window) != 2
                    or not _window_side(window[0], L + S, &win_left)
                    or not _window_side(window[1], L + S, &win_right)):
                return None
        # (a batch too large for its offsets, e.g. a broadcast view of 2**60
        # items, is left to the general path, whose checks name it)
        for i in range(nb - gqa):
            n = qb.shape[i]
            if n < 1 or kb.shape[i] not in (1, n) or vb.shape[i] not in (1, n):
                return None
            if n > _MAX_ITEMS // nbatch:
                return None
            nbatch *= n
        if gqa:
            n = qb.shape[nb - 1]  # Hq
            c = kb.shape[nb - 1]  # Hkv
            if n < 1 or c < 1 or vb.shape[nb - 1] != c or n % c != 0:
                return None
            group = n // c
            if n > _MAX_ITEMS // nbatch:
                return None
            nbatch *= n
        for i in range(nd):
            mst[i] = 0  # no mask: offsets of 0 (the loop below reads mst either way)
        if mask is not None:
            if _take(mask, &mb, b'?', 1, 1, mview):
                held = 4
            elif _take(mask, &mb, b'f', 4, 1, mview):
                held = 5
            else:
                return None
            mnd = mb.ndim
            if mnd > nd:
                return None
            # The mask's strides broadcast to q.shape[:-1] + (S,), its axes right-aligned.
            for i in range(nd):
                if i >= nd - mnd:
                    c = mb.shape[i - (nd - mnd)]
                    if c != 1 and c != (S if i == nd - 1 else qb.shape[i]):
                        return None
                    mst[i] = mview[i - (nd - mnd)]
        offs = <int64_t *>PyMem_Malloc(4 * <size_t>nbatch * sizeof(int64_t) + 1)
        if offs == NULL:
            return None  # (the general path's allocations then name what does not fit)
        # Item j of the batch (C order over q.shape[:-2]) starts at sum_i index_i *
        # stride_i in each array, as _kernel._layout gives; with GQA, k and v's head
        # index is q's divided by the group (no kv head is repeated).
        for j in range(nbatch):
            r = j
            qo = ko = vo = mo = 0
            for i in range(nb - 1, -1, -1):
                n = qb.shape[i]
                c = r % n
                r = r // n
                qo += c * qst[i]
                mo += c * mst[i]
                if gqa and i == nb - 1:
                    c = c // group
                ko += c * kst[i]
                vo += c * vst[i]
            offs[j] = qo
            offs[nbatch + j] = ko
            offs[2 * nbatch + j] = vo
            offs[3 * nbatch + j] = mo
        shape = q.shape[:-1]
        try:  # (a result that does not fit: the general path names it in its error)
            if out is None:
                out = _new_result(shape + (Dv,), nbatch * L, Dv)
            elif not _takes_out(out, &qb, &kb, &vb, &mb if held >= 4 else NULL, nd, Dv):
                return None
            lse = _new_result(shape, nbatch * L, 1) if return_lse is True else None
        except (MemoryError, ValueError):
            return None
        memset(&a, 0, sizeof(a))
        a.nbatch = nbatch
        a.L = L
        a.S = S
        a.D = D
        a.Dv = Dv
        a.q = <const float *>qb.buf
        a.k = kb.buf
        a.v = vb.buf
        a.q_span = _buffer_span(&qb)
        a.k_span = _buffer_span(&kb)
        a.v_span = _buffer_span(&vb)
        a.k_dtype = k_dt
        a.v_dtype = v_dt
        a.q_off = offs
        a.k_off = offs + nbatch
        a.v_off = offs + 2 * nbatch
        a.q_rs = qst[nd - 2]  # 0 for a single row, as _kernel._strides
        a.k_rs = kst[nd - 2]
        a.v_rs = vst[nd - 2]
        a.mask_kind = FA_MASK_NONE
        if held >= 4:
            a.mask_kind = FA_MASK_BOOL if held == 4 else FA_MASK_FLOAT
            if held == 4:
                a.bool_mask = <const uint8_t *>mb.buf
            else:
                a.float_mask = <const float *>mb.buf
            a.mask_off = offs + 3 * nbatch
            a.mask_span = _buffer_span(&mb)
            a.mask_sl = mst[nd - 2]
            a.mask_ss = mst[nd - 1]
        a.is_causal = is_causal is True
        a.win_left = win_left
        a.win_right = win_right
        if scale is None:
            sc = 1.0 / sqrt(<double>D)  # as fastattn._validate.check_scale, in double
        a.scale = <float>sc
        PyObject_GetBuffer(out, &ob, PyBUF_WRITABLE)
        try:
            a.out_span = _span(ob.len // 4)
            if lse is not None:
                PyObject_GetBuffer(lse, &lb, PyBUF_WRITABLE)
                a.lse_span = _span(lb.len // 4)
            try:
                with nogil:
                    status = fa_sdpa_f32(&a, <float *>ob.buf,
                                         <float *>lb.buf if return_lse is True else NULL,
                                         nthreads)
            finally:
                if lse is not None:
                    PyBuffer_Release(&lb)
        finally:
            PyBuffer_Release(&ob)
        _check(status)
        return (out, lse) if lse is not None else out
    finally:
        PyMem_Free(offs)
        if held >= 4:
            PyBuffer_Release(&mb)
        if held >= 3:
            PyBuffer_Release(&vb)
        if held >= 2:
            PyBuffer_Release(&kb)
        PyBuffer_Release(&qb)


def exp_diff(const float[::1] x, float m, float[::1] y):
    """y = exp(x - m) as the softmax kernels compute it (m finite, x <= m;
    selected SIMD variant), for the accuracy tests."""
    cdef int status
    if y.shape[0] < x.shape[0]:
        raise ValueError("y is shorter than x")
    with nogil:
        status = fa_exp_diff_f32(_fptr(x), m, _wptr(y), x.shape[0])
    _check(status)


def exp2(const float[::1] x, float[::1] y):
    """y = 2**x with the attention kernels' exponential (selected SIMD variant)."""
    cdef int status
    if y.shape[0] < x.shape[0]:
        raise ValueError("y is shorter than x")
    with nogil:
        status = fa_exp2_f32(_fptr(x), _wptr(y), x.shape[0])
    _check(status)


def tanh(const float[::1] x, float[::1] y):
    """y = tanh(x) as the attention kernels soft-cap scores (selected SIMD variant)."""
    cdef int status
    if y.shape[0] < x.shape[0]:
        raise ValueError("y is shorter than x")
    with nogil:
        status = fa_tanh_f32(_fptr(x), _wptr(y), x.shape[0])
    _check(status)


def select_simd(str name):
    """Use the SIMD variant `name` ("auto", "generic", "avx2", "avx512", "neon") from now on.

    Raises ValueError for a name this CPU or build cannot run."""
    if fa_select_simd(name.encode()) != FA_OK:
        raise ValueError(f"SIMD kernel {name!r} is not available here; this CPU and build "
                         f"run: auto, {fa_simd_available().decode().replace(',', ', ')}")


def simd_available():
    """The SIMD variants this CPU and build can run."""
    return fa_simd_available().decode().split(",")


def omp_max_threads():
    """OpenMP's current default thread count (1 in a build without OpenMP)."""
    return fa_omp_max_threads()


def threads_for(int nthreads, double work, int64_t nitems):
    """The threads the thread policy gives a call of `work` units (multiply-adds)
    and `nitems` work items under the cap `nthreads`, now (csrc/fa_internal.h)."""
    return fa_threads_for(nthreads, work, nitems)


def machine_busy():
    """True while the thread policy counts the machine as loaded: a threaded
    attention call's thread arrived late, twice in a row while the threads
    were awake or once where other threads filled the cores, within the
    window of load that began then (20 ms to half a second,
    csrc/fa_internal.h)."""
    return bool(fa_busy())


def set_machine_busy(double seconds):
    """Count the machine as loaded for `seconds` from now, a window of that
    length (0: not, and forget a late call), as a late thread would (for the
    tests)."""
    fa_set_busy(seconds)


def busy_span(int64_t now_us, int64_t until_us, int64_t span_us):
    """The microseconds a window of load beginning at now_us lasts, the last
    one having ended at until_us after span_us microseconds (0, 0: none)."""
    return fa_busy_span(now_us, until_us, span_us)


def busy_window():
    """(until_us, span_us): when the last window of load ends (0: none) and
    how long it is, in microseconds of clock()."""
    cdef int64_t until = 0, span = 0
    fa_busy_window(&until, &span)
    return until, span


def note_wait(double start, double wait, int nthreads=2):
    """Record, as a threaded call does when it ends, that a call on `nthreads`
    threads which began at `start` (seconds of clock()) had its last thread
    `wait` seconds late (for the tests)."""
    fa_note_wait(start, wait, nthreads)


def clock():
    """The thread policy's clock, in seconds (0.0 in a build without OpenMP)."""
    return fa_now()


def l2_cache_bytes():
    """A core's level-2 cache in bytes as the work units are planned for it
    (sysconf; 1 MiB where it does not say)."""
    return fa_l2_cache_bytes()


cdef extern from "Python.h":
    int PyTraceMalloc_Track(unsigned int domain, uintptr_t ptr, size_t size)
    int PyTraceMalloc_Untrack(unsigned int domain, uintptr_t ptr)

# tracemalloc's domain for array data: NumPy's, so that the memory of a result
# array counts where NumPy's own arrays do (tracemalloc.get_traced_memory)
cdef unsigned int _ARRAY_DOMAIN = 389047


cdef class _ResultMemory:
    """The memory of one result array (fa_result_alloc), exposed as a
    writable buffer of bytes; it goes back to the cache (fa_result_free) when
    the last array on it goes. (No __releasebuffer__: NumPy then holds this
    object itself as the array's base, not a memoryview of it that could be
    released while the array lives.)"""
    cdef void *ptr
    cdef int64_t bytes      # the block's size
    cdef Py_ssize_t nbytes  # the array's bytes (the buffer's length)

    def __getbuffer__(self, Py_buffer *view, int flags):
        view.buf = self.ptr
        view.obj = self
        view.len = self.nbytes
        view.readonly = 0
        view.itemsize = 1
        view.format = NULL  # (no format: unsigned bytes)
        view.ndim = 1
        view.shape = &self.nbytes
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __dealloc__(self):
        if self.ptr != NULL:
            PyTraceMalloc_Untrack(_ARRAY_DOMAIN, <uintptr_t>self.ptr)
            fa_result_free(self.ptr, self.bytes)


RESULT_MIN_BYTES = FA_RESULT_MIN_BYTES


def result_array(shape, dtype, Py_ssize_t nbytes):
    """A new uninitialised C-contiguous array of `shape` and `dtype` (nbytes
    bytes) on memory kept for reuse (fa_result_alloc), or None below
    RESULT_MIN_BYTES (the caller takes np.empty)."""
    cdef int64_t bytes = fa_result_bytes(nbytes)
    cdef _ResultMemory m
    if bytes < 0:
        return None
    m = _ResultMemory.__new__(_ResultMemory)
    m.ptr = fa_result_alloc(bytes)
    if m.ptr == NULL:
        raise MemoryError
    m.bytes = bytes
    m.nbytes = nbytes
    PyTraceMalloc_Track(_ARRAY_DOMAIN, <uintptr_t>m.ptr, <size_t>nbytes)
    return np.frombuffer(m, dtype=dtype).reshape(shape)


def result_cache(limit=None):
    """(limit, held): the cache's limit in bytes before this call and the
    bytes it holds after it; with `limit` (an int >= 0), sets the limit."""
    cdef int64_t held = 0
    cdef int64_t before = fa_result_cache(-1 if limit is None else <int64_t>limit, &held)
    return int(before), int(held)


def build_info():
    """Facts about the compiled core, for show_config()."""
    return {
        "compiler": fa_compiler().decode(),
        "openmp": bool(fa_built_with_openmp()),
        "simd": fa_simd_kernel().decode(),
    }


def merge(list outs, list lses, int64_t nrows, int64_t Dv, float[::1] o, float[::1] lse,
          int nthreads):
    """Merge the partials outs[p] (1-d, nrows*Dv floats) with lses[p] (nrows
    floats), all C-contiguous float32, into o and lse (read in place)."""
    cdef Py_ssize_t P = len(outs), p
    cdef const float[::1] view
    cdef const float **optr = NULL
    cdef const float **lptr = NULL
    cdef int status
    if len(lses) != P:
        raise ValueError("merge: outs and lses differ in length")
    if nrows < 0 or Dv < 0 or (Dv > 0 and nrows > INT64_MAX // Dv):
        raise ValueError("merge: bad sizes")
    if o.shape[0] < nrows * Dv or lse.shape[0] < nrows:
        raise ValueError("merge: o or lse is smaller than its rows")
    optr = <const float **>PyMem_Malloc((P + 1) * sizeof(float *))
    lptr = <const float **>PyMem_Malloc((P + 1) * sizeof(float *))
    try:
        if optr == NULL or lptr == NULL:
            raise MemoryError("fastattn: merge could not allocate its pointer table")
        for p in range(P):
            view = outs[p]
            if view.shape[0] < nrows * Dv:
                raise ValueError(f"merge: outs[{p}] is smaller than its rows")
            optr[p] = _fptr(view)
            view = lses[p]
            if view.shape[0] < nrows:
                raise ValueError(f"merge: lses[{p}] is smaller than its rows")
            lptr[p] = _fptr(view)
        with nogil:
            status = fa_merge_f32(optr, lptr, P, nrows, Dv, _wptr(o), _wptr(lse), nthreads)
        _check(status)
    finally:
        PyMem_Free(optr)
        PyMem_Free(lptr)


def fma_peak(int lanes, int nthreads, long iters):
    """GFLOP/s of float32 FMAs `lanes` wide (8: AVX2, 16: AVX-512F) on
    `nthreads` threads (csrc/peak.c), or None where the CPU or build lacks them."""
    cdef double g
    with nogil:
        g = fa_fma_peak_gflops(lanes, nthreads, iters)
    return None if g < 0 else g
