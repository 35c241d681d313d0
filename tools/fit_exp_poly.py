"""The coefficients of the AVX2 softmax exponential (csrc/kernels_avx2.c,
exp_diff_poly_avx2): exp(r) ~ 1 + r (c1 + r (c2 + ... + r c6)) on
|r| <= ln(2)/2 (plus 1 % for the TwoSum error term), with the least maximum
relative error (Lawson's iteration on Chebyshev nodes), rounded to float32.

    python tools/fit_exp_poly.py
"""
import numpy as np


def fit(half_width=0.3466 * 1.01, degree=6, nodes=4000, iterations=300):
    t = np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes) * half_width
    f = np.exp(t)
    powers = np.vstack([t ** (k + 1) for k in range(degree)]).T  # r, r**2, ..., r**degree
    weights = np.full(nodes, 1.0 / nodes)
    for _ in range(iterations):
        w = np.sqrt(weights) / f  # relative error
        c, *_ = np.linalg.lstsq(powers * w[:, None], (f - 1.0) * w, rcond=None)
        err = np.abs((1.0 + powers @ c) / f - 1.0)
        weights = weights * err
        weights /= weights.sum()
    c32 = c.astype(np.float32)
    r = np.linspace(-half_width, half_width, 200_001)
    p = 1.0 + sum(float(ck) * r ** (k + 1) for k, ck in enumerate(c32))
    return c32, float(np.max(np.abs(p / np.exp(r) - 1.0)))


if __name__ == "__main__":
    coeffs, err = fit()
    for k, ck in enumerate(coeffs, start=1):
        print(f"c{k} = {float(ck)!r}f")
    print(f"max relative error with these float32 coefficients: {err:.3g}")
