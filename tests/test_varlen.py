"""varlen_attention: packed sequences against the reference and, bitwise,
against one scaled_dot_product_attention call per sequence; empty sequences,
grouped-query heads, every score option, threads, layouts and bad input."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference as ref

from conftest import SDPA_TOL, assert_close, assert_same_bits, randn


def packed(rng, lens_q, lens_k, Hq=4, Hkv=2, D=19, Dv=13):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    q = randn(rng, int(cu_q[-1]), Hq, D)
    k = randn(rng, int(cu_k[-1]), Hkv, D)
    v = randn(rng, int(cu_k[-1]), Hkv, Dv)
    return q, k, v, cu_q, cu_k


def per_sequence(q, k, v, cu_q, cu_k, **kw):
    """One scaled_dot_product_attention call per sequence, packed back."""
    B = len(cu_q) - 1
    Hq, Dv = q.shape[1], v.shape[2]
    out = np.zeros((q.shape[0], Hq, Dv), np.float32)
    lse = np.zeros((q.shape[0], Hq), np.float32)
    for b in range(B):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rows.stop == rows.start:
            continue
        kb = dict(kw)
        for name in ("alibi_slopes", "sinks"):
            if name in kw and np.ndim(kw[name]) == 2:
                kb[name] = kw[name][b]
        o, l = fastattn.scaled_dot_product_attention(
            q[rows].swapaxes(0, 1), k[keys].swapaxes(0, 1), v[keys].swapaxes(0, 1),
            enable_gqa=True, return_lse=True, **kb)
        out[rows] = o.swapaxes(0, 1)
        lse[rows] = l.swapaxes(0, 1)
    return out, lse


LENGTHS = [([5, 0, 130, 1, 97, 3], [7, 3, 130, 200, 97, 0]),   # empty, L != S, S = 0
           ([64, 65, 1], [64, 65, 1]),                           # tile edges, L == S
           ([300], [1100])]                                      # one sequence, chunks of keys


def option_kw(option, rng, B, Hq):
    return {
        "plain": {},
        "causal": {"is_causal": True},
        "window": {"window": (20, 3)},
        "softcap": {"softcap": 2.5, "is_causal": True},
        "alibi": {"alibi_slopes": (2.0 ** -np.arange(1, Hq + 1)).astype(np.float32),
                  "is_causal": True},
        "alibi-per-sequence": {"alibi_slopes": rng.uniform(0, 0.3, (B, Hq)).astype(np.float32)},
        "sinks": {"sinks": randn(rng, B, Hq), "is_causal": True},
        "all": {"softcap": 4.0, "alibi_slopes": np.full(Hq, 0.1, np.float32),
                "sinks": randn(rng, Hq), "window": (50, None), "is_causal": True},
    }[option]


OPTIONS = ["plain", "causal", "window", "softcap", "alibi", "alibi-per-sequence", "sinks", "all"]


@pytest.mark.parametrize("lengths", range(len(LENGTHS)))
@pytest.mark.parametrize("option", OPTIONS)
def test_varlen_matches_reference_and_equals_one_call_per_sequence(rng, simd, lengths, option):
    q, k, v, cu_q, cu_k = packed(rng, *LENGTHS[lengths])
    kw = option_kw(option, rng, len(cu_q) - 1, q.shape[1])
    o, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    ro, rlse = ref.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    slopes = kw.get("alibi_slopes")
    extra = 0.0 if slopes is None else 8 * 1.2e-7 * float(np.max(slopes)) * 1300
    tol = {"rtol": SDPA_TOL["rtol"] + extra, "atol": SDPA_TOL["atol"] + extra}
    assert_close(o, ro, **tol)
    assert_close(lse, rlse, **tol)
    so, slse = per_sequence(q, k, v, cu_q, cu_k, **kw)
    assert_same_bits(o, so)
    assert_same_bits(lse, slse)
    buf = np.full(o.shape, 3.0, np.float32)
    assert fastattn.varlen_attention(q, k, v, cu_q, cu_k, out=buf, **kw) is buf
    assert_same_bits(buf, o)


def test_rows_of_sequences_without_keys(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 2], [0, 4])
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    o, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    assert (o[:3] == 0).all() and (lse[:3] == -np.inf).all()
    o, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, sinks=sinks, return_lse=True)
    assert (o[:3] == 0).all()
    assert_same_bits(lse[:3], np.broadcast_to(sinks, (3, 4)))


def test_empty_batches():
    q = np.zeros((0, 2, 4), np.float32)
    k = v = np.zeros((0, 1, 4), np.float32)
    for cu in ([0], [0, 0, 0]):
        o, lse = fastattn.varlen_attention(q, k, v, cu, cu, return_lse=True)
        assert o.shape == (0, 2, 4) and lse.shape == (0, 2)
    o = fastattn.varlen_attention(np.zeros((3, 2, 4), np.float32), k, np.zeros((0, 1, 0)),
                                  [0, 3], [0, 0])
    assert o.shape == (3, 2, 0)


@pytest.mark.parametrize("Dv", [4, 32, 130])
@pytest.mark.parametrize("shift", [0, 1], ids=["out-16-byte-aligned", "out-4-bytes-past"])
def test_output_rows_stored_past_the_cache_keep_their_bits(simd, rng, threads, Dv, shift):
    # Packed output rows whose length is a multiple of 4 floats and that
    # start 16-byte aligned are stored without fetching their lines
    # (non-temporal stores on x86); others (Dv = 130, an out= 4 bytes past
    # such an address) as usual. Either way each row is the bits of the
    # separate call on its sequence, with and without sinks, on 1-3 threads.
    q, k, v, cu_q, cu_k = packed(rng, [5, 130, 64, 1], [9, 130, 200, 1], Dv=Dv)
    want, want_lse = per_sequence(q, k, v, cu_q, cu_k, is_causal=True)
    buf = np.empty(q.shape[0] * 4 * Dv + 8, np.float32)
    start = (-buf.ctypes.data % 16) // 4 + shift
    out = buf[start:start + q.shape[0] * 4 * Dv].reshape(q.shape[0], 4, Dv)
    assert (out.ctypes.data % 16 == 0) == (shift == 0)
    for n in (1, 2, 3):
        threads(n)
        got, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True,
                                             return_lse=True, out=out)
        assert got is out
        assert_same_bits(got, want)
        assert_same_bits(lse, want_lse)
    sinks = np.linspace(-1, 1, 4, dtype=np.float32)
    want = per_sequence(q, k, v, cu_q, cu_k, sinks=sinks)[0]
    assert_same_bits(fastattn.varlen_attention(q, k, v, cu_q, cu_k, sinks=sinks), want)


def test_one_long_sequence_among_short_ones_uses_the_threads_with_the_same_bits(rng, threads):
    q, k, v, cu_q, cu_k = packed(rng, [2000, 16, 16, 16, 16], [2000, 16, 16, 16, 16], D=32,
                                 Dv=32)
    results = []
    for n in (1, 2, 3):
        threads(n)
        results.append(fastattn.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True,
                                                 sinks=np.zeros(4, np.float32),
                                                 return_lse=True))
    for o, lse in results[1:]:
        assert_same_bits(o, results[0][0])
        assert_same_bits(lse, results[0][1])


@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_decoding_sequences_split_by_key_chunks_keep_the_bits(rng, threads, nthreads):
    # one query row per sequence, one long cache among short ones: the long
    # sequence's units hold most of the work and are split into key chunks
    # (over the threads); each sequence's rows keep the bits of its own call
    lens_k = [3100, 7, 40, 2049, 1]
    q, k, v, cu_q, cu_k = packed(rng, [1, 1, 1, 2, 1], lens_k, Hq=4, Hkv=2, D=32, Dv=24)
    threads(nthreads)
    got = fastattn.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, return_lse=True)
    want = per_sequence(q, k, v, cu_q, cu_k, is_causal=True)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("Hkv,D", [(8, 32), (2, 128), (8, 128)])
def test_value_rows_a_multiple_of_1kib_apart_keep_the_bits(rng, simd, Hkv, D):
    # rows of v 1 or 4 KiB apart (H * D floats): the value tiles are copied
    # before the products (their rows would share a few L1 sets); the bits are
    # those of contiguous per-sequence arrays, also with inf and NaN in v (a
    # key that only the later rows see under is_causal)
    q, k, v, cu_q, cu_k = packed(rng, [70, 150, 5], [70, 150, 5], Hq=Hkv, Hkv=Hkv, D=D, Dv=D)
    v[cu_k[1] + 100, 0, 3] = np.inf
    v[cu_k[1] + 120, 1, 0] = np.nan
    got, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, return_lse=True)
    for b in range(3):
        rows = slice(cu_q[b], cu_q[b + 1])
        o, l = fastattn.scaled_dot_product_attention(
            *(np.ascontiguousarray(x[rows].swapaxes(0, 1)) for x in (q, k, v)),
            is_causal=True, return_lse=True)
        assert_same_bits(got[rows], o.swapaxes(0, 1))
        assert_same_bits(lse[rows], l.swapaxes(0, 1))
    assert not np.isfinite(got[cu_q[1] + 100:cu_q[2], 0, 3]).any()
    assert np.isnan(got[cu_q[1] + 120:cu_q[2], 1, 0]).all()
    assert np.isfinite(got[cu_q[1]:cu_q[1] + 100]).all()
    ro = ref.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True)
    assert_close(got, ro)


def test_layouts_and_kv_dtypes(rng):
    pytest.importorskip("ml_dtypes")
    import ml_dtypes

    q, k, v, cu_q, cu_k = packed(rng, [30, 70], [40, 90], Hq=2, Hkv=2)
    want = fastattn.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True)
    # q as a strided view (every other head of a wider array), read in place
    wide = np.zeros((q.shape[0], 4, q.shape[2]), np.float32)
    wide[:, ::2] = q
    assert_same_bits(fastattn.varlen_attention(wide[:, ::2], k, v, cu_q, cu_k, is_causal=True),
                     want)
    for dt in (np.float16, ml_dtypes.bfloat16):
        kh, vh = k.astype(dt), v.astype(dt)
        got = fastattn.varlen_attention(q, kh, vh, cu_q, cu_k, is_causal=True)
        assert_same_bits(got, fastattn.varlen_attention(q, kh.astype(np.float32),
                                                        vh.astype(np.float32), cu_q, cu_k,
                                                        is_causal=True))
    # lists and other integer dtypes of cu_seqlens
    assert_same_bits(fastattn.varlen_attention(q, k, v, cu_q.tolist(), cu_k.astype(np.int32),
                                               is_causal=True), want)


@st.composite
def packings(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    B = draw(st.integers(1, 5))
    lens_q = draw(st.lists(st.integers(0, 120), min_size=B, max_size=B))
    lens_k = draw(st.lists(st.integers(0, 150), min_size=B, max_size=B))
    Hkv = draw(st.integers(1, 2))
    Hq = Hkv * draw(st.integers(1, 3))
    q, k, v, cu_q, cu_k = packed(rng, lens_q, lens_k, Hq=Hq, Hkv=Hkv,
                                 D=draw(st.integers(1, 20)), Dv=draw(st.integers(0, 17)))
    kw = {"is_causal": draw(st.booleans())}
    if draw(st.booleans()):
        kw["window"] = (draw(st.none() | st.integers(0, 40)), draw(st.none() | st.integers(0, 9)))
    if draw(st.booleans()):
        kw["softcap"] = draw(st.floats(0.5, 50))
    if draw(st.booleans()):
        kw["sinks"] = randn(rng, B, Hq)
    if draw(st.booleans()):
        kw["alibi_slopes"] = rng.uniform(0, 0.2, Hq).astype(np.float32)
    return q, k, v, cu_q, cu_k, kw


@given(packings())
def test_varlen_is_bitwise_a_loop_of_sdpa_calls(case):
    q, k, v, cu_q, cu_k, kw = case
    o, lse = fastattn.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    so, slse = per_sequence(q, k, v, cu_q, cu_k, **kw)
    assert_same_bits(o, so)
    assert_same_bits(lse, slse)


@given(packings())
def test_varlen_of_one_sequence_is_sdpa(case):
    q, k, v, _, _, kw = case
    kw.pop("sinks", None)
    o, lse = fastattn.varlen_attention(q, k, v, [0, q.shape[0]], [0, k.shape[0]],
                                       return_lse=True, **kw)
    so, slse = fastattn.scaled_dot_product_attention(
        q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1), enable_gqa=True, return_lse=True,
        **kw)
    assert_same_bits(o, so.swapaxes(0, 1))
    assert_same_bits(lse, slse.swapaxes(0, 1))


# ------------------------------------------------------------- bad input

def _good():
    rng = np.random.default_rng(0)
    q, k, v, cu_q, cu_k = packed(rng, [3, 2], [4, 1], Hq=4, Hkv=2, D=3, Dv=2)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


BAD = [
    ("cu-float", TypeError, r"cu_seqlens_q must be a 1-d integer array, got dtype float64",
     {"cu_seqlens_q": np.array([0.0, 3.0, 5.0])}),
    ("cu-bool", TypeError, r"cu_seqlens_k must be a 1-d integer array, got dtype bool",
     {"cu_seqlens_k": np.array([False, True])}),
    ("cu-2d", ValueError, r"cu_seqlens_q must be a 1-d array.*got shape \(1, 3\)",
     {"cu_seqlens_q": np.array([[0, 3, 5]])}),
    ("cu-empty", ValueError, r"cu_seqlens_k must be a 1-d array of B \+ 1 >= 1.*\(0,\)",
     {"cu_seqlens_k": np.zeros(0, np.int64)}),
    ("cu-start", ValueError, r"cu_seqlens_q must start at 0, got 1",
     {"cu_seqlens_q": np.array([1, 3, 5])}),
    ("cu-decreasing", ValueError, r"cu_seqlens_k must be non-decreasing, got 4 then 2 at index 1",
     {"cu_seqlens_k": np.array([0, 4, 2, 5])}),
    ("cu-uint64-top", ValueError, r"cu_seqlens_q must be non-decreasing, got "
     r"18446744073709551615 then 18446744073709551614 at index 1",
     {"cu_seqlens_q": np.array([0, 2**64 - 1, 2**64 - 2, 5], np.uint64)}),
    ("cu-uint64", ValueError, r"cu_seqlens_k must be non-decreasing, got 9223372036854775813 "
     r"then 5 at index 1", {"cu_seqlens_k": np.array([0, 2**63 + 5, 5], np.uint64)}),
    # Python lists that no one NumPy integer dtype holds: read as uint64, or
    # the first offset outside [0, 2**64) named (not "got dtype float64")
    ("cu-list-uint64", ValueError, r"cu_seqlens_q must end at total_q \(q.shape\[0\]\) = 5, got "
     r"18446744073709551615", {"cu_seqlens_q": [0, 3, 2**64 - 1]}),
    ("cu-list-65-bits", ValueError, r"cu_seqlens_k must hold 64-bit integers \(int64, or uint64 "
     r"when all are >= 0\), got 18446744073709551616 at index 2", {"cu_seqlens_k": [0, 4, 2**64]}),
    ("cu-list-negative", ValueError, r"cu_seqlens_k must hold 64-bit integers \(int64, or uint64 "
     r"when all are >= 0\), got -1 at index 1", {"cu_seqlens_k": [0, -1, 2**63]}),
    ("cu-list-empty", ValueError, r"cu_seqlens_q must be a 1-d array of B \+ 1 >= 1.*\(0,\)",
     {"cu_seqlens_q": []}),
    ("cu-end", ValueError, r"cu_seqlens_q must end at total_q \(q.shape\[0\]\) = 5, got 6",
     {"cu_seqlens_q": np.array([0, 3, 6])}),
    ("cu-lengths", ValueError, r"cu_seqlens_q and cu_seqlens_k must have the same length.*3 and 4",
     {"cu_seqlens_k": np.array([0, 1, 4, 5])}),
    ("heads", ValueError, r"q's heads \(4\) must be a multiple of k's heads \(3",
     {"k": np.zeros((5, 3, 3), np.float32), "v": np.zeros((5, 3, 2), np.float32)}),
    ("q-2d", ValueError, r"q must have 3 dimensions \(total_q, heads, features\)",
     {"q": np.zeros((5, 3), np.float32)}),
    ("k-D", ValueError, r"k's last dimension must equal q's D=3",
     {"k": np.zeros((5, 2, 4), np.float32)}),
    ("v-rows", ValueError, r"v must have k's total_k=5 rows and Hkv=2 heads",
     {"v": np.zeros((6, 2, 2), np.float32)}),
    ("q-int", TypeError, r"\bq\b", {"q": np.zeros((5, 4, 3), np.int32)}),
    ("alibi-shape", ValueError, r"alibi_slopes of shape \(3,\) does not broadcast to \(B, Hq\) = "
     r"\(2, 4\)", {"alibi_slopes": np.ones(3, np.float32)}),
    ("alibi-nan", ValueError, r"alibi_slopes must be finite", {"alibi_slopes": np.full(4, np.nan)}),
    ("sinks-int", TypeError, r"sinks must have a real floating dtype", {"sinks": np.ones(4, int)}),
    ("softcap", ValueError, r"softcap", {"softcap": -1.0}),
    ("window", ValueError, r"window", {"window": (-1, 0)}),
    ("scale", ValueError, r"scale", {"scale": np.inf}),
    ("is_causal", TypeError, r"is_causal", {"is_causal": 1}),
    ("out-shape", ValueError, r"out must have shape \(5, 4, 2\)",
     {"out": np.zeros((5, 4, 3), np.float32)}),
]


@pytest.mark.parametrize("exc,match,change", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_varlen_errors(exc, match, change):
    args, change = _good(), dict(change)
    kw = {name: change.pop(name) for name in list(change)
          if name not in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")}
    args.update(change)
    out = kw.get("out")
    with pytest.raises(exc, match=match):
        fastattn.varlen_attention(args["q"], args["k"], args["v"], args["cu_seqlens_q"],
                                  args["cu_seqlens_k"], **kw)
    with pytest.raises(exc, match=match):
        ref.varlen_attention(args["q"], args["k"], args["v"], args["cu_seqlens_q"],
                             args["cu_seqlens_k"], **kw)
    if out is not None:
        assert (out == 0).all()
