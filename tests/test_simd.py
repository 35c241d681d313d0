"""The SIMD kernel paths: selection, and the accuracy of the exponentials."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import fastattn
from fastattn import _core, reference

from conftest import SIMD_PATHS


def _ulp_error(got, want64):
    """|got - want| in units of the float32 spacing at want."""
    want32 = want64.astype(np.float32)
    return np.abs(got.astype(np.float64) - want64) / np.spacing(np.abs(want32)).astype(np.float64)


def test_generic_path_is_always_there():
    assert "generic" in SIMD_PATHS
    assert fastattn.show_config(mode="dicts")["simd"] in SIMD_PATHS


@pytest.mark.parametrize("path", SIMD_PATHS)
def test_fastattn_simd_variable_forces_a_path(path):
    code = "import fastattn; print(fastattn.show_config(mode='dicts')['simd'])"
    env = dict(os.environ, FASTATTN_SIMD=path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == path


@pytest.mark.skipif(platform.machine().lower() not in ("aarch64", "arm64"),
                    reason="the NEON variant is built on aarch64 only")
def test_neon_is_built_and_chosen_on_aarch64():
    # Every AArch64 CPU has NEON: the automatic choice takes it.
    assert "neon" in SIMD_PATHS
    code = "import fastattn; print(fastattn.show_config(mode='dicts')['simd'])"
    env = {k: v for k, v in os.environ.items() if k != "FASTATTN_SIMD"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "neon"


def test_unknown_simd_request_warns_and_falls_back():
    code = "import fastattn; print(fastattn.show_config(mode='dicts')['simd'])"
    env = dict(os.environ, FASTATTN_SIMD="no-such-path")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert "FASTATTN_SIMD ignored" in out.stderr
    assert out.stdout.strip() in SIMD_PATHS


def test_select_simd_rejects_unknown_names():
    with pytest.raises(ValueError, match="not available"):
        _core.select_simd("sse9")


@pytest.mark.parametrize("m", [0.0, 1000.5, -3.75e5])
def test_softmax_exp_within_two_ulp(simd, m):
    # exp(x - m) for x <= m as the softmax family computes it, over every
    # difference whose exp is a nonzero float32 (and a margin), against
    # float64's exp of the exact difference.
    t = np.concatenate([np.linspace(-104.0, 0.0, 3_000_001), np.linspace(-1e-3, 0.0, 10_001)])
    x = (np.float32(m) + t.astype(np.float32)).astype(np.float32)
    y = np.empty_like(x)
    _core.exp_diff(x, m, y)
    want = np.exp(x.astype(np.float64) - np.float64(np.float32(m)))
    assert np.max(_ulp_error(y, want)) <= 2.0


def test_attention_exp2_within_two_ulp(simd):
    x = np.linspace(-151.0, 127.99, 4_000_001, dtype=np.float32)
    x = np.concatenate([x, np.linspace(-1, 0, 100_001, dtype=np.float32)])
    y = np.empty_like(x)
    _core.exp2(x, y)
    want = np.exp2(x.astype(np.float64))
    assert np.max(_ulp_error(y, want)) <= 2.0


def test_exp2_of_subnormal_results_is_the_normal_result_rounded(simd):
    # 2**x below 2**-126 is built from the polynomial's significand by an
    # integer shift (no multiplication into the subnormal range); its bits
    # must be those of 2**(x + 64), which is normal and shares x's polynomial
    # (x + 64 is exact and has the same fraction), times 2**-64 rounded once
    # to float32 (float64 holds the product exactly; numpy's cast rounds to
    # nearest even, subnormals included)
    x = np.concatenate([np.linspace(-151.0, -120.0, 2_000_001, dtype=np.float32),
                        np.float32(-126.0) - np.arange(26, dtype=np.float32),
                        np.nextafter(np.float32(-126.0) - np.arange(26, dtype=np.float32),
                                     np.float32(0))])
    y = np.empty_like(x)
    _core.exp2(x, y)
    x64 = x + np.float32(64.0)
    assert np.array_equal(x64 - np.float32(64.0), x)
    y64 = np.empty_like(x64)
    _core.exp2(x64, y64)
    want = (y64.astype(np.float64) * 2.0**-64).astype(np.float32)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))


def test_exponentials_special_values(simd):
    x = np.array([-np.inf, np.inf, np.nan, 0.0, -1000.0, 1000.0], np.float32)
    y = np.empty_like(x)
    _core.exp2(x, y)
    assert y[0] == 0.0 and not np.signbit(y[0])
    assert y[1] == np.inf
    assert np.isnan(y[2])
    assert y[3] == 1.0
    assert y[4] == 0.0
    assert y[5] == np.inf
    x = np.array([-np.inf, 0.0, -1000.0, np.nan], np.float32)
    _core.exp_diff(x, 0.0, y[:4])
    assert y[0] == 0.0 and not np.signbit(y[0])
    assert y[1] == 1.0 and y[2] == 0.0 and np.isnan(y[3])


def test_paths_agree_with_the_reference(simd, rng):
    q = rng.standard_normal((2, 3, 70, 24), dtype=np.float32)
    k = rng.standard_normal((2, 3, 90, 24), dtype=np.float32)
    v = rng.standard_normal((2, 3, 90, 20), dtype=np.float32)
    for kw in ({}, {"is_causal": True}, {"window": (10, 2)}):
        got, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        want, want_lse = fastattn.reference.scaled_dot_product_attention(q, k, v, return_lse=True,
                                                                         **kw)
        np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-6)
        np.testing.assert_allclose(lse, want_lse, rtol=3e-5, atol=3e-6)


@pytest.mark.parametrize("m", [0.0, 1000.5, -3.75e5])
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
def test_rows_of_narrow_and_wide_spread_take_the_same_exponentials(simd, m, name):
    # A row whose entries all lie within 86 of its max may take a faster
    # exponential (no result can be subnormal); appending an entry far below
    # the max sends the row down the general one. The appended exp is exactly
    # 0 and, with a length that is a multiple of 16, it is summed last: every
    # other result must come out bit for bit the same.
    t = np.linspace(-86.0, 0.0, 4096)
    x = (np.float32(m) + t.astype(np.float32)).astype(np.float32)
    x = np.stack([x, x[::-1], np.random.default_rng(3).permutation(x)])
    wide = np.concatenate([x, np.full((3, 1), np.float32(m) - 200.0, np.float32)], axis=1)
    narrow_result = getattr(fastattn, name)(x)
    wide_result = getattr(fastattn, name)(wide)
    if name != "logsumexp":
        wide_result = wide_result[:, :-1]
    np.testing.assert_array_equal(narrow_result, wide_result)


def test_exp2_in_the_normal_range_takes_the_same_bits(simd):
    # The attention kernel may take 2**x by a shorter route where every input of
    # a block lies in [-124, 0] (no subnormal result); exp2 uses the same rule
    # per eight entries. A block of such inputs and the same block with one
    # entry moved out of range must agree bit for bit on the entries they share.
    x = np.linspace(-124.0, 0.0, 80_001, dtype=np.float32)
    x = x[: x.size // 8 * 8]
    narrow = np.empty_like(x)
    _core.exp2(x, narrow)
    spoiled = x.copy()
    spoiled[::8] = -130.0  # every block of eight now has an input out of range
    wide = np.empty_like(x)
    _core.exp2(spoiled, wide)
    keep = np.ones(x.size, bool)
    keep[::8] = False
    np.testing.assert_array_equal(narrow[keep], wide[keep])
    np.testing.assert_array_equal(wide[::8], np.float32(2.0**-130))


def test_softcap_tanh_within_four_ulp(simd):
    # tanh as the kernels soft-cap scores: both forms (|x| < 0.625 and beyond),
    # the switch between them, tiny and huge arguments, against float64's tanh.
    x = np.concatenate([np.linspace(-12.0, 12.0, 2_000_001), np.linspace(0.6, 0.65, 100_001),
                        np.geomspace(1e-30, 1e-2, 10_001), np.geomspace(10.0, 3e38, 1001)])
    x = np.concatenate([x, -x]).astype(np.float32)
    y = np.empty_like(x)
    _core.tanh(x, y)
    want = np.tanh(x.astype(np.float64))
    err = np.abs(y.astype(np.float64) - want) / np.spacing(np.abs(want).astype(np.float32))
    assert np.max(err) <= 4.0
    assert np.all(np.abs(y) <= 1.0)


def test_softcap_tanh_special_values(simd):
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], np.float32)
    y = np.empty_like(x)
    _core.tanh(x, y)
    assert y[0] == 1.0 and y[1] == -1.0 and np.isnan(y[2])
    assert y[3] == 0.0 and not np.signbit(y[3]) and y[4] == 0.0 and np.signbit(y[4])
    assert y[5] == np.float32(1e-45)


@pytest.mark.parametrize("D", [16, 64, 72, 128])
@pytest.mark.parametrize("L,S", [(100, 200), (120, 150), (33, 1100), (40, 33), (97, 17)])
def test_whole_tile_kernels_give_the_general_paths_bits(simd, D, L, S):
    # Tiles of plain rows (no mask, or a shared key-padding mask that allows
    # the whole tile; causal and window bounds) may take a variant's own
    # kernels; the same rows through the general path (an explicit
    # per-query mask that allows the same keys) must give the same bits.
    rng = np.random.default_rng(D * 7 + L)
    q = rng.standard_normal((2, 1, L, D), dtype=np.float32) * 2
    k = rng.standard_normal((2, 1, S, D), dtype=np.float32)
    v = rng.standard_normal((2, 1, S, D), dtype=np.float32)
    j = np.arange(S)
    i = np.arange(L)[:, None] + S - L
    pad = np.ones((2, 1, 1, S), bool)
    pad[1, ..., S - 37:] = False
    cases = [
        ({}, np.ones((L, S), bool)),
        ({"is_causal": True}, j <= i),
        ({"window": (90, 5)}, (j >= i - 90) & (j <= i + 5)),
        ({"attn_mask": pad}, np.broadcast_to(pad, (2, 1, L, S))),
    ]
    for kw, allowed in cases:
        out, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        full = np.ascontiguousarray(np.broadcast_to(allowed, (2, 1, L, S)))
        ref, ref_lse = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=full,
                                                             return_lse=True)
        np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32), err_msg=str(kw))
        np.testing.assert_array_equal(lse.view(np.uint32), ref_lse.view(np.uint32))
    slopes = np.float32(2.0) ** -np.arange(1, 3, dtype=np.float32).reshape(2, 1)
    for kw, allowed in cases[:3]:  # ALiBi's bias on the same tiles
        out = fastattn.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, **kw)
        full = np.ascontiguousarray(np.broadcast_to(allowed, (2, 1, L, S)))
        ref = fastattn.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, attn_mask=full)
        np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32), err_msg=str(kw))
    # a NaN score in one tile (a NaN in one key): that tile and the rows it
    # reaches as the general path has them
    k[1, 0, S // 2, 3] = np.nan
    out = fastattn.scaled_dot_product_attention(q, k, v)
    ref = fastattn.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((2, 1, L, S), bool))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(out[~np.isnan(out)], ref[~np.isnan(ref)])


def test_units_whose_last_row_block_passes_the_lane_rows(simd, rng):
    """Units of 13-16, 25-32, 61-64 and 121-160 query rows: the last block of
    the micro-kernel's rows (12 with AVX-512, 6 with AVX2) reaches past the
    rows the rows-as-lanes kernels compute (multiples of 32 and of 16). The
    P.V product of those padding rows once multiplied whatever the scratch
    held (leftover denormals made whole calls 2-4x slower, from process to
    process); they must add zeros. The results are the reference's here; the
    sanitizer build (tools/sanitize.sh) also fills each new scratch with NaNs
    and aborts where those rows are not zeros."""
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
