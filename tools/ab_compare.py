#!/usr/bin/env python3
"""A/B check of two fastattn trees: bitwise-identical results, unchanged speed.

    python tools/ab_compare.py bitwise --base OLD/src --new NEW/src [--simd generic avx2]
    python tools/ab_compare.py speed --base OLD/src --new NEW/src [--grid all] [--reps 7]

A tree is a built checkout's importable folder (its ``src`` after ``python
setup.py build_ext --inplace``). Each tree runs in subprocesses of its own
that import it as ``fastattn`` (PYTHONPATH=tree); this process never imports
fastattn, so any two builds compare.

``bitwise`` computes every case of ``cases()`` from seeded inputs in each
tree, on 1 and on 2 threads, on each SIMD path, and compares the results byte
for byte: dtypes, shapes and every bit (NaN payloads included), also of the
arrays a call writes in place (a KV cache, ``out=``). A case that raises must
raise the same exception type in both trees. Calls of a function the base
lacks are counted, not compared; a function the new tree lacks is a
difference. Exit status 1 on any difference.

``speed`` drives one persistent worker per tree over pipes and times the two
in turn, case by case (the first of each round alternating); a case's
new/base ratio is the median of its rounds' ratios. A measurement: exit
status 0 whatever the ratios.
"""
import argparse
import dataclasses
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

THREADS = (1, 2)
LONG_GRID = [(f"long D={D} L={L}{' causal' if c else ''}",
              dict(B=1, H=8, Hkv=8, L=L, S=L, D=D, causal=c))
             for D in (64, 128) for L in (1024, 4096) for c in (False, True)]
# decoding (one query row a head) without and with grouped heads, cache in and out of L2/L3
DECODE_GRID = [(f"decode {B}x{H}/{Hkv} S={S} D={D}", dict(B=B, H=H, Hkv=Hkv, L=1, S=S, D=D))
               for B, H, Hkv, S, D in ((1, 1, 1, 1024, 64), (1, 8, 8, 1500, 64),
                                       (1, 12, 12, 1024, 64), (1, 9, 9, 600, 64),
                                       (4, 8, 8, 1500, 64), (1, 8, 8, 1500, 128),
                                       (1, 9, 3, 4096, 64), (1, 32, 8, 4096, 128),
                                       (1, 16, 16, 8192, 64))]


# ---------------------------------------------------------------------------
# The cases (built and run in the workers: `fastattn` is the tree under test)

class Absent(Exception):
    """The tree (or the environment: ml_dtypes, dask) has no such function."""


def api(path):
    mod, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise Absent(path) from exc


class Gen:
    """Seeded inputs: a case's name gives the same arrays in every tree."""

    def __init__(self, name):
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))

    def n(self, *shape, dtype=np.float32):
        return self.rng.standard_normal(shape).astype(dtype)


def cast(a, dt):
    if dt == "bf16":
        try:
            import ml_dtypes
        except ImportError as exc:
            raise Absent("ml_dtypes") from exc
        return a.astype(ml_dtypes.bfloat16)
    return a if dt is None else a.astype({"f16": np.float16, "f64": np.float64}[dt])


def resolve(r, kw):
    """Keyword values given as functions of the case's Gen (seeded arrays)."""
    return {key: (val(r) if callable(val) else val) for key, val in kw.items()}


def operand(r, lead, heads, n, d, layout):
    """A (*lead, *heads, n, d) array laid out as `layout`: c (contiguous), bshd
    (the swapaxes view of a (B, S, H, D) array), strided (rows not
    contiguous), F (Fortran order)."""
    if layout == "bshd" and heads:
        return r.n(*lead, n, *heads, d).swapaxes(-3, -2)
    if layout == "strided":
        return r.n(*lead, *heads, n, 2 * d)[..., ::2]
    a = r.n(*lead, *heads, n, d)
    return np.asfortranarray(a) if layout == "F" else a


def make_mask(r, kind, shape):
    """bool / bool0 (row 0 all False); float / float0 (row 0 all -inf), nan,
    inf, f16, f64 (-1e300 entries): float masks with -inf entries."""
    u = r.rng.random(shape)
    if kind.startswith("bool"):
        m = u < 0.75
        if kind == "bool0":
            m[..., 0, :] = False
        return m
    m = r.n(*shape, dtype=np.float64) * 2
    m[u < 0.2] = -np.inf
    if kind == "float0":
        m[..., 0, :] = -np.inf
    elif kind in ("nan", "inf"):
        m.flat[1] = float(kind)
    elif kind == "f64":
        m[u > 0.8] = -1e300
    return m.astype({"f16": np.float16, "f64": np.float64}.get(kind, np.float32))


def attention(r, fn="scaled_dot_product_attention", batch=(2,), H=3, Hkv=None, L=5, S=7, D=16,
              Dv=None, layout="c", kvlayout=None, qdt=None, kdt=None, vdt=None, mask=None,
              bad=(), out=False, **kw):
    """fastattn.<fn>(q, k, v, ...): the sdpa family, attention_weights, the reference."""
    f = api("fastattn." + fn)
    Hkv, Dv = Hkv or H, Dv or D
    q = operand(r, batch, (H,) if H else (), L, D, layout)
    k = operand(r, batch, (Hkv,) if H else (), S, D, kvlayout or layout)
    v = operand(r, batch, (Hkv,) if H else (), S, Dv, kvlayout or layout)
    for spec in bad:  # "k:inf": that value in row 1 (or 0), column 0 of every head
        name, val = spec.split(":")
        a = {"q": q, "k": k, "v": v}[name]
        a[..., min(1, a.shape[-2] - 1), 0] = float(val)
    q, k, v = cast(q, qdt), cast(k, kdt), cast(v, vdt)
    kw = resolve(r, kw)
    if mask is not None:
        kw["attn_mask"] = make_mask(r, *mask)
    if fn.endswith("attention_weights"):
        return f(q, k, **kw)
    if not out:
        return f(q, k, v, **kw)
    o = np.full(q.shape[:-1] + (Dv,), np.nan, np.float32)
    res = f(q, k, v, out=o, **kw)
    return res, o, np.bool_((res[0] if isinstance(res, tuple) else res) is o)


def varlen(r, flash=False, cu_q=(0, 3, 3, 10, 30), cu_k=(0, 5, 9, 20, 61), H=4, Hkv=2, D=32,
           Dv=None, kdt=None, strided=False, out=False, cudt=np.int32, **kw):
    """fastattn.varlen_attention, or flash_attn_varlen_func (flash)."""
    Dv = Dv or D
    cq, ck = np.array(cu_q, cudt), np.array(cu_k, cudt)

    def make(t, h, d):
        return r.n(t, 2 * h, d)[:, ::2] if strided else r.n(t, h, d)
    q, k, v = make(cq[-1], H, D), cast(make(ck[-1], Hkv, D), kdt), cast(make(ck[-1], Hkv, Dv), kdt)
    kw = resolve(r, kw)
    if out:
        kw["out"] = np.full((cq[-1], H, Dv), np.nan, np.float32)
    if flash:
        lq, lk = int(np.diff(cq).max()), int(np.diff(ck).max())
        res = api("fastattn.flash_attn.flash_attn_varlen_func")(q, k, v, cq, ck, lq, lk, **kw)
    else:
        res = api("fastattn.varlen_attention")(q, k, v, cq, ck, **kw)
    return res, kw.get("out")


def flash(r, fn="flash_attn_func", B=2, L=37, S=45, H=4, Hkv=2, D=32, Dv=None, kdt=None,
          out=False, **kw):
    """flash_attn_func and its packed forms, on (B, L, H, D) arrays."""
    Dv, f = Dv or D, api("fastattn.flash_attn." + fn)
    q, k, v = r.n(B, L, H, D), cast(r.n(B, S, Hkv, D), kdt), cast(r.n(B, S, Hkv, Dv), kdt)
    kw = resolve(r, kw)
    if out:
        kw["out"] = np.full((B, L, H, Dv), np.nan, np.float32)
    if fn == "flash_attn_qkvpacked_func":
        return f(np.stack([q, r.n(B, L, H, D), r.n(B, L, H, D)], axis=2), **kw)
    if fn == "flash_attn_kvpacked_func":
        return f(q, np.stack([k, r.n(B, S, Hkv, D)], axis=2), **kw)
    return f(q, k, v, **kw), kw.get("out")


def kvcache(r, B=2, Smax=64, H=4, Hkv=2, D=32, Dv=None, L=1, Lnew=1, seqlens=(5, 40), dt=None,
            paged=None, Bc=None, rotary=None, out=False, **kw):
    """flash_attn_with_kvcache: the result and the caches after the call.
    paged=(block_size, num_blocks): a paged cache, its blocks shuffled;
    rotary=(rotary_dim, interleaved): tables over the cache's positions."""
    Dv, f = Dv or D, api("fastattn.flash_attn.flash_attn_with_kvcache")
    if paged:
        bs, nb = paged
        kc, vc, span = r.n(nb, bs, Hkv, D), r.n(nb, bs, Hkv, Dv), nb // B * bs
        kw["block_table"] = r.rng.permutation(nb).reshape(B, nb // B).astype(np.int32)
    else:
        kc, vc, span = r.n(Bc or B, Smax, Hkv, D), r.n(Bc or B, Smax, Hkv, Dv), Smax
    kc, vc = cast(kc, dt), cast(vc, dt)
    q = r.n(B, L, H, D)
    k, v = (r.n(B, Lnew, Hkv, D), r.n(B, Lnew, Hkv, Dv)) if Lnew else (None, None)
    if seqlens is not None:
        kw["cache_seqlens"] = seqlens if isinstance(seqlens, int) else np.array(seqlens, np.int32)
    if rotary:
        dim, inter = rotary
        ang = np.outer(np.arange(span), 1.0 / 10000 ** (np.arange(0, dim, 2) / dim))
        kw.update(rotary_cos=np.cos(ang).astype(np.float32),
                  rotary_sin=np.sin(ang).astype(np.float32), rotary_interleaved=inter)
    kw = resolve(r, kw)
    if out:
        kw["out"] = np.full((B, L, H, Dv), np.nan, np.float32)
    return f(q, kc, vc, k, v, **kw), kc, vc, kw.get("out")


def rowwise(r, fn, shape, fill=None, dt=None, transpose=False, out=False, **kw):
    """fastattn.<fn>(x, ...): softmax, log_softmax, logsumexp (and the reference's)."""
    f = api("fastattn." + fn)
    x = r.n(*shape, dtype=np.float64) * 3
    if fill is not None:  # the first row's first values
        x.reshape(-1, shape[-1])[0, :len(fill)] = fill
    x = x if dt == "f64" else cast(x.astype(np.float32), dt)
    x = x.T if transpose else x
    if not out:
        return f(x, **kw)
    o = np.full(f(x, **kw).shape, np.nan, np.float32)
    return f(x, out=o, **kw), o


def merge(r, P=3, shape=(2, 3, 9), Dv=16, stacked=True, out=False, lse_fill=()):
    outs, lses = r.n(P, *shape, Dv), r.n(P, *shape) * 4
    for i, val in enumerate(lse_fill):  # non-finite lses in row i of partial 0
        lses[0, ..., i] = val
    lses[:, ..., 5] = -np.inf  # a row with no key in any part
    o = np.full(shape + (Dv,), np.nan, np.float32) if out else None
    f = api("fastattn.merge_attention")
    return f(outs if stacked else list(outs), lses if stacked else list(lses), out=o), o


def packed_varlen(r, kv_only):
    cu = np.array([0, 4, 11, 30], np.int32)
    if kv_only:
        f = api("fastattn.flash_attn.flash_attn_varlen_kvpacked_func")
        return f(r.n(30, 4, 16), r.n(30, 2, 2, 16), cu, cu, 19, 19, causal=True)
    f = api("fastattn.flash_attn.flash_attn_varlen_qkvpacked_func")
    return f(r.n(30, 3, 4, 16), cu, 19, return_attn_probs=True)


def paged_varlen(r):
    f = api("fastattn.flash_attn.flash_attn_varlen_func")
    cq, ck = np.array([0, 3, 8], np.int32), np.array([0, 20, 57], np.int32)
    table = r.rng.permutation(8)[:6].reshape(2, 3).astype(np.int32)
    return f(r.n(8, 4, 16), r.n(8, 16, 2, 16), r.n(8, 16, 2, 16), cq, ck, 5, 37, causal=True,
             block_table=table)


def rotary_emb(r):
    ang = r.n(14, 8)
    f = api("fastattn.flash_attn.layers.rotary.apply_rotary_emb")
    return f(r.n(2, 12, 3, 32), np.cos(ang), np.sin(ang), seqlen_offsets=np.array([0, 2]))


def padding(r):
    mask = np.arange(10)[None, :] < np.array([[7], [10]])
    unpadded = api("fastattn.flash_attn.bert_padding.unpad_input")(r.n(2, 10, 8), mask)
    hidden, idx = unpadded[:2]
    return unpadded, api("fastattn.flash_attn.bert_padding.pad_input")(hidden * 2, idx, 2, 10)


def dask_sdpa(r, **kw):
    try:
        import dask
        import dask.array as da
    except ImportError as exc:
        raise Absent("dask") from exc
    f = api("fastattn.dask.scaled_dot_product_attention")
    q, k, v = r.n(2, 3, 40, 16), r.n(2, 3, 70, 16), r.n(2, 3, 70, 16)
    res = f(da.from_array(q, chunks=(1, 3, 16, 16)), da.from_array(k, chunks=(1, 3, 32, 16)),
            da.from_array(v, chunks=(1, 3, 32, 16)), **kw)
    return dask.compute(res, scheduler="sync")[0]


def errors():
    """Calls that must raise, the same exception type in both trees."""
    def sdpa(*a, **kw):
        return api("fastattn.scaled_dot_product_attention")(*a, **kw)
    x, y, z = np.ones((2, 5, 8), np.float32), np.ones((2, 5, 4), np.float32), np.ones((2, 6, 8))
    cache = np.zeros((1, 9, 5, 8), np.float32)
    return [
        ("int q", lambda: sdpa(x.astype(int), x, x)),
        ("D differs", lambda: sdpa(x, y, y)),
        ("bad window", lambda: sdpa(x, x, x, window=(-1, 2))),
        ("scale inf", lambda: sdpa(x, x, x, scale=np.inf)),
        ("softcap 0", lambda: sdpa(x, x, x, softcap=0.0)),
        ("masked array", lambda: sdpa(np.ma.masked_array(x), x, x)),
        ("foreign keyword", lambda: sdpa(x, x, x, dropout_p=0.0)),
        ("gqa heads", lambda: sdpa(np.ones((3, 5, 8)), x, x, enable_gqa=True)),
        ("out shape", lambda: sdpa(x, x, x, out=np.empty((2, 5, 7), np.float32))),
        ("out overlaps", lambda: sdpa(x, x, x, out=x)),
        ("mask shape", lambda: sdpa(x, x, x, np.ones((3, 5), bool))),
        ("seg one array L != S", lambda: sdpa(x, z, z, segment_ids=np.zeros(5))),
        ("softmax axis", lambda: api("fastattn.softmax")(x, axis=3)),
        ("logsumexp out dtype", lambda: api("fastattn.logsumexp")(x, out=np.empty((2, 5)))),
        ("varlen cu decreasing", lambda: api("fastattn.varlen_attention")(
            x, x, x, np.array([0, 6, 5]), np.array([0, 1, 5]))),
        ("merge shapes", lambda: api("fastattn.merge_attention")([x, y], [x[..., 0], y[..., 0]])),
        ("flash dropout", lambda: api("fastattn.flash_attn.flash_attn_func")(
            x[None], x[None], x[None], dropout_p=0.1)),
        ("kvcache k without seqlens", lambda: api("fastattn.flash_attn.flash_attn_with_kvcache")(
            x[None], cache, cache.copy(), x[None, :1], x[None, :1])),
        ("set_num_threads 0", lambda: api("fastattn.set_num_threads")(0)),
    ]


def cases():
    """(family, name, fn(Gen) -> result) for every public entry point and option."""
    out = []

    def add(family, builder, table, **common):
        for name, kw in table:
            out.append((family, name, lambda r, kw={**common, **kw}: builder(r, **kw)))

    shapes = [(1, 1, 1, None), (1, 1, 8, None), (3, 5, 3, None), (5, 7, 16, None),
              (17, 33, 17, None), (64, 64, 64, None), (65, 130, 64, None), (97, 200, 80, None),
              (40, 70, 96, None), (33, 300, 100, None), (20, 90, 128, None), (9, 77, 130, None),
              (7, 40, 256, None), (30, 50, 64, 32), (25, 60, 16, 48), (200, 200, 64, None),
              (700, 700, 64, None), (1, 1030, 64, None), (300, 1100, 32, None), (0, 5, 8, None),
              (4, 0, 8, None)]
    add("sdpa shapes", attention, [(f"L={L} S={S} D={D} Dv={Dv} causal={c}",
                                    dict(L=L, S=S, D=D, Dv=Dv, is_causal=c))
                                   for L, S, D, Dv in shapes for c in (False, True)])
    heads = lambda r: r.n(3)  # noqa: E731  (alibi slopes, sinks: one a head)
    M = (37, 53)  # the (L, S) of the option cases; D = 24, not a multiple of 16
    add("sdpa options", attention, [
        ("window (4,0)", dict(window=(4, 0))),
        ("window (None,3)", dict(window=(None, 3))),
        ("window (2,2)", dict(window=(2, 2))),
        ("window (0,0)", dict(window=(0, 0))),
        ("window (0,None)", dict(window=(0, None))),
        ("window (3,0) causal", dict(window=(3, 0), is_causal=True)),
        ("window empty rows", dict(window=(0, 0), L=53, S=37, return_lse=True)),
        ("causal L>S", dict(L=53, S=37, is_causal=True, return_lse=True)),
        ("scale 0", dict(scale=0.0)),
        ("scale 0.37", dict(scale=0.37)),
        ("scale -1.5", dict(scale=-1.5)),
        ("softcap 5", dict(softcap=5.0)),
        ("softcap 0.3 causal", dict(softcap=0.3, is_causal=True)),
        ("alibi (H,)", dict(alibi_slopes=heads)),
        ("alibi (B,H)", dict(alibi_slopes=lambda r: r.n(2, 3))),
        ("alibi causal", dict(alibi_slopes=heads, is_causal=True)),
        ("alibi window", dict(alibi_slopes=heads, window=(5, 1))),
        ("sinks", dict(sinks=heads)),
        ("sinks causal lse", dict(sinks=heads, is_causal=True, return_lse=True)),
        ("sinks nan +inf -inf", dict(sinks=lambda r: np.array([np.nan, np.inf, -np.inf]))),
        ("softcap alibi sinks", dict(softcap=3.0, alibi_slopes=heads, sinks=heads, is_causal=True)),
        ("seg pair", dict(segment_ids=lambda r: (np.repeat([0, 1, 2], [10, 20, 7]),
                                                 np.repeat([0, 1, 2], [20, 13, 20])))),
        ("seg pair unordered", dict(segment_ids=lambda r: (r.rng.integers(0, 3, 37),
                                                           r.rng.integers(0, 3, 53)))),
        ("seg one array causal", dict(L=48, S=48, is_causal=True, segment_ids=lambda r: np.repeat(
            [0, 1, 1, 2], [5, 20, 10, 13]))),
        ("seg one array lse", dict(L=48, S=48, return_lse=True,
                                   segment_ids=lambda r: np.repeat([0, 1, 2], [9, 30, 9]))),
        ("mask bool", dict(mask=("bool", M))),
        ("mask bool (B,1,1,S)", dict(mask=("bool", (2, 1, 1, 53)))),
        ("mask bool (1,S)", dict(mask=("bool", (1, 53)))),
        ("mask bool (L,1)", dict(mask=("bool", (37, 1)))),
        ("mask bool row0 lse", dict(mask=("bool0", M), return_lse=True)),
        ("mask float", dict(mask=("float", M))),
        ("mask float (B,H,L,S)", dict(mask=("float", (2, 3) + M))),
        ("mask float16", dict(mask=("f16", M))),
        ("mask float64", dict(mask=("f64", (1, 3) + M))),
        ("mask float row0 lse", dict(mask=("float0", M), return_lse=True)),
        ("mask nan", dict(mask=("nan", M))),
        ("mask +inf", dict(mask=("inf", M))),
        ("mask causal", dict(mask=("float", M), is_causal=True)),
        ("mask window softcap", dict(mask=("bool", M), window=(6, 6), softcap=2.0)),
        ("lse", dict(return_lse=True)),
        ("lse causal", dict(return_lse=True, is_causal=True)),
        ("out", dict(out=True)),
        ("out lse causal", dict(out=True, return_lse=True, is_causal=True)),
        ("out softcap (general path)", dict(out=True, softcap=4.0)),
        ("kv f16", dict(kdt="f16", vdt="f16")),
        ("kv bf16 causal", dict(kdt="bf16", vdt="bf16", is_causal=True)),
        ("k f16 v bf16", dict(kdt="f16", vdt="bf16")),
        ("kv f64", dict(kdt="f64", vdt="f64")),
        ("q f64", dict(qdt="f64")),
        ("q f16", dict(qdt="f16")),
        ("layout bshd", dict(layout="bshd")),
        ("layout kv bshd f16", dict(kvlayout="bshd", kdt="f16", vdt="f16")),
        ("layout strided", dict(layout="strided")),
        ("layout F causal", dict(layout="F", is_causal=True)),
        ("q nan", dict(bad=("q:nan",))),
        ("q inf", dict(bad=("q:inf",))),
        ("k inf", dict(bad=("k:inf",))),
        ("k -inf causal", dict(bad=("k:-inf",), is_causal=True)),
        ("v nan lse", dict(bad=("v:nan",), return_lse=True)),
        ("v inf", dict(bad=("v:inf",))),
        ("2-d inputs", dict(batch=(), H=None)),
        ("batch (2,2)", dict(batch=(2, 2))),
        ("gqa 8/2", dict(H=8, Hkv=2, enable_gqa=True)),
        ("gqa causal lse", dict(H=8, Hkv=2, enable_gqa=True, is_causal=True, return_lse=True)),
        ("gqa bshd", dict(H=8, Hkv=2, enable_gqa=True, layout="bshd")),
        ("mqa broadcast k, v", dict(Hkv=1)),
    ], L=37, S=53, D=24)
    add("entry points", attention, [
        ("causal_attention", dict(fn="causal_attention")),
        ("causal_attention window lse", dict(fn="causal_attention", window=(4, 0),
                                             return_lse=True)),
        ("sliding_window 1", dict(fn="sliding_window_attention", window_size=1)),
        ("sliding_window 5 sinks", dict(fn="sliding_window_attention", window_size=5, sinks=heads)),
        ("sliding_window 9 gqa out", dict(fn="sliding_window_attention", window_size=9, H=8, Hkv=2,
                                          enable_gqa=True, out=True)),
    ], L=37, S=53, D=24)
    add("attention_weights", attention, [
        ("plain", {}),
        ("causal", dict(is_causal=True)),
        ("window", dict(window=(3, 2))),
        ("mask row0", dict(mask=("bool0", M))),
        ("softcap", dict(softcap=2.0)),
        ("alibi sinks", dict(alibi_slopes=heads, sinks=heads)),
        ("seg", dict(segment_ids=lambda r: (np.repeat([0, 1], [17, 20]),
                                            np.repeat([0, 1], [30, 23])))),
        ("gqa", dict(H=8, Hkv=2, enable_gqa=True)),
        ("q nan", dict(bad=("q:nan",))),
        ("causal L>S", dict(L=53, S=37, is_causal=True)),
    ], fn="attention_weights", L=37, S=53, D=24)
    # L = 1 or a few rows against S > 1024 keys: the key-chunk split over threads
    add("decode", attention, [
        ("8/2 heads S=4100 D=128", {}),
        ("causal", dict(is_causal=True)),
        ("kv f16", dict(kdt="f16", vdt="f16")),
        ("kv bf16 lse", dict(kdt="bf16", vdt="bf16", return_lse=True)),
        ("kv bshd", dict(kvlayout="bshd")),
        ("window causal", dict(window=(512, 0), is_causal=True)),
        ("sinks", dict(sinks=lambda r: r.n(8))),
        ("alibi", dict(alibi_slopes=lambda r: r.n(8) * 0.01)),
        ("softcap", dict(softcap=30.0)),
        ("mask (1,S)", dict(mask=("bool", (1, 4100)))),
        ("L=4 causal", dict(L=4, is_causal=True)),
        ("D=80 S=3000", dict(D=80, S=3000)),
        ("Dv=64 S=2500", dict(Dv=64, S=2500)),
        ("B=3 12 heads S=1500", dict(batch=(3,), H=12, Hkv=12, S=1500)),
        ("4 heads S=2100 D=64", dict(H=4, Hkv=4, S=2100, D=64)),
        ("k inf", dict(bad=("k:inf",))),
        ("out lse", dict(out=True, return_lse=True)),
    ], batch=(1,), H=8, Hkv=2, L=1, S=4100, D=128, enable_gqa=True)
    add("varlen", varlen, [
        ("plain", {}),
        ("causal", dict(is_causal=True)),
        ("window", dict(window=(4, 1))),
        ("softcap", dict(softcap=5.0)),
        ("alibi (H,)", dict(alibi_slopes=lambda r: r.n(4))),
        ("alibi (B,H) causal", dict(alibi_slopes=lambda r: r.n(4, 4), is_causal=True)),
        ("sinks lse", dict(sinks=lambda r: r.n(4), return_lse=True)),
        ("out lse causal", dict(out=True, return_lse=True, is_causal=True)),
        ("kv f16", dict(kdt="f16")),
        ("kv bf16 causal", dict(kdt="bf16", is_causal=True)),
        ("strided", dict(strided=True)),
        ("D=40 Dv=24", dict(D=40, Dv=24)),
        ("cu uint64", dict(cudt=np.uint64)),
        ("one long decode", dict(cu_q=(0, 1), cu_k=(0, 2100), H=8)),
        ("long full", dict(cu_q=(0, 400, 420), cu_k=(0, 1500, 1600), D=64)),
        ("empty", dict(cu_q=(0, 0, 0), cu_k=(0, 0, 3))),
    ])
    add("merge", merge, [
        ("stacked", {}),
        ("list", dict(stacked=False)),
        ("P=1", dict(P=1)),
        ("out", dict(out=True)),
        ("lse nan +inf -inf", dict(lse_fill=(np.nan, np.inf, -np.inf))),
        ("Dv=130", dict(Dv=130)),
    ])
    rows = [("(4,7)", dict(shape=(4, 7))),
            ("(3,5,1000)", dict(shape=(3, 5, 1000))),
            ("(300,4099)", dict(shape=(300, 4099))),
            ("axis 0", dict(shape=(6, 33), axis=0)),
            ("axis 1 of 3", dict(shape=(3, 17, 5), axis=1)),
            ("one element", dict(shape=(1,))),
            ("empty slices", dict(shape=(2, 0))),
            ("f64", dict(shape=(5, 40), dt="f64")),
            ("f16", dict(shape=(5, 40), dt="f16")),
            ("transposed", dict(shape=(40, 6), transpose=True)),
            ("nan", dict(shape=(3, 9), fill=(np.nan, 1.0))),
            ("+inf", dict(shape=(3, 9), fill=(np.inf, 1.0))),
            ("all -inf", dict(shape=(2, 3), fill=(-np.inf,) * 3)),
            ("1e30 -inf", dict(shape=(2, 3), fill=(1e30, -np.inf, 0))),
            ("out", dict(shape=(7, 70), out=True))]
    for fn, label, extra in (("softmax", "axis -2", dict(axis=-2)),
                             ("log_softmax", "axis -2", dict(axis=-2)),
                             ("logsumexp", "keepdims", dict(keepdims=True))):
        add("rowwise", rowwise, [(f"{fn} {name}", kw) for name, kw in rows]
            + [(f"{fn} {label}", dict(shape=(4, 6, 5), **extra))], fn=fn)
    positive = lambda *s: lambda r: np.abs(r.n(*s))  # noqa: E731  (FlashAttention's slopes)
    add("flash_attn", flash, [
        ("plain", {}),
        ("causal", dict(causal=True)),
        ("window (5,0)", dict(window_size=(5, 0))),
        ("window (-1,3)", dict(window_size=(-1, 3))),
        ("softcap", dict(softcap=10.0)),
        ("alibi (H,)", dict(alibi_slopes=positive(4))),
        ("alibi (B,H) causal", dict(alibi_slopes=positive(2, 4), causal=True)),
        ("scale", dict(softmax_scale=0.2)),
        ("probs causal", dict(return_attn_probs=True, causal=True)),
        ("out", dict(out=True, deterministic=True, dropout_p=0.0)),
        ("kv f16", dict(kdt="f16")),
        ("L<S causal", dict(L=10, S=40, causal=True)),
        ("Dv != D", dict(Dv=48, D=20)),
        ("qkvpacked causal", dict(fn="flash_attn_qkvpacked_func", Hkv=4, S=37, causal=True)),
        ("kvpacked probs", dict(fn="flash_attn_kvpacked_func", return_attn_probs=True)),
    ])
    add("flash_attn", varlen, [
        ("varlen", {}),
        ("varlen causal probs", dict(causal=True, return_attn_probs=True)),
        ("varlen window alibi", dict(window_size=(3, 0), alibi_slopes=positive(4))),
    ], flash=True)
    add("flash_attn", packed_varlen, [("varlen_qkvpacked", dict(kv_only=False)),
                                      ("varlen_kvpacked", dict(kv_only=True))])
    add("flash_attn", paged_varlen, [("varlen paged", {})])
    add("flash_attn", rotary_emb, [("apply_rotary_emb", {})])
    add("flash_attn", padding, [("unpad_input, pad_input", {})])
    add("kvcache", kvcache, [
        ("append causal", dict(causal=True)),
        ("no append, full cache", dict(Lnew=0, seqlens=None)),
        ("seqlens int", dict(seqlens=30)),
        ("cache_batch_idx", dict(Bc=3, Lnew=0, cache_batch_idx=np.array([2, 0]))),
        ("leftpad causal", dict(cache_leftpad=np.array([2, 10], np.int32), causal=True)),
        ("rotary interleaved", dict(rotary=(16, True), causal=True)),
        ("rotary neox full", dict(rotary=(32, False))),
        ("window softcap lse", dict(window_size=(8, 0), softcap=5.0, return_softmax_lse=True)),
        ("alibi out", dict(alibi_slopes=positive(4), out=True)),
        ("f16 cache", dict(dt="f16")),
        ("bf16 cache L=4", dict(dt="bf16", L=4, Lnew=4, causal=True)),
        ("Dv != D", dict(Dv=16)),
        ("long decode", dict(B=1, Smax=3000, H=8, D=128, seqlens=(2990,), causal=True)),
        ("paged bs64 (in the kernel)", dict(paged=(64, 8), seqlens=(200, 200), causal=True)),
        ("paged bs16 (merged)", dict(paged=(16, 8), seqlens=(20, 50), L=3, Lnew=0, causal=True)),
        ("paged alibi (gathered)", dict(paged=(16, 8), seqlens=(20, 50), alibi_slopes=positive(4))),
        ("paged leftpad", dict(paged=(16, 8), seqlens=(20, 50),
                               cache_leftpad=np.array([3, 17], np.int32))),
        ("paged long bs256 lse", dict(paged=(256, 18), seqlens=(2100, 2200), H=8, D=64,
                                      return_softmax_lse=True)),
    ])
    add("dask", dask_sdpa, [
        ("plain", {}),
        ("causal lse", dict(is_causal=True, return_lse=True)),
        ("window softcap", dict(window=(10, 3), softcap=3.0)),
    ])
    add("reference", attention, [
        ("sdpa", dict(fn="reference.scaled_dot_product_attention")),
        ("sdpa causal mask lse", dict(fn="reference.scaled_dot_product_attention", is_causal=True,
                                      mask=("float", M), return_lse=True)),
        ("weights window", dict(fn="reference.attention_weights", window=(3, 2))),
    ], L=37, S=53, D=24)
    add("reference", rowwise, [("softmax nan", dict(fn="reference.softmax", shape=(3, 9),
                                                    fill=(np.nan, 1.0)))])
    out += [("errors", name, lambda r, call=call: call()) for name, call in errors()]
    return out


def flatten(x, arrays):
    """A result's structure as a string; its arrays appended to `arrays`."""
    if isinstance(x, (tuple, list)):
        return "(" + ",".join(flatten(y, arrays) for y in x) + ")"
    if x is None:
        return "None"
    arrays.append(np.asarray(x))
    return type(x).__name__


def bitwise_worker(outdir):
    import fastattn
    # A tree whose thread policy keeps small calls on one thread while the
    # machine looks loaded has this hook: the machine counts as idle before
    # each call, so that calls meant for 2 threads (decoding's key-chunk
    # split) run on 2 here too.
    idle = getattr(fastattn._core, "set_machine_busy", lambda seconds: None)
    results, arrays = [], {}
    for family, name, fn in cases():
        for t in THREADS:
            fastattn.set_num_threads(t)
            idle(0)
            rec = {"family": family, "case": name, "threads": t}
            with open(os.path.join(outdir, "running"), "w") as f:  # named if the call crashes
                f.write(f"{family}: {name} (threads={t})")
            try:
                found = []
                rec.update(status="ok", sig=flatten(fn(Gen(name)), found), arrays=[])
            except Absent as exc:
                rec.update(status="absent", error=str(exc))
            except Exception as exc:  # noqa: BLE001  (its type is the result)
                rec.update(status="raises", error=type(exc).__name__)
            else:
                for a in found:
                    key = f"a{len(arrays)}"
                    arrays[key] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                    rec["arrays"].append([key, str(a.dtype), list(a.shape)])
            results.append(rec)
    np.savez(os.path.join(outdir, "arrays.npz"), **arrays)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"simd": fastattn.show_config(mode="dicts")["simd"], "results": results}, f)


# ---------------------------------------------------------------------------
# The speed worker

def speed_worker():
    """Commands on stdin, one JSON object a line; one JSON reply a line each."""
    import fastattn
    fn = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "models":
            from fastattn._bench import MODEL_CASES
            reply = [[name, dataclasses.asdict(p)] for name, p in MODEL_CASES]
        elif cmd["op"] == "setup":  # the inputs from the tool's own seed: the same in both trees
            p = cmd["problem"]
            r = Gen(json.dumps(p, sort_keys=True))
            B, H, Hkv, L, S, D = (p[x] for x in ("B", "H", "Hkv", "L", "S", "D"))
            q, k, v = r.n(B, H, L, D), r.n(B, Hkv, S, D), r.n(B, Hkv, S, D)
            mask = None
            if p.get("padding"):  # as fastattn._bench.Problem: item b keeps S - b S / 2B keys
                valid = S - (np.arange(B) * S) // (2 * B)
                mask = (np.arange(S) < valid[:, None])[:, None, None, :]
            kw = dict(is_causal=p.get("causal", False), enable_gqa=H != Hkv,
                      window=tuple(p["window"]) if p.get("window") else None)
            fastattn.set_num_threads(cmd["threads"])
            # --idle: the machine counted as idle before each call where the
            # tree's thread policy watches the load (a no-op call elsewhere,
            # for the same overhead), so that both trees thread by work alone
            idle = getattr(fastattn._core, "set_machine_busy", lambda seconds: None)
            if not cmd["idle"]:
                idle = None

            def fn():
                if idle is not None:
                    idle(0)
                fastattn.scaled_dot_product_attention(q, k, v, mask, **kw)
            fn()  # warm up: page in, start the threads
            reply = "ok"
        elif cmd["op"] == "time":  # the best of `inner` samples of n calls, seconds a call
            best = math.inf
            for _ in range(cmd["inner"]):
                t0 = time.perf_counter()
                for _ in range(cmd["n"]):
                    fn()
                best = min(best, (time.perf_counter() - t0) / cmd["n"])
            reply = best
        else:
            return
        print(json.dumps(reply), flush=True)


# ---------------------------------------------------------------------------
# The parent

def side_env(tree, simd=None):
    env = dict(os.environ)
    rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(tree)] + rest)
    env.pop("FASTATTN_SIMD", None)
    if simd:
        env["FASTATTN_SIMD"] = simd
    return env


def tree_info(tree):
    """{'file': fastattn.__file__, 'simd': the paths this CPU runs} of `tree`."""
    code = ("import json, fastattn; from fastattn import _core; print(json.dumps("
            "{'file': fastattn.__file__, 'simd': list(_core.simd_available())}))")
    run = subprocess.run([sys.executable, "-c", code], env=side_env(tree), capture_output=True,
                         text=True, cwd=tempfile.gettempdir())
    if run.returncode:
        sys.exit(f"{tree}: `import fastattn` failed:\n{run.stderr}")
    info = json.loads(run.stdout)
    if not os.path.abspath(info["file"]).startswith(os.path.abspath(tree) + os.sep):
        sys.exit(f"{tree}: `import fastattn` found {info['file']}, not this tree")
    return info


def load(outdir):
    with open(os.path.join(outdir, "manifest.json")) as f:
        man = json.load(f)
    results = {(r["family"], r["case"], r["threads"]): r for r in man["results"]}
    return man["simd"], results, np.load(os.path.join(outdir, "arrays.npz"))


def compare(b, n, barr, narr):
    """None if the two records are identical, else the first difference."""
    if b["status"] != "ok" or n["status"] != "ok":
        if (b["status"], b.get("error")) == (n["status"], n.get("error")):
            return None
        return f"base {b['status']} {b.get('error', '')} / new {n['status']} {n.get('error', '')}"
    if b["sig"] != n["sig"]:
        return f"result {b['sig']} / {n['sig']}"
    for i, ((kb, db, sb), (kn, dn, sn)) in enumerate(zip(b["arrays"], n["arrays"])):
        if (db, sb) != (dn, sn):
            return f"array {i}: {db}{tuple(sb)} / {dn}{tuple(sn)}"
        x, y = barr[kb], narr[kn]
        if x.tobytes() != y.tobytes():
            itemsize = x.size // math.prod(sb)
            differ = (x.reshape(-1, itemsize) != y.reshape(-1, itemsize)).any(axis=1)
            return f"array {i}: {np.count_nonzero(differ)} of {math.prod(sb)} elements differ"
    return None


def cmd_bitwise(args):
    infos = {side: tree_info(tree) for side, tree in (("base", args.base), ("new", args.new))}
    paths = args.simd or [p for p in infos["base"]["simd"] if p in infos["new"]["simd"]]
    print(f"base {infos['base']['file']}\nnew  {infos['new']['file']}\n"
          f"SIMD paths {' '.join(paths)}; threads {' and '.join(map(str, THREADS))}\n")
    rows, diffs, lacking = {}, {}, set()
    with tempfile.TemporaryDirectory(prefix="ab_bitwise_") as tmp:
        for simd in paths:
            loaded = {}
            for side, tree in (("base", args.base), ("new", args.new)):
                outdir = os.path.join(tmp, f"{side}-{simd}")
                os.mkdir(outdir)
                t0 = time.perf_counter()
                run = subprocess.run([sys.executable, os.path.abspath(__file__), "_bitwise-worker",
                                      outdir], env=side_env(tree, simd), cwd=tmp)
                if run.returncode:
                    where = os.path.join(outdir, "running")
                    case = open(where).read() if os.path.exists(where) else "before the first case"
                    sys.exit(f"the {side} tree's worker failed on {simd} (exit status"
                             f" {run.returncode}) in {case}")
                print(f"  {side} on {simd}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                loaded[side] = load(outdir)
                if loaded[side][0] != simd:
                    sys.exit(f"{side} ran the {loaded[side][0]} path, not {simd}")
            (_, bres, barr), (_, nres, narr) = loaded["base"], loaded["new"]
            for key in list(bres) + [key for key in nres if key not in bres]:
                # cases, identical, of which raising, differing, base lacks
                row = rows.setdefault((key[0], simd), [0, 0, 0, 0, 0])
                row[0] += 1
                b, n = bres.get(key), nres.get(key)
                if b is not None and b["status"] == "absent":  # nothing to compare with
                    row[4] += 1
                    lacking.add(b["error"])
                    continue
                why = "a case of one tree only" if b is None or n is None else compare(b, n, barr,
                                                                                        narr)
                if why is None:
                    row[1] += 1
                    row[2] += b["status"] == "raises"
                else:
                    row[3] += 1
                    diffs.setdefault((simd, key[0], key[1], why), []).append(str(key[2]))
    head = ("family", "SIMD", "cases", "identical", "(raising)", "differing", "base lacks")
    print("{:<18} {:<8} {:>6} {:>10} {:>10} {:>10} {:>11}".format(*head))
    for (family, simd), (c, same, raising, differ, lack) in rows.items():
        print(f"{family:<18} {simd:<8} {c:>6} {same:>10} {raising:>10} {differ:>10} {lack:>11}")
    c, same, raising, differ, lack = (sum(r[i] for r in rows.values()) for i in range(5))
    print(f"{'total':<18} {'':<8} {c:>6} {same:>10} {raising:>10} {differ:>10} {lack:>11}")
    print("(a case: one call, on 1 or on 2 threads; (raising): identical calls that raise, the same"
          " exception type;\n base lacks: calls of a function the base tree does not have)")
    if lacking:
        print("\nbase lacks: " + ", ".join(sorted(lacking)))
    if diffs:
        print("\nDIFFERING ([SIMD path] family: case (thread counts): the first difference):")
        for (simd, family, name, why), threads in diffs.items():
            print(f"  [{simd}] {family}: {name} ({','.join(threads)}): {why}")
    print(f"\n{differ} calls differ" if differ else "\nbitwise identical")
    return 1 if differ else 0


class Worker:
    """A speed worker subprocess for one tree."""

    def __init__(self, tree, simd):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_speed-worker"],
                                  env=side_env(tree, simd), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())

    def __call__(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            sys.exit("a speed worker died")
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def cmd_speed(args):
    tree_info(args.base)
    tree_info(args.new)
    base, new = Worker(args.base, args.simd), Worker(args.new, args.simd)
    grid = []
    if args.grid in ("models", "all"):
        grid += base(op="models")  # the base tree's model grid: both trees time the same cases
    if args.grid in ("long", "all"):
        grid += LONG_GRID
    if args.grid in ("decode", "all"):
        grid += DECODE_GRID
    grid = [(name, p) for name, p in grid if not args.cases or name in args.cases]
    print(f"CPU {cpu_name()}; {args.threads} threads; SIMD path {args.simd or 'auto'};"
          f"{' machine counted idle before each call;' if args.idle else ''}"
          f" {args.reps} alternated rounds a case, each the best of {args.inner} samples"
          f"\nbase {args.base}\nnew  {args.new}\n")
    print(f"{'case':<26} {'base ms':>9} {'new ms':>9} {'new/base':>9}")
    ratios = []
    for name, problem in grid:
        for w in (base, new):
            w(op="setup", problem=problem, threads=args.threads, idle=args.idle)
        once = base(op="time", n=1, inner=1)
        n = max(1, min(1000, round(args.sample_s / max(once, 1e-7))))  # calls a sample
        tb, tn, rs = [], [], []
        for r in range(args.reps):
            t = {}
            for side, w in ((("base", base), ("new", new)) if r % 2 == 0 else
                            (("new", new), ("base", base))):
                t[side] = w(op="time", n=n, inner=args.inner)
            tb.append(t["base"])
            tn.append(t["new"])
            rs.append(t["new"] / t["base"])
        ratios.append(statistics.median(rs))
        print(f"{name:<26} {statistics.median(tb) * 1e3:>9.4g} {statistics.median(tn) * 1e3:>9.4g}"
              f" {ratios[-1]:>9.3f}{'  > 1.10' if ratios[-1] > 1.10 else ''}", flush=True)
    base.close()
    new.close()
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"\ngeometric mean {gm:.3f} (target <= 1.03); max {max(ratios):.3f} (target <= 1.10);"
          f" {sum(x > 1.10 for x in ratios)} case(s) over 1.10")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_bitwise-worker"]:
        return bitwise_worker(argv[1])
    if argv[:1] == ["_speed-worker"]:
        return speed_worker()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    bw = sub.add_parser("bitwise", help="bitwise comparison of every case")
    sp = sub.add_parser("speed", help="alternated timing of the model and long grids")
    for p in (bw, sp):
        p.add_argument("--base", required=True, help="the baseline tree (e.g. OLD/src)")
        p.add_argument("--new", required=True, help="the tree under test (e.g. NEW/src)")
    bw.add_argument("--simd", nargs="+", help="SIMD paths (default: every path both trees run)")
    sp.add_argument("--grid", choices=("models", "long", "decode", "all"), default="all")
    sp.add_argument("--reps", type=int, default=7, help="alternated rounds a case (default 7)")
    sp.add_argument("--inner", type=int, default=3, help="samples a round, the best kept")
    sp.add_argument("--sample-s", type=float, default=0.02, help="least seconds a sample")
    sp.add_argument("--cases", nargs="+", help="only these cases, by name")
    sp.add_argument("--threads", type=int, default=2)
    sp.add_argument("--simd", help="FASTATTN_SIMD for both trees (default: auto)")
    sp.add_argument("--idle", action="store_true",
                    help="count the machine as idle before each call, in a tree whose thread"
                         " policy keeps small calls on one thread under load (a shared machine)")
    args = ap.parse_args(argv)
    return cmd_bitwise(args) if args.command == "bitwise" else cmd_speed(args)


if __name__ == "__main__":
    sys.exit(main())
