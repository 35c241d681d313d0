"""How inputs lie in memory: read in place where possible, copied once where not.

A C-contiguous float32 input is used as it is. Attention reads q, k and v in
place whenever their rows (last axis) are contiguous, whatever their other
strides: a (B, L, H, D) array viewed as (B, H, L, D), reversed or stepped
rows, broadcast heads; the result is bitwise that of their contiguous copies,
and no copy of their size is made. Rows that are not contiguous, or elements
that are not aligned, are copied once, with the same result.

Any byte address: NumPy arrays need not start at an aligned address
(``np.frombuffer(buf, np.float32, offset=1)``, a view into a byte buffer, a
memory-mapped file, a slice of a packed record gives float32 elements at odd
addresses), and even an element-aligned array is rarely aligned to a cache
line or a SIMD register. No kernel may assume either: arrays that are not
element-aligned are copied once (NumPy's own ``flags.aligned``), element-aligned
ones are read in place with unaligned loads. Each case compares, bit for bit,
the call on arrays placed at byte offsets 1, 2, 4 and 36 from a 64-byte
boundary with the call on the same values in fresh (aligned) arrays, on every
SIMD path.
"""
import numpy as np
import pytest

import fastattn
from fastattn import _core
from fastattn.flash_attn import flash_attn_with_kvcache

from conftest import (HALF, HALF_IDS, assert_new_c_float32, assert_same_bits, qkv, randn,
                      traced_peak)

sdpa = fastattn.scaled_dot_product_attention
OFFSETS = [1, 2, 4, 36]


# ---------------------------------------------------- used and read in place

def test_c_contiguous_float32_inputs_are_used_in_place(rng):
    # documented: a C-contiguous float32 input is not copied; anything else is
    # copied once (here: float64, converted to float32).
    q = rng.standard_normal((4, 512, 256), dtype=np.float32)  # 2 MiB
    out = np.empty_like(q)
    assert traced_peak(lambda: fastattn.scaled_dot_product_attention(q, q, q, out=out)) \
        < q.nbytes // 4
    x = rng.standard_normal((1024, 512), dtype=np.float32)
    y = np.empty_like(x)
    assert traced_peak(lambda: fastattn.softmax(x, out=y)) < x.nbytes // 4
    q64 = q.astype(np.float64)
    assert traced_peak(lambda: fastattn.scaled_dot_product_attention(q64, q64, q64, out=out)) \
        >= q.nbytes


def _blhd(rng, B, L, H, D, dtype=np.float32):
    """A (B, L, H, D) array (as a projection's output is laid out) and its
    (B, H, L, D) view."""
    x = randn(rng, B, L, H, D).astype(dtype)
    return x, x.swapaxes(-3, -2)


@pytest.mark.parametrize("kvdtype", [np.float32] + HALF, ids=["float32"] + HALF_IDS)
@pytest.mark.parametrize("gqa", [False, True])
def test_blhd_views_are_read_in_place(simd, rng, kvdtype, gqa):
    Hq, Hkv = (6, 2) if gqa else (4, 4)
    _, q = _blhd(rng, 2, 33, Hq, 24)
    _, k = _blhd(rng, 2, 150, Hkv, 24, kvdtype)
    _, v = _blhd(rng, 2, 150, Hkv, 20, kvdtype)
    assert not q.flags.c_contiguous
    for kw in ({}, dict(is_causal=True), dict(window=(9, 0))):
        got = sdpa(q, k, v, enable_gqa=gqa, return_lse=True, **kw)
        want = sdpa(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                    enable_gqa=gqa, return_lse=True, **kw)
        assert_new_c_float32(got[0])
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])
    assert_same_bits(fastattn.attention_weights(q, k, enable_gqa=gqa),
                     fastattn.attention_weights(np.ascontiguousarray(q), np.ascontiguousarray(k),
                                                enable_gqa=gqa))


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("kvdtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_units_that_copy_their_value_tiles_keep_the_bits(simd, rng, threads, gqa, kvdtype):
    # Value rows 1 KiB apart (4 kv heads of 64 floats, a (B, L, H, D) view)
    # or in float16 are copied tile by tile, and such units take up to 192
    # query rows where the contiguous float32 call's take up to 96: each
    # row's bits are the same, whatever rows share its unit and on any
    # number of threads.
    Hq, Hkv = (8, 4) if gqa else (4, 4)
    for L, S in [(400, 400), (250, 300)]:
        _, q = _blhd(rng, 2, L, Hq, 64)
        _, k = _blhd(rng, 2, S, Hkv, 64, kvdtype)
        _, v = _blhd(rng, 2, S, Hkv, 64, kvdtype)
        assert v.strides[-2] * 4 // v.itemsize % 1024 == 0
        args = [np.ascontiguousarray(x, np.float32) for x in (q, k, v)]
        for kw in ({}, dict(is_causal=True), dict(window=(70, 5))):
            want = sdpa(*args, enable_gqa=gqa, return_lse=True, **kw)
            for n in (1, 2, 3):
                threads(n)
                got = sdpa(q, k, v, enable_gqa=gqa, return_lse=True, **kw)
                assert_same_bits(got[0], want[0])
                assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("view", ["reversed-rows", "reversed-heads", "row-step", "broadcast-k",
                                  "sliced-features", "padded-rows", "length-1-rows"])
def test_other_row_contiguous_views(simd, rng, view):
    q, k, v = qkv(rng, (2, 3, 21, 16), (2, 3, 70, 16), (2, 3, 70, 12))
    if view == "reversed-rows":
        q, k, v = q[..., ::-1, :], k[..., ::-1, :], v[..., ::-1, :]
    elif view == "reversed-heads":
        q, k, v = q[:, ::-1], k[::-1, ::-1], v[::-1, ::-1]
    elif view == "row-step":
        q, k, v = q[..., ::2, :], k[..., ::3, :], v[..., ::3, :]
    elif view == "broadcast-k":
        k = np.broadcast_to(k[:, :1], k.shape)
        v = np.broadcast_to(v[:1], v.shape)
    elif view == "sliced-features":  # a row is a contiguous slice of a longer one
        k = np.concatenate([k, k], axis=-1)[..., 3:19]
        v = np.concatenate([v, v], axis=-1)[..., 1:13]
    elif view == "padded-rows":
        big = np.zeros((2, 3, 70, 40), np.float32)
        big[..., 5:21] = k
        k = big[..., 5:21]
    else:
        q = q[..., :1, :]
    got = sdpa(q, k, v, is_causal=True, return_lse=True)
    want = sdpa(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                is_causal=True, return_lse=True)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


def test_unaligned_and_odd_stride_inputs_are_copied(rng):
    # Rows that are not whole aligned elements cannot be read in place: the
    # one copy gives the same result.
    q, k, v = qkv(rng, (2, 7, 8), (2, 9, 8), (2, 9, 8))
    raw = np.zeros(k.nbytes + 1, np.uint8)
    ku = raw[1:].view(np.float32).reshape(k.shape)  # misaligned by one byte
    ku[...] = k
    assert not ku.flags.aligned
    assert_same_bits(sdpa(q, ku, v), sdpa(q, k, v))
    rec = np.zeros((2, 9, 8), [("x", np.float32), ("pad", np.int8)])  # strides of 5 bytes
    rec["x"] = k
    assert_same_bits(sdpa(q, rec["x"], v), sdpa(q, k, v))


@pytest.mark.parametrize("kvdtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_blhd_views_make_no_copy(rng, kvdtype):
    # the documented promise: (B, L, H, D) viewed as (B, H, L, D) is not copied.
    _, q = _blhd(rng, 1, 512, 8, 64)    # 1 MiB each
    _, k = _blhd(rng, 1, 512, 8, 64, kvdtype)
    _, v = _blhd(rng, 1, 512, 8, 64, kvdtype)
    out = np.empty((1, 8, 512, 64), np.float32)
    sdpa(q, k, v, out=out)
    peak = traced_peak(lambda: sdpa(q, k, v, out=out, is_causal=True))
    smallest = min(q.nbytes, k.nbytes, v.nbytes)
    assert peak < smallest // 4, f"{peak} bytes traced: an input was copied"


def test_row_non_contiguous_inputs_are_copied_once_and_equal(rng):
    q, k, v = qkv(rng, (2, 7, 8), (2, 9, 8), (2, 9, 6))
    kt = np.ascontiguousarray(k.swapaxes(-1, -2)).swapaxes(-1, -2)  # features strided
    got = sdpa(np.asfortranarray(q), kt, v.astype(np.float16))
    assert_same_bits(got, sdpa(q, k, v.astype(np.float16).astype(np.float32)))


# ------------------------------------------------------------ any byte address

@pytest.fixture
def aligned_core(monkeypatch):
    """Every array handed to the compiled core must be element-aligned while
    the test runs (sdpa_plain checks its own arguments and declines
    misaligned ones)."""
    def guarded(name, fn):
        def call(*args, **kwargs):
            for a in list(args) + list(kwargs.values()):
                for x in a if isinstance(a, (list, tuple)) else (a,):
                    if isinstance(x, np.ndarray):
                        assert x.flags.aligned, f"_core.{name} got a misaligned array"
            return fn(*args, **kwargs)
        return call
    for name in dir(_core):
        fn = getattr(_core, name)
        if callable(fn) and not name.startswith("_") and name not in ("sdpa_plain",) \
                and not isinstance(fn, type):
            monkeypatch.setattr(_core, name, guarded(name, fn))


def at(a, off):
    """A copy of `a` whose data start `off` bytes past a 64-byte boundary."""
    a = np.asarray(a)
    buf = np.zeros(a.nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + off
    out = np.frombuffer(buf.data, dtype=a.dtype, count=a.size, offset=start).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == off
    return out


def same(got, want):
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g.view(np.uint32), w.view(np.uint32))


@pytest.mark.parametrize("off", OFFSETS)
@pytest.mark.parametrize("case", ["float-mask", "bool-mask", "causal", "decode-gqa",
                                  "token-major", "options"])
def test_sdpa_at_any_address(simd, aligned_core, off, case):
    """The general path (masks), the common-case fast path, the few-rows
    (decoding) path and strided (B, L, H, D) views."""
    rng = np.random.default_rng(off)
    B, H, Hkv, L, S, D = 2, 4, 4, 37, 150, 40
    kw = {}
    mask = None
    if case == "decode-gqa":
        Hkv, L, S, D = 2, 1, 300, 64
        kw["enable_gqa"] = True
    q, k, v = randn(rng, B, H, L, D), randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    if case == "float-mask":
        mask = randn(rng, L, S)
    elif case == "bool-mask":
        mask = rng.random((B, 1, L, S)) < 0.7
    elif case == "causal":
        kw["is_causal"] = True
    elif case == "options":
        kw.update(softcap=5.0, alibi_slopes=np.linspace(0.1, 0.5, H).astype(np.float32),
                  sinks=randn(rng, H))
    want = sdpa(q, k, v, mask, return_lse=True, **kw)
    if case == "token-major":  # (B, L, H, D) buffers at the offset, viewed as (B, H, L, D)
        args = [at(a.swapaxes(1, 2), off).swapaxes(1, 2) for a in (q, k, v)]
    else:
        args = [at(a, off) for a in (q, k, v)]
    m = None if mask is None else at(mask, off)
    same(sdpa(*args, m, return_lse=True, **kw), want)
    out = at(np.zeros_like(want[0]), off) if off % 4 == 0 else None
    if out is not None:  # an element-aligned out is written in place
        sdpa(*args, m, out=out, **kw)
        same(out, want[0])


@pytest.mark.parametrize("off", OFFSETS)
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("L", [1, 20])
def test_half_kv_at_any_address(simd, aligned_core, off, dtype, L):
    """float16 / bfloat16 k and v at any address (element-aligned ones read in place)."""
    rng = np.random.default_rng(7 + off)
    q = randn(rng, 1, 8, L, 64)
    k, v = randn(rng, 1, 2, 200, 64).astype(dtype), randn(rng, 1, 2, 200, 64).astype(dtype)
    want = sdpa(q, k.astype(np.float32), v.astype(np.float32), enable_gqa=True)
    same(sdpa(at(q, off), at(k, off), at(v, off), enable_gqa=True), want)


@pytest.mark.parametrize("off", OFFSETS)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_rowwise_at_any_address(simd, aligned_core, off, op):
    rng = np.random.default_rng(off)
    x = randn(rng, 5, 333) * 4
    f = getattr(fastattn, op)
    want = f(x)
    same(f(at(x, off)), want)
    same(f(at(x, off), axis=0), f(x, axis=0))
    if off % 4 == 0:
        out = at(np.zeros_like(want), off)
        f(at(x, off), out=out)
        same(out, want)


@pytest.mark.parametrize("off", OFFSETS)
def test_weights_varlen_merge_at_any_address(simd, aligned_core, off):
    rng = np.random.default_rng(11 + off)
    q, k, v = randn(rng, 2, 3, 17, 24), randn(rng, 2, 3, 90, 24), randn(rng, 2, 3, 90, 24)
    mask = randn(rng, 17, 90)
    same(fastattn.attention_weights(at(q, off), at(k, off), at(mask, off)),
         fastattn.attention_weights(q, k, mask))
    # varlen: packed (T, H, D) tokens
    cu_q, cu_k = np.array([0, 5, 17]), np.array([0, 40, 90])
    qp, kp, vp = randn(rng, 17, 3, 24), randn(rng, 90, 3, 24), randn(rng, 90, 3, 24)
    same(fastattn.varlen_attention(at(qp, off), at(kp, off), at(vp, off), at(cu_q, off),
                                   at(cu_k, off), is_causal=True, return_lse=True),
         fastattn.varlen_attention(qp, kp, vp, cu_q, cu_k, is_causal=True, return_lse=True))
    # merge: two parts' results
    o1, l1 = sdpa(q, k[:, :, :40], v[:, :, :40], return_lse=True)
    o2, l2 = sdpa(q, k[:, :, 40:], v[:, :, 40:], return_lse=True)
    outs, lses = np.stack([o1, o2]), np.stack([l1, l2])
    same(fastattn.merge_attention(at(outs, off), at(lses, off)),
         fastattn.merge_attention(outs, lses))


@pytest.mark.parametrize("off", OFFSETS)
@pytest.mark.parametrize("block_size", [8, 64])
def test_paged_kvcache_at_any_address(simd, aligned_core, off, block_size):
    """flash_attn_with_kvcache on a paged cache (block size 64: the kernel reads
    the pages in place) and new keys at any address."""
    rng = np.random.default_rng(13 + off)
    nb = 256 // block_size
    kc, vc = randn(rng, 2 * nb, block_size, 2, 32), randn(rng, 2 * nb, block_size, 2, 32)
    q, k, v = randn(rng, 2, 1, 4, 32), randn(rng, 2, 1, 2, 32), randn(rng, 2, 1, 2, 32)
    table = np.arange(2 * nb).reshape(2, nb)[:, ::-1].astype(np.int32)
    kw = dict(cache_seqlens=200, block_table=table, causal=True, return_softmax_lse=True)
    kc1, vc1 = kc.copy(), vc.copy()
    want = flash_attn_with_kvcache(q, kc1, vc1, k, v, **kw)
    kc2, vc2 = at(kc, off), at(vc, off)
    got = flash_attn_with_kvcache(at(q, off), kc2, vc2, at(k, off), at(v, off), **kw)
    same(got, want)
    assert np.array_equal(kc2, kc1) and np.array_equal(vc2, vc1)


@pytest.mark.parametrize("call", ["softmax", "sdpa", "varlen", "merge", "flash_attn"])
def test_misaligned_out_is_an_error(call):
    """A float32 `out` at an address that is not a multiple of 4 is refused
    (ValueError, nothing written) rather than written through a misaligned
    pointer; an element-aligned one at any other address is written in place."""
    rng = np.random.default_rng(3)
    q, k, v = randn(rng, 1, 2, 5, 8), randn(rng, 1, 2, 9, 8), randn(rng, 1, 2, 9, 8)
    run = {"softmax": lambda o: fastattn.softmax(k, out=o),
           "sdpa": lambda o: sdpa(q, k, v, out=o),
           "varlen": lambda o: fastattn.varlen_attention(q[0].swapaxes(0, 1), k[0].swapaxes(0, 1),
                                                         v[0].swapaxes(0, 1), [0, 2, 5],
                                                         [0, 4, 9], out=o),
           "merge": lambda o: fastattn.merge_attention(np.stack([q, q]), np.zeros((2, 1, 2, 5),
                                                                                 np.float32), out=o),
           "flash_attn": lambda o: fastattn.flash_attn.flash_attn_func(
               q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2), out=o)}[call]
    want = run(None)
    want = want[0] if isinstance(want, tuple) else want  # merge: (out, lse)
    bad = at(np.zeros_like(want), 2)
    with pytest.raises(ValueError, match="out must be aligned"):
        run(bad)
    assert not bad.any()
    good = at(np.zeros_like(want), 4)
    run(good)
    same(good, want)
