"""Faults found by reviewing 0.1, each held to the right value."""
import math
import tracemalloc

import numpy as np
import pytest

import fastattn
from fastattn import _core, reference

IMPLS = [fastattn, reference]
IDS = ["fastattn", "reference"]


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
def test_v_none_is_a_type_error_naming_v(mod):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(TypeError, match="v must"):
        mod.scaled_dot_product_attention(x, x, None)


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
def test_gqa_with_no_query_heads_gives_an_empty_result(mod):
    q = np.ones((2, 0, 3, 4), np.float32)
    kv = np.ones((2, 2, 5, 4), np.float32)
    out, lse = mod.scaled_dot_product_attention(q, kv, kv, enable_gqa=True, return_lse=True)
    assert out.shape == (2, 0, 3, 4) and lse.shape == (2, 0, 3)
    assert mod.attention_weights(q, kv, enable_gqa=True).shape == (2, 0, 3, 5)


def test_reference_accepts_windows_wider_than_int64(rng):
    q = rng.standard_normal((5, 4), dtype=np.float32)
    k = rng.standard_normal((7, 4), dtype=np.float32)
    want = reference.scaled_dot_product_attention(q, k, k, window=(None, 0))
    for mod in IMPLS:
        np.testing.assert_allclose(mod.scaled_dot_product_attention(q, k, k, window=(2**80, 0)),
                                   want, rtol=3e-5, atol=3e-6)
        np.testing.assert_allclose(mod.sliding_window_attention(q, k, k, 10**30), want,
                                   rtol=3e-5, atol=3e-6)


def test_absurd_thread_counts_are_rejected_at_set_time():
    with pytest.raises(ValueError, match="n must be"):
        fastattn.set_num_threads(2**40)
    assert fastattn.softmax(np.ones(3, np.float32)).shape == (3,)


def test_broadcast_mask_view_is_not_materialised(rng):
    B, H, L, S = 1, 64, 256, 256
    q = rng.standard_normal((B, H, L, 8), dtype=np.float32)
    mask = np.broadcast_to(np.tril(np.ones((L, S), bool)), (B, H, L, S))
    out = np.empty((B, H, L, 8), np.float32)
    tracemalloc.start()
    fastattn.scaled_dot_product_attention(q, q, q, mask, out=out)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < B * H * L * S // 8, f"{peak} bytes traced: the mask was expanded"


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
def test_minus_inf_score_plus_inf_float_mask_is_nan(mod):
    # IEEE: -inf + inf is NaN, and a NaN among the allowed scores is a NaN row.
    q = np.array([[1.0, 0.0]], np.float32)
    k = np.array([[-np.inf, 0.0], [1.0, 0.0]], np.float32)
    out = mod.scaled_dot_product_attention(q, k, np.eye(2, dtype=np.float32),
                                           np.array([[np.inf, 0.0]], np.float32))
    assert np.isnan(out).all()


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
def test_flags_must_be_bools(mod):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="return_lse"):
        mod.scaled_dot_product_attention(x, x, x, return_lse="no")
    with pytest.raises(TypeError, match="keepdims"):
        mod.logsumexp(x, keepdims="no")


@pytest.mark.parametrize("simd", fastattn._core.simd_available())
@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
def test_log_softmax_near_zero_is_accurate(mod, simd):
    # log_softmax([0, -35])[0] = -log1p(e**-35), about -6.3e-16: log(1 + tiny)
    # would round the tiny part away.
    before = fastattn.show_config(mode="dicts")["simd"]
    fastattn._core.select_simd(simd)
    try:
        x = np.array([0.0, -35.0], np.float32)
        want = -math.log1p(math.exp(-35.0))
        got = mod.log_softmax(x)[0]
        assert abs(got - want) <= 2 * np.spacing(np.float32(abs(want)))
        got = mod.logsumexp(x)
        assert abs(got + want) <= 2 * np.spacing(np.float32(abs(want)))
    finally:
        fastattn._core.select_simd(before)


@pytest.mark.parametrize("mod", IMPLS, ids=IDS)
def test_masked_arrays_are_rejected(mod):
    x = np.ma.masked_array([1.0, 2.0], mask=[0, 1])
    with pytest.raises(TypeError, match="masked array"):
        mod.softmax(x)
    q = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="attn_mask"):
        mod.scaled_dot_product_attention(q, q, q, np.ma.masked_array(np.ones((2, 2), bool)))


@pytest.mark.parametrize("argv", [["-L", "0"], ["--repeat", "0"], ["--threads", "0"],
                                  ["-D", "0"], ["-S", "-1"], ["-L", "x"],
                                  ["-L", "4", "--threads", "4097"]])
def test_bench_rejects_bad_counts(argv, capsys):
    from fastattn.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert "expected an integer" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["--options", "--models"], "--options takes only -H, -L, -D, --threads and --repeat, "
                                "not --models"),
    (["--options", "-S", "8"], "not -S"),
    (["-L", "4", "--case", "BERT-base"], "--case selects cases of --models"),
    (["-L", "100000000"], "this shape needs about 2288.8 GiB of arrays"),
])
def test_bench_refuses_what_it_would_ignore_or_could_not_hold(argv, words, capsys):
    # a usage error (2) before anything is allocated or timed, not a flag
    # silently ignored or a NumPy MemoryError traceback
    from fastattn.__main__ import _memory_bytes, main

    if "GiB" in words and (_memory_bytes() or 0) > 2**40:
        pytest.skip("a machine with more than 1 TiB of memory")
    assert main(["bench", *argv]) == 2
    assert words in capsys.readouterr().err


def test_bench_times_grouped_query_shapes(capsys):
    from fastattn.__main__ import main

    assert main(["bench", "-H", "4", "--kv-heads", "2", "-L", "1", "-S", "64", "-D", "8",
                 "--repeat", "1", "--no-torch", "--reference"]) == 0
    assert "sdpa B=1 H=4/2 L=1 S=64 D=8" in capsys.readouterr().out
    assert main(["bench", "-H", "4", "--kv-heads", "3", "--no-torch"]) == 2
    assert "must be a multiple of --kv-heads" in capsys.readouterr().err


def _traced_peak(fn):
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_c_contiguous_float32_inputs_are_used_in_place(rng):
    # documented: a C-contiguous float32 input is not copied; anything else is
    # copied once (here: float64, converted to float32).
    q = rng.standard_normal((4, 512, 256), dtype=np.float32)  # 2 MiB
    out = np.empty_like(q)
    assert _traced_peak(lambda: fastattn.scaled_dot_product_attention(q, q, q, out=out)) \
        < q.nbytes // 4
    x = rng.standard_normal((1024, 512), dtype=np.float32)
    y = np.empty_like(x)
    assert _traced_peak(lambda: fastattn.softmax(x, out=y)) < x.nbytes // 4
    q64 = q.astype(np.float64)
    assert _traced_peak(lambda: fastattn.scaled_dot_product_attention(q64, q64, q64, out=out)) \
        >= q.nbytes


@pytest.mark.parametrize("simd", fastattn._core.simd_available())
def test_units_whose_last_row_block_passes_the_lane_rows(simd, rng):
    """Units of 13-16, 25-32, 61-64 and 121-160 query rows: the last block of
    the micro-kernel's rows (12 with AVX-512, 6 with AVX2) reaches past the
    rows the rows-as-lanes kernels compute (multiples of 32 and of 16). The
    P.V product of those padding rows once multiplied whatever the scratch
    held (leftover denormals made whole calls 2-4x slower, from process to
    process); they must add zeros. The results are the reference's here; the
    sanitizer build (tools/sanitize.sh) also fills each new scratch with NaNs
    and aborts where those rows are not zeros."""
    before = fastattn.show_config(mode="dicts")["simd"]
    fastattn._core.select_simd(simd)
    try:
        for L, vdt in [(16, np.float32), (30, np.float32), (32, np.float32), (64, np.float32),
                       (128, np.float16), (160, np.float16)]:
            q = rng.standard_normal((2, 2, L, 32), dtype=np.float32)
            k = rng.standard_normal((2, 2, L + 5, 32), dtype=np.float32)
            v = rng.standard_normal((2, 2, L + 5, 32), dtype=np.float32).astype(vdt)
            mask = np.ones((2, 1, 1, L + 5), bool)
            mask[1, ..., -3:] = False  # a key-padding mask: the same kernels
            for causal in (False, True):
                got = fastattn.scaled_dot_product_attention(q, k, v, mask, is_causal=causal)
                want = reference.scaled_dot_product_attention(
                    q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask,
                    is_causal=causal)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    finally:
        fastattn._core.select_simd(before)


def test_core_attention_takes_keywords_and_the_weights_no_values(rng):
    # _core.attention: every argument after q, k, v by keyword (it had 26
    # positional ones); the weights kernel reads no values, so v and v_off
    # are None there, where a (1, 0) array was made up before.
    q = rng.standard_normal((2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 7, 8)).astype(np.float32)
    offs = np.array([0, 40], np.int64), np.array([0, 56], np.int64)
    kw = dict(k_dtype=_core.DTYPE_F32, v_dtype=_core.DTYPE_F32, q_off=offs[0], k_off=offs[1],
              q_rs=8, k_rs=8, v_rs=0, nbatch=2, L=5, S=7, D=8, Dv=0, scale=0.5, nthreads=2,
              weights=True)
    got = np.full(2 * 5 * 7, np.nan, np.float32)
    _core.attention(q, k, None, v_off=None, out=got, **kw)
    want = fastattn.attention_weights(q, k, scale=0.5)
    np.testing.assert_array_equal(got.reshape(2, 5, 7), want)
    with pytest.raises(TypeError):
        _core.attention(q, k, None, _core.DTYPE_F32, _core.DTYPE_F32)
    with pytest.raises(ValueError):  # no values but Dv > 0
        _core.attention(q, k, None, v_off=None, out=got, **dict(kw, Dv=8))
