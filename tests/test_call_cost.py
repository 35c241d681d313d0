"""The per-call cost paths: the plain call's fast path and the first call.

``_core.sdpa_plain`` serves the common call (float32 ndarrays, k and v also
float16 or bfloat16, rows in place, at most a bool or float32 mask, scale,
is_causal, enable_gqa, return_lse) in one step, and returns None for
anything else, which then takes the general path (fastattn._validate +
_kernel.run). It must give the general path's bits, and must never
raise on its arguments: every error comes from the general path, with its
messages.
"""
import subprocess
import sys

import numpy as np
import pytest

import fastattn
from fastattn import _core, _kernel
from fastattn._validate import as_bool, attention_inputs, check_out


def general(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False,
            return_lse=False, window=None):
    """The general path, bypassing the fast one."""
    a = attention_inputs(q, k, v, mask, is_causal, window, scale, enable_gqa)
    out = np.empty(a.batch + (a.L, a.Dv), np.float32)
    return_lse = as_bool(return_lse, "return_lse")
    lse = np.empty(a.batch + (a.L,), np.float32) if return_lse else None
    _kernel.run(a, out, lse)
    return (out, lse) if return_lse else out


def plain(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False,
          return_lse=False, window=None, nthreads=2, out=None):
    return _core.sdpa_plain(q, k, v, mask, is_causal, window, scale, enable_gqa, return_lse,
                            nthreads, out)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def padding_mask(B, S):
    m = np.ones((B, 1, 1, S), bool)
    for b in range(B):
        m[b, ..., S - (b * S) // (2 * B):] = False
    return m


# (q shape, k shape, v shape, mask shape or None, mask dtype, options)
FAST_CASES = [
    ((1, 1, 4, 8), (1, 1, 4, 8), (1, 1, 4, 8), None, None, {}),
    ((4, 8), (5, 8), (5, 3), None, None, {}),
    ((3, 1, 8), (3, 70, 8), (3, 70, 16), None, None, {}),          # L = 1
    ((2, 3, 7, 5), (2, 3, 1, 5), (2, 3, 1, 4), None, None, {}),    # S = 1
    ((2, 3, 33, 16), (2, 3, 65, 16), (2, 3, 65, 16), (2, 3, 33, 65), bool, {}),
    ((2, 3, 33, 16), (2, 3, 65, 16), (2, 3, 65, 16), (33, 65), np.float32, {}),
    ((2, 3, 17, 16), (2, 3, 17, 16), (2, 3, 17, 16), (2, 1, 1, 17), bool, {"is_causal": True}),
    ((2, 3, 17, 16), (2, 3, 17, 16), (2, 3, 17, 16), (3, 17, 1), np.float32, {}),
    ((2, 3, 17, 16), (2, 3, 17, 16), (2, 3, 17, 16), (1, 1, 17), bool, {"scale": -0.3}),
    ((1, 6, 1, 32), (1, 2, 100, 32), (1, 2, 100, 8), None, None, {"enable_gqa": True}),
    ((2, 6, 5, 32), (2, 3, 100, 32), (2, 3, 100, 32), (2, 1, 5, 100), bool,
     {"enable_gqa": True, "is_causal": True, "return_lse": True}),
    ((4, 4, 9, 8), (4, 1, 9, 8), (4, 1, 9, 8), None, None, {"enable_gqa": True}),
    ((2, 2, 40, 24), (2, 2, 40, 24), (2, 2, 40, 24), None, None,
     {"return_lse": True, "scale": 0.0}),
    ((2, 3, 70, 16), (2, 3, 150, 16), (2, 3, 150, 16), None, None, {"window": (20, 0)}),
    ((2, 3, 70, 16), (2, 3, 150, 16), (2, 3, 150, 16), (2, 1, 1, 150), bool,
     {"window": (None, 5), "is_causal": True}),
    ((1, 4, 9, 16), (1, 2, 90, 16), (1, 2, 90, 16), None, None,
     {"window": (10**30, 3), "enable_gqa": True, "return_lse": True}),  # clamped
    ((1, 1, 9, 16), (1, 1, 9, 16), (1, 1, 9, 16), None, None, {"window": (None, None)}),
]


@pytest.mark.parametrize("qs, ks, vs, ms, mdtype, opts", FAST_CASES)
def test_fast_path_gives_the_general_paths_bits(rng, qs, ks, vs, ms, mdtype, opts):
    q, k, v = f32(rng, *qs), f32(rng, *ks), f32(rng, *vs)
    mask = None
    if ms is not None:
        mask = (rng.random(ms) < 0.8) if mdtype is bool else f32(rng, *ms)
        if mdtype is bool:
            mask[..., 0] = True
    got = plain(q, k, v, mask, **opts)
    assert got is not None, "the case must take the fast path"
    want = general(q, k, v, mask, **opts)
    public = fastattn.scaled_dot_product_attention(q, k, v, mask, **opts)
    for g, w, p in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want, public))):
        assert g.shape == w.shape and g.dtype == w.dtype == np.float32
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
        np.testing.assert_array_equal(p.view(np.uint32), w.view(np.uint32))
    assert isinstance(got, tuple) == bool(opts.get("return_lse"))


@pytest.mark.parametrize("qs, ks, vs, ms, mdtype, opts", FAST_CASES)
def test_fast_path_writes_out_with_the_same_bits(rng, qs, ks, vs, ms, mdtype, opts):
    q, k, v = f32(rng, *qs), f32(rng, *ks), f32(rng, *vs)
    mask = None if ms is None else (rng.random(ms) < 0.8) if mdtype is bool else f32(rng, *ms)
    want = plain(q, k, v, mask, **opts)
    shape = qs[:-1] + (vs[-1],)
    for call in (plain, fastattn.scaled_dot_product_attention):
        out = np.full(shape, np.float32(-1234.5))
        got = call(q, k, v, mask, out=out, **opts)
        for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
        assert (got[0] if isinstance(got, tuple) else got) is out


def _bad_outs(q, k, v, mask, shape):
    """(what, out) that the fast path must leave to the general path."""
    big = np.zeros((2,) + shape, np.float32)
    ro = np.zeros(shape, np.float32)
    ro.flags.writeable = False
    return [
        ("wrong shape", np.zeros(shape[:-1] + (shape[-1] + 1,), np.float32)),
        ("a dimension fewer", np.zeros(shape[1:], np.float32)),
        ("float64", np.zeros(shape)),
        ("big-endian", np.zeros(shape, ">f4")),
        ("every other element", np.zeros(shape[:-1] + (2 * shape[-1],), np.float32)[..., ::2]),
        ("every other batch item", big.reshape((2 * shape[0],) + shape[1:])[::2]),
        ("Fortran order", np.zeros(shape, np.float32, order="F")),
        ("read-only", ro),
        ("misaligned", _misaligned(shape)),
        ("a subclass", np.ma.masked_array(np.zeros(shape, np.float32))),
        ("a list", np.zeros(shape, np.float32).tolist()),
        ("q itself", q),
        ("a view of k", k.reshape(-1)[:int(np.prod(shape))].reshape(shape)),
        ("overlapping v", v.reshape(-1)[3:3 + int(np.prod(shape))].reshape(shape)),
        ("the mask's bytes", mask.reshape(-1)[:int(np.prod(shape))].reshape(shape)),
    ]


def test_fast_path_leaves_bad_out_to_the_general_path_and_its_errors(rng):
    shape = (2, 3, 5, 8)
    q, k, v = f32(rng, *shape), f32(rng, 2, 3, 40, 8), f32(rng, 2, 3, 40, 8)
    mask = f32(rng, 2, 1, 5, 40)
    want = plain(q, k, v, mask)
    for what, out in _bad_outs(q, k, v, mask, shape):
        assert plain(q, k, v, mask, out=out) is None, what
        saved = np.array(out, copy=True)
        try:
            check_out(out, shape, [("q", q), ("k", k), ("v", v), ("attn_mask", mask)])
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)) as got:
                fastattn.scaled_dot_product_attention(q, k, v, mask, out=out)
            assert str(got.value) == str(exc), what
            np.testing.assert_array_equal(np.asarray(out), saved, err_msg=what)
        else:  # an ndarray subclass: the general path writes it
            assert type(out) is not np.ndarray, what
            assert fastattn.scaled_dot_product_attention(q, k, v, mask, out=out) is out, what
            np.testing.assert_array_equal(np.asarray(out).view(np.uint32),
                                          want.view(np.uint32), err_msg=what)


def test_out_between_an_inputs_rows_is_decided_by_the_general_path(rng):
    # q's rows are every other 64-float span of buf; out fills the gap between two
    # of them: the byte ranges overlap, the elements do not. The fast path leaves
    # it to the general check, which finds no shared element and writes it.
    buf = f32(rng, 4, 128)
    q = buf[None, :2, :64]
    out = buf[0, 64:].reshape(1, 2, 32)
    k, v = f32(rng, 1, 7, 64), f32(rng, 1, 7, 32)
    want = plain(q, k, v)
    assert plain(q, k, v, out=out) is None
    assert fastattn.scaled_dot_product_attention(q, k, v, out=out) is out
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def _strided_cases(rng):
    """(what, q, k, v, mask, options): inputs read in place with other strides."""
    q, k, v = f32(rng, 2, 3, 9, 16), f32(rng, 2, 3, 20, 16), f32(rng, 2, 3, 20, 8)
    blhd = f32(rng, 2, 20, 3, 16).transpose(0, 2, 1, 3)  # (B, L, H, D) storage
    cache = f32(rng, 2, 3, 64, 16)
    m = rng.random((2, 1, 9, 20)) < 0.7
    return [
        ("(B, L, H, D) views", blhd[:, :, :9], blhd, blhd[..., :8], None, {}),
        ("a cache's first keys", q, cache[:, :, :20], cache[:, :, 20:40, :8], m, {}),
        ("reversed rows and heads", q[:, ::-1], k[:, :, ::-1], v[:, ::-1, ::-1], None,
         {"is_causal": True}),
        ("every other head", f32(rng, 2, 6, 9, 16)[:, ::2], k, v, None, {"return_lse": True}),
        ("k and v broadcast over the batch", q, k[:1], v[:1], None, {}),
        ("k and v shared by the heads", q, k[:, :1], v[:, :1], m, {}),
        ("grouped heads from a cache", f32(rng, 2, 6, 1, 16), cache[:, :, :33],
         cache[:, :, :33, :8], None, {"enable_gqa": True}),
        ("grouped heads broadcast over the batch", f32(rng, 2, 6, 3, 16), k[:1], v[:1],
         None, {"enable_gqa": True, "is_causal": True}),
        ("a length-1 axis with any stride", q[:, :1], k[:, 1:2], v[:, 2:3], m, {}),
    ]


def test_fast_path_reads_strided_inputs_in_place_with_the_same_bits(rng):
    for what, q, k, v, mask, opts in _strided_cases(rng):
        got = plain(q, k, v, mask, **opts)
        assert got is not None, what
        want = general(q, k, v, mask, **opts)
        dense = general(*(np.ascontiguousarray(x) for x in (q, k, v)), mask, **opts)
        for g, w, d in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want, dense))):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32), err_msg=what)
            np.testing.assert_array_equal(g.view(np.uint32), d.view(np.uint32), err_msg=what)


@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_fast_path_padding_mask_bits_for_every_thread_count(rng, nthreads):
    q, k, v = (f32(rng, 8, 12, 32, 32) for _ in range(3))
    mask = padding_mask(8, 32)
    want = general(q, k, v, mask)
    got = plain(q, k, v, mask, nthreads=nthreads)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kdt, vdt", [("float16", "float16"), ("bfloat16", "bfloat16"),
                                      ("float16", "bfloat16"), ("bfloat16", "float32")])
def test_fast_path_reads_half_precision_kv_with_the_general_paths_bits(rng, kdt, vdt):
    # A half-precision KV cache takes the one-step call too (a decode step
    # with a short cache paid about 20 us of checks for it), read as stored.
    ml_dtypes = pytest.importorskip("ml_dtypes") if "bfloat16" in (kdt, vdt) else None
    dtypes = {"float16": np.float16, "float32": np.float32,
              "bfloat16": ml_dtypes.bfloat16 if ml_dtypes else None}
    for qs, ks, mask, opts in [
        ((1, 8, 1, 64), (1, 2, 300, 64), None, {"enable_gqa": True}),
        ((2, 4, 37, 24), (2, 4, 90, 24), (2, 1, 1, 90), {"is_causal": True, "return_lse": True}),
        ((2, 3, 9, 16), (2, 3, 70, 16), None, {"window": (20, 0), "scale": 0.3}),
    ]:
        q = f32(rng, *qs)
        k = f32(rng, *ks).astype(dtypes[kdt])
        v = f32(rng, *ks).astype(dtypes[vdt])
        m = None if mask is None else rng.random(mask) < 0.8
        blhd_k = np.ascontiguousarray(k.swapaxes(1, 2)).swapaxes(1, 2)  # (B, S, H, D) viewed
        reversed_k = np.ascontiguousarray(k[:, ::-1])[:, ::-1]  # negative head stride
        for kk in (k, blhd_k, reversed_k):
            got = plain(q, kk, v, m, **opts)
            assert got is not None, "half-precision k and v must take the fast path"
            want = general(q, kk, v, m, **opts)
            as_f32 = plain(q, k.astype(np.float32), v.astype(np.float32), m, **opts)
            for g, w, f in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want, as_f32))):
                np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
                np.testing.assert_array_equal(g.view(np.uint32), f.view(np.uint32))


@pytest.mark.parametrize("kfmt, vfmt", [("q8_0", "q8_0"), ("q4_0", "q8_0"), ("q8_0", "float16")])
def test_fast_path_reads_quantized_kv_with_the_general_paths_bits(rng, kfmt, vfmt):
    # A quantized cache takes the one-step call too (a decode step over a
    # short cache paid about 60 us for the general path), read as blocks.
    def make(x, fmt):
        return fastattn.quantize_kv(x, fmt) if fmt.startswith("q") else x.astype(fmt)

    for qs, ks, mask, opts in [
        ((1, 8, 1, 64), (1, 2, 300, 64), None, {"enable_gqa": True}),
        ((2, 4, 37, 32), (2, 4, 90, 32), (2, 1, 1, 90), {"is_causal": True, "return_lse": True}),
    ]:
        q = f32(rng, *qs)
        k, v = make(f32(rng, *ks), kfmt), make(f32(rng, *ks), vfmt)
        m = None if mask is None else rng.random(mask) < 0.8
        blhd_k = fastattn.quantize_kv(np.asarray(k).swapaxes(1, 2), kfmt).swapaxes(1, 2)
        for kk in (k, blhd_k, k[:, ::-1]):  # (a negative head stride too)
            got = plain(q, kk, v, m, **opts)
            assert got is not None, "quantized k and v must take the fast path"
            want = general(q, kk, v, m, **opts)
            deq = plain(q, np.asarray(kk), np.asarray(v, dtype=np.float32), m, **opts)
            for g, w, f in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want, deq))):
                np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
                np.testing.assert_array_equal(g.view(np.uint32), f.view(np.uint32))
    # blocks whose strides are not whole blocks go to the general path (copied there)
    raw = fastattn.quantize_kv(f32(rng, 1, 2, 40, 64)).blocks
    odd = np.zeros((1, 2, 40, 69), np.uint8)[..., :68]
    odd[...] = raw
    kq = fastattn.QuantizedArray.from_blocks(odd, "q8_0")
    q = f32(rng, 1, 2, 3, 64)
    assert plain(q, kq, kq) is None
    np.testing.assert_array_equal(fastattn.scaled_dot_product_attention(q, kq, kq),
                                  general(q, kq.dequantize(), kq.dequantize()))


def _misaligned(shape, dtype=np.float32):
    buf = np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize + 1, np.uint8)
    arr = np.frombuffer(buf.data, dtype, int(np.prod(shape)), offset=1).reshape(shape)
    assert arr.flags.c_contiguous and not arr.flags.aligned
    return arr


def _bypass_cases(rng):
    q = f32(rng, 2, 3, 4, 8)
    m = np.ones((4, 4), bool)
    return [
        ("q float64", (q.astype(np.float64), q, q), {}),
        ("q float16", (q.astype(np.float16), q, q), {}),
        ("k float64", (q, q.astype(np.float64), q), {}),
        ("k big-endian float16", (q, q.astype(">f2"), q), {}),
        ("v float16 misaligned", (q, q, _misaligned(q.shape, np.float16)), {}),
        ("v big-endian", (q, q, q.astype(">f4")), {}),
        ("q's rows not contiguous", (q[..., ::2], q[..., ::2], q), {}),
        ("q with a stride not a whole number of elements",
         (np.ndarray((2, 3, 4, 8), np.float32, np.zeros(2000, np.uint8).data, 0,
                     (3 * 4 * 8 * 4 + 2, 4 * 8 * 4, 8 * 4, 4)), q, q), {}),
        ("q misaligned", (_misaligned(q.shape), q, q), {}),
        ("q a subclass", (np.ma.masked_array(q), q, q), {}),
        ("q a list", (q.tolist(), q, q), {}),
        ("q 1-d", (q.reshape(-1), q, q), {}),
        ("q a different ndim", (q[0], q, q), {}),
        ("q broadcast against k", (q[:1], q, q), {}),
        ("k a dimension fewer", (q, q[0], q[0]), {}),
        ("D differs", (q, f32(rng, 2, 3, 4, 7), q), {}),
        ("v rows differ", (q, q, f32(rng, 2, 3, 5, 8)), {}),
        ("empty L", (f32(rng, 2, 3, 0, 8), q, q), {}),
        ("empty batch", (f32(rng, 0, 3, 4, 8), f32(rng, 0, 3, 4, 8), f32(rng, 0, 3, 4, 8)), {}),
        ("empty Dv", (q, q, f32(rng, 2, 3, 4, 0)), {}),
        ("gqa heads not a multiple", (q, f32(rng, 2, 2, 4, 8), f32(rng, 2, 2, 4, 8)),
         {"enable_gqa": True}),
        ("gqa k and v heads differ", (q, f32(rng, 2, 1, 4, 8), q), {"enable_gqa": True}),
        ("gqa 2-d", (q[0, 0], q[0, 0], q[0, 0]), {"enable_gqa": True}),
        ("mask int", (q, q, q), {"mask": np.ones((4, 4), np.int8)}),
        ("mask float64", (q, q, q), {"mask": np.zeros((4, 4))}),
        ("mask a list", (q, q, q), {"mask": m.tolist()}),
        ("mask a broadcast view", (q, q, q), {"mask": np.broadcast_to(m, (2, 3, 4, 4))}),
        ("mask not contiguous", (q, q, q), {"mask": np.ones((4, 8), bool)[:, ::2]}),
        ("mask does not broadcast", (q, q, q), {"mask": np.ones((4, 5), bool)}),
        ("mask too many dims", (q, q, q), {"mask": np.ones((1, 2, 3, 4, 4), bool)}),
        ("mask 0-d", (q, q, q), {"mask": np.array(True)}),
        ("mask masked", (q, q, q), {"mask": np.ma.masked_array(m)}),
        ("is_causal numpy bool", (q, q, q), {"is_causal": np.True_}),
        ("is_causal int", (q, q, q), {"is_causal": 1}),
        ("enable_gqa None", (q, q, q), {"enable_gqa": None}),
        ("return_lse str", (q, q, q), {"return_lse": "yes"}),
        ("scale int", (q, q, q), {"scale": 1}),
        ("scale numpy", (q, q, q), {"scale": np.float32(0.5)}),
        ("scale inf", (q, q, q), {"scale": float("inf")}),
        ("scale nan", (q, q, q), {"scale": float("nan")}),
        ("scale beyond float32", (q, q, q), {"scale": 1e39}),
        ("window a list", (q, q, q), {"window": [1, 0]}),
        ("window of one side", (q, q, q), {"window": (1,)}),
        ("window side negative", (q, q, q), {"window": (-1, 0)}),
        ("window side a bool", (q, q, q), {"window": (True, 0)}),
        ("window side numpy", (q, q, q), {"window": (np.int64(2), 0)}),
        ("window side a float", (q, q, q), {"window": (None, 1.0)}),
        ("window an int", (q, q, q), {"window": 3}),
    ]


def test_fast_path_declines_everything_else_without_raising(rng):
    for what, (q, k, v), opts in _bypass_cases(rng):
        mask = opts.pop("mask", None)
        assert plain(q, k, v, mask, **opts) is None, what


def test_declined_calls_keep_the_general_paths_results_and_errors(rng):
    for what, (q, k, v), opts in _bypass_cases(rng):
        mask = opts.pop("mask", None)
        try:
            want = general(q, k, v, mask, **opts)
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)) as info:
                fastattn.scaled_dot_product_attention(q, k, v, mask, **opts)
            assert str(info.value) == str(exc), what
            continue
        got = fastattn.scaled_dot_product_attention(q, k, v, mask, **opts)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=what)


def test_the_first_call_does_not_import_numpy_ma():
    # NumPy imports numpy.ma lazily, in tens of milliseconds: the first
    # attention call paid it, checking for masked arrays that cannot exist yet.
    script = ("import sys, numpy as np\n"
              "before = 'numpy.ma' in sys.modules\n"
              "import fastattn\n"
              "q = np.ones((1, 1, 4, 8), np.float32)\n"
              "fastattn.scaled_dot_product_attention(q, q, q)\n"
              "fastattn.scaled_dot_product_attention(q.astype(np.float64), q, q, np.eye(4) > 0)\n"
              "print(before, 'numpy.ma' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    before, after = res.stdout.split()
    if before == "True":
        pytest.skip("this NumPy imports numpy.ma with numpy")
    assert after == "False"


def test_convenience_functions_take_the_fast_path_with_the_same_bits(rng):
    q, k, v = f32(rng, 2, 3, 40, 16), f32(rng, 2, 3, 100, 16), f32(rng, 2, 3, 100, 8)
    for got, want in [
        (fastattn.causal_attention(q, k, v), general(q, k, v, is_causal=True)),
        (fastattn.sliding_window_attention(q, k, v, 7), general(q, k, v, window=(6, 0))),
    ]:
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert plain(q, k, v, window=(6, 0)) is not None
