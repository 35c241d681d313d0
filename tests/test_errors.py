"""Every documented error of the attention functions: the named
exception, a message naming the argument, and `out` left unchanged; flags
that must be bools, arguments that are no arrays, masked arrays; and the
keywords of other libraries, which get a hint naming this one's.
(softmax errors: test_softmax.py; out= errors: test_out.py; thread
errors: test_threads.py; thousands of malformed calls: test_errors_fuzzed.py;
inputs that must not corrupt memory: test_memory_safety.py.)"""

import numpy as np
import pytest

import fastattn
from fastattn import reference as ref
from fastattn.flash_attn import flash_attn_func, flash_attn_with_kvcache

from conftest import IMPL_IDS, IMPLS, assert_same_bits, randn

sdpa = fastattn.scaled_dot_product_attention
L, S, D, DV = 4, 6, 3, 5


def _good(rng):
    return {"q": randn(rng, 2, L, D), "k": randn(rng, 2, S, D), "v": randn(rng, 2, S, DV)}


def _replace(**changes):
    def make(rng):
        a = _good(rng)
        for name, value in changes.items():
            a[name] = value(rng) if callable(value) else value
        return a
    return make


# (id, exception, regex naming the argument, inputs, extra keywords)
CASES = [
    # q, k, v of a real floating dtype; a mask bool or real floating
    ("q-int", TypeError, r"\bq\b", _replace(q=np.ones((2, L, D), np.int32)), {}),
    ("k-int64", TypeError, r"\bk\b", _replace(k=np.ones((2, S, D), np.int64)), {}),
    ("v-bool", TypeError, r"\bv\b", _replace(v=np.ones((2, S, DV), bool)), {}),
    ("q-complex", TypeError, r"\bq\b", _replace(q=np.ones((2, L, D), np.complex64)), {}),
    ("k-object", TypeError, r"\bk\b", _replace(k=np.ones((2, S, D), object)), {}),
    ("q-int-list", TypeError, r"\bq\b", _replace(q=[[[1, 0, 0]] * L] * 2), {}),
    ("mask-int", TypeError, r"attn_mask", _replace(), {"attn_mask": np.ones((L, S), np.int8)}),
    ("mask-complex", TypeError, r"attn_mask", _replace(), {"attn_mask": np.ones((L, S), np.complex64)}),
    ("mask-object", TypeError, r"attn_mask", _replace(), {"attn_mask": np.ones((L, S), object)}),
    # shapes: q (..., L, D), k (..., S, D), v (..., S, Dv), D >= 1, the batch dims broadcast
    ("q-1d", ValueError, r"\bq\b", _replace(q=np.ones(D, np.float32)), {}),
    ("k-1d", ValueError, r"\bk\b", _replace(k=np.ones(D, np.float32)), {}),
    ("v-0d", ValueError, r"\bv\b", _replace(v=np.float32(1.0)), {}),
    ("D-zero", ValueError, r"\bD\b|\bq\b|\bk\b",
     _replace(q=np.ones((2, L, 0), np.float32), k=np.ones((2, S, 0), np.float32)), {}),
    ("D-mismatch", ValueError, r"\bq\b|\bk\b", _replace(k=lambda r: randn(r, 2, S, D + 1)), {}),
    ("S-mismatch", ValueError, r"\bk\b|\bv\b", _replace(v=lambda r: randn(r, 2, S + 1, DV)), {}),
    ("batch-mismatch", ValueError, r"\bq\b|\bk\b|\bv\b", _replace(k=lambda r: randn(r, 3, S, D),
                                                               v=lambda r: randn(r, 3, S, DV)), {}),
    ("batch-mismatch-v", ValueError, r"\bq\b|\bk\b|\bv\b", _replace(v=lambda r: randn(r, 3, S, DV)), {}),
    ("mask-shape", ValueError, r"attn_mask", _replace(), {"attn_mask": np.ones((L, S + 1), bool)}),
    ("mask-shape-L", ValueError, r"attn_mask", _replace(), {"attn_mask": np.ones((L + 1, S), bool)}),
    ("mask-batch", ValueError, r"attn_mask", _replace(), {"attn_mask": np.ones((3, L, S), np.float32)}),
    # the mask broadcasts *to* the output's batch shape; it cannot add dims
    ("mask-extra-dims", ValueError, r"attn_mask", _replace(), {"attn_mask": np.ones((3, 2, L, S), bool)}),
    # scale: None or a finite real number
    ("scale-nan", ValueError, r"scale", _replace(), {"scale": float("nan")}),
    ("scale-inf", ValueError, r"scale", _replace(), {"scale": float("inf")}),
    ("scale-neginf", ValueError, r"scale", _replace(), {"scale": -np.inf}),
    ("scale-np-nan", ValueError, r"scale", _replace(), {"scale": np.float32("nan")}),
    ("scale-str", TypeError, r"scale", _replace(), {"scale": "0.5"}),
    ("scale-bool", TypeError, r"scale", _replace(), {"scale": True}),
    ("scale-array", TypeError, r"scale", _replace(), {"scale": np.ones(2)}),
    ("scale-complex", TypeError, r"scale", _replace(), {"scale": 1j}),
    # window: a pair (left, right) of ints >= 0 or None
    ("window-int", ValueError, r"window", _replace(), {"window": 2}),
    ("window-len1", ValueError, r"window", _replace(), {"window": (2,)}),
    ("window-len3", ValueError, r"window", _replace(), {"window": (1, 2, 3)}),
    ("window-negative-left", ValueError, r"window", _replace(), {"window": (-1, 0)}),
    ("window-negative-right", ValueError, r"window", _replace(), {"window": (0, -1)}),
    ("window-float", ValueError, r"window", _replace(), {"window": (1.5, 0)}),
    ("window-float-integral", ValueError, r"window", _replace(), {"window": (1.0, 0)}),
    ("window-bool", ValueError, r"window", _replace(), {"window": (True, 0)}),
    ("window-str", ValueError, r"window", _replace(), {"window": "ab"}),
    ("window-set", ValueError, r"window", _replace(), {"window": {1, 2}}),
    # grouped-query attention: Hq a multiple of Hkv, the head axis -3
    ("gqa-not-divisible", ValueError, r"\bq\b|\bk\b|\bv\b|enable_gqa|head",
     _replace(q=lambda r: randn(r, 5, L, D), k=lambda r: randn(r, 2, S, D),
              v=lambda r: randn(r, 2, S, DV)), {"enable_gqa": True}),
    ("gqa-k-v-heads-differ", ValueError, r"\bk\b|\bv\b|enable_gqa|head",
     _replace(q=lambda r: randn(r, 4, L, D), k=lambda r: randn(r, 2, S, D),
              v=lambda r: randn(r, 4, S, DV)), {"enable_gqa": True}),
    ("gqa-2d", ValueError, r"\bq\b|\bk\b|\bv\b|enable_gqa",
     _replace(q=lambda r: randn(r, L, D), k=lambda r: randn(r, S, D), v=lambda r: randn(r, S, DV)),
     {"enable_gqa": True}),
    # the messages say what to do
    ("heads-differ-without-gqa", ValueError,
     r"q has 4 heads and k 2 \(axis -3\): pass enable_gqa=True for grouped-query attention",
     _replace(q=lambda r: randn(r, 4, L, D), k=lambda r: randn(r, 2, S, D),
              v=lambda r: randn(r, 2, S, DV)), {}),
    ("heads-not-multiple-without-gqa", ValueError,
     r"q has 4 heads and k 3 \(axis -3\): grouped-query attention \(enable_gqa=True\) needs",
     _replace(q=lambda r: randn(r, 4, L, D), k=lambda r: randn(r, 3, S, D),
              v=lambda r: randn(r, 3, S, DV)), {}),
    ("gqa-heads-not-multiple-message", ValueError,
     r"q's number of heads must be a multiple of k's .*got 4 query heads and 3 kv heads",
     _replace(q=lambda r: randn(r, 4, L, D), k=lambda r: randn(r, 3, S, D),
              v=lambda r: randn(r, 3, S, DV)), {"enable_gqa": True}),
    ("gqa-zero-kv-heads", ValueError, r"k and v must have at least one head",
     _replace(q=lambda r: randn(r, 4, L, D), k=lambda r: randn(r, 0, S, D),
              v=lambda r: randn(r, 0, S, DV)), {"enable_gqa": True}),
    ("gqa-more-kv-heads", ValueError, r"\bq\b|\bk\b|\bv\b|enable_gqa|head",
     _replace(q=lambda r: randn(r, 2, L, D), k=lambda r: randn(r, 4, S, D),
              v=lambda r: randn(r, 4, S, DV)), {"enable_gqa": True}),
    # the score options: the argument, what it got, what was expected
    ("softcap-zero", ValueError, r"softcap must be a finite number > 0.*got 0", _replace(),
     {"softcap": 0}),
    ("softcap-negative", ValueError, r"softcap.*> 0.*got -2.0", _replace(), {"softcap": -2.0}),
    ("softcap-nan", ValueError, r"softcap.*got nan", _replace(), {"softcap": float("nan")}),
    ("softcap-inf", ValueError, r"softcap.*got inf", _replace(), {"softcap": float("inf")}),
    ("softcap-subnormal", ValueError, r"softcap must be at least", _replace(), {"softcap": 1e-40}),
    ("softcap-str", TypeError, r"softcap must be a real number.*got str", _replace(),
     {"softcap": "30"}),
    ("alibi-shape", ValueError,
     r"alibi_slopes of shape \(3,\) does not broadcast to q.shape\[:-2\] = \(2,\)", _replace(),
     {"alibi_slopes": np.ones(3, np.float32)}),
    ("alibi-int", TypeError, r"alibi_slopes must have a real floating dtype.*got int64",
     _replace(), {"alibi_slopes": np.ones(2, np.int64)}),
    ("alibi-nan", ValueError, r"alibi_slopes must be finite.*got nan", _replace(),
     {"alibi_slopes": np.array([0.5, np.nan])}),
    ("alibi-overflow", ValueError, r"alibi_slopes must be finite \(in float32\), got 1e\+300",
     _replace(), {"alibi_slopes": np.array([0.5, 1e300])}),
    ("sinks-shape", ValueError, r"sinks of shape \(2, 2\) does not broadcast to q.shape\[:-2\]",
     _replace(), {"sinks": np.ones((2, 2), np.float32)}),
    ("sinks-complex", TypeError, r"sinks must have a real floating dtype.*got complex",
     _replace(), {"sinks": np.ones(2, np.complex64)}),
    ("segments-float", TypeError, r"segment_ids\[0\] \(q_ids\) must have an integer dtype, got "
     r"float32", _replace(), {"segment_ids": (np.zeros(L, np.float32), np.zeros(S, np.int64))}),
    ("segments-bool", TypeError, r"segment_ids\[1\] \(kv_ids\) must have an integer dtype, got "
     r"bool", _replace(), {"segment_ids": (np.zeros(L, np.int64), np.zeros(S, bool))}),
    ("segments-q-shape", ValueError,
     r"segment_ids\[0\] \(q_ids\) of shape \(5,\) does not broadcast to \(2, 4\)", _replace(),
     {"segment_ids": (np.zeros(L + 1, np.int64), np.zeros(S, np.int64))}),
    ("segments-kv-shape", ValueError,
     r"segment_ids\[1\] \(kv_ids\) of shape \(3, 6\) does not broadcast to \(2, 6\)", _replace(),
     {"segment_ids": (np.zeros(L, np.int64), np.zeros((3, S), np.int64))}),
    ("segments-one-array-L!=S", ValueError, r"one segment_ids array serves.*L=4, S=6",
     _replace(), {"segment_ids": np.zeros(L, np.int64)}),
    ("segments-triple", ValueError, r"segment_ids must be one integer array or a pair.*length 3",
     _replace(), {"segment_ids": (np.zeros(L, np.int64),) * 3}),
]


def _expected_out_shape(a):
    try:
        batch = np.broadcast_shapes(np.shape(a["q"])[:-2], np.shape(a["k"])[:-2], np.shape(a["v"])[:-2])
        return batch + (np.shape(a["q"])[-2], np.shape(a["v"])[-1])
    except (ValueError, IndexError):
        return None


@pytest.mark.parametrize("exc,match,make,kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sdpa_errors(rng, exc, match, make, kw):
    a = make(rng)
    with pytest.raises(exc, match=match):
        sdpa(a["q"], a["k"], a["v"], **kw)


@pytest.mark.parametrize("exc,match,make,kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sdpa_errors_leave_out_unchanged(rng, exc, match, make, kw):
    a = make(rng)
    shape = _expected_out_shape(a)
    if shape is None or "gqa" in str(kw):
        shape = (2, L, DV)
    out = np.full(shape, -7.25, np.float32)
    before = out.copy()
    with pytest.raises(exc):
        sdpa(a["q"], a["k"], a["v"], out=out, **kw)
    assert_same_bits(out, before)


# cases about v only: attention_weights(q, k, ...) does not take v
_V_ONLY = {"v-bool", "v-0d", "S-mismatch", "batch-mismatch-v", "gqa-k-v-heads-differ"}
_WEIGHT_CASES = [c for c in CASES if c[0] not in _V_ONLY]


@pytest.mark.parametrize("exc,match,make,kw", [c[1:] for c in _WEIGHT_CASES],
                         ids=[c[0] for c in _WEIGHT_CASES])
def test_attention_weights_errors(rng, exc, match, make, kw):
    a = make(rng)
    with pytest.raises(exc, match=match):
        fastattn.attention_weights(a["q"], a["k"], **kw)


# --------------------------------------------------------- convenience forms

@pytest.mark.parametrize("window_size", [0, -1, -5, True, False, 1.5, 2.0, "3", None, (2, 0)])
def test_sliding_window_size_invalid(rng, window_size):
    a = _good(rng)
    with pytest.raises(ValueError, match="window_size"):
        fastattn.sliding_window_attention(a["q"], a["k"], a["v"], window_size)


def test_sliding_window_size_invalid_leaves_out_unchanged(rng):
    a = _good(rng)
    out = np.full((2, L, DV), 3.5, np.float32)
    with pytest.raises(ValueError):
        fastattn.sliding_window_attention(a["q"], a["k"], a["v"], 0, out=out)
    assert (out == 3.5).all()


def test_sliding_window_with_window_keyword_type_error(rng):
    a = _good(rng)
    with pytest.raises(TypeError, match="window"):
        fastattn.sliding_window_attention(a["q"], a["k"], a["v"], 2, window=(1, 0))


@pytest.mark.parametrize("flag", [True, False])
def test_causal_attention_with_is_causal_keyword_type_error(rng, flag):
    a = _good(rng)
    with pytest.raises(TypeError, match="is_causal"):
        fastattn.causal_attention(a["q"], a["k"], a["v"], is_causal=flag)


@pytest.mark.parametrize("fn", ["causal_attention", "sliding_window_attention"])
def test_convenience_forms_pass_errors_through(rng, fn):
    a = _good(rng)
    args = (a["q"], a["k"], a["v"]) + ((2,) if fn == "sliding_window_attention" else ())
    with pytest.raises(ValueError, match="scale"):
        getattr(fastattn, fn)(*args, scale=float("nan"))
    with pytest.raises(TypeError, match="attn_mask"):
        getattr(fastattn, fn)(*args, attn_mask=np.ones((L, S), np.int32))


def test_attention_weights_has_no_out(rng):
    a = _good(rng)
    with pytest.raises(TypeError):
        fastattn.attention_weights(a["q"], a["k"], out=np.empty((2, L, S), np.float32))


def test_positional_keywords_rejected(rng):
    # keyword-only arguments after the arrays and the mask
    a = _good(rng)
    with pytest.raises(TypeError):
        sdpa(a["q"], a["k"], a["v"], None, True)
    with pytest.raises(TypeError):
        fastattn.softmax(a["q"], -1, None)


# ------------------------------------------- arguments of the wrong kind

@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
def test_v_none_is_a_type_error_naming_v(mod):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(TypeError, match="v must"):
        mod.scaled_dot_product_attention(x, x, None)


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
def test_flags_must_be_bools(mod):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="return_lse"):
        mod.scaled_dot_product_attention(x, x, x, return_lse="no")
    with pytest.raises(TypeError, match="keepdims"):
        mod.logsumexp(x, keepdims="no")


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
def test_masked_arrays_are_rejected(mod):
    x = np.ma.masked_array([1.0, 2.0], mask=[0, 1])
    with pytest.raises(TypeError, match="masked array"):
        mod.softmax(x)
    q = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="attn_mask"):
        mod.scaled_dot_product_attention(q, q, q, np.ma.masked_array(np.ones((2, 2), bool)))


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("scale", [10**400, -10**400])
def test_scale_beyond_float64_is_a_value_error(mod, scale):
    # beyond float64, float(scale) itself overflows: still a ValueError naming scale
    q = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="scale"):
        mod.scaled_dot_product_attention(q, q, q, scale=scale)


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("mask", [{}, object(), [[1.0, 2.0], [3.0]], "ab"],
                         ids=["dict", "object", "ragged", "str"])
def test_mask_that_is_no_array_is_a_type_error_naming_attn_mask(mod, mask):
    # not AttributeError (dict, object()) nor NumPy's ValueError for a ragged
    # list, which would not name the argument
    q = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="attn_mask"):
        mod.scaled_dot_product_attention(q, q, q, mask)


# ----------------------- the habits of other libraries get a hint, no more

@pytest.mark.parametrize("call,match", [
    (lambda x: fastattn.softmax(x, dim=-1), "dim.*axis="),
    (lambda x: fastattn.logsumexp(x, keepdim=True), "keepdims="),
    (lambda x: fastattn.scaled_dot_product_attention(x, x, x, dropout_p=0.1), "no dropout"),
    (lambda x: fastattn.scaled_dot_product_attention(x, x, x, causal=True), "is_causal="),
    (lambda x: fastattn.causal_attention(x, x, x, softmax_scale=0.5), "scale="),
    (lambda x: fastattn.varlen_attention(x, x, x, [0, 2], [0, 2], window_size=(2, 0)),
     r"window=\(left, right\)"),
    (lambda x: ref.scaled_dot_product_attention(x, x, x, attention_mask=None), "attn_mask"),
    (lambda x: fastattn.scaled_dot_product_attention(x, x, x, window=(-1, 0)),
     "FlashAttention's -1 for an unbounded side is None"),
])
def test_foreign_habits_get_a_hint(rng, call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call(randn(rng, 2, 4))


def test_unknown_keywords_and_inner_type_errors_are_left_alone(rng):
    x = randn(rng, 2, 4)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bogus'$"):
        fastattn.softmax(x, bogus=1)
    with pytest.raises(TypeError, match="axis must be an int"):
        fastattn.softmax(x, axis="dim")


def test_hints_point_only_at_arguments_the_function_has(rng):
    p = randn(rng, 4, 2, 8)
    x = randn(rng, 1, 4, 2, 8)
    for call in (lambda: fastattn.varlen_attention(p, p, p, [0, 4], [0, 4], mask=None),
                 lambda: fastattn.merge_attention(p, p[..., 0], dim=0),
                 lambda: fastattn.softmax(p, causal=True),
                 lambda: fastattn.scaled_dot_product_attention(p, p, p, keepdim=True)):
        with pytest.raises(TypeError, match=r"unexpected keyword argument '\w+'$"):
            call()
    with pytest.raises(TypeError, match="causal by definition"):
        fastattn.causal_attention(p, p, p, is_causal=True)
    with pytest.raises(TypeError, match="pass causal="):
        flash_attn_func(x, x, x, is_causal=True)
    with pytest.raises(TypeError, match=r"pass window_size=\(left, right\)"):
        flash_attn_with_kvcache(x, x, x, window=(1, 0))
