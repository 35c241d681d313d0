"""Malformed-input fuzzing: thousands of wrong calls, from a fixed seed.

Each call starts from a valid call of a public function (random small shapes
and options) and breaks one or two arguments from a catalogue (wrong dtypes,
ndim, D or S, axis, window, scale, window_size, flags, masks that do not
broadcast, object arrays, ragged lists, huge ints, softcap, ALiBi slopes,
sinks and segment ids of the wrong type, shape or value, cu_seqlens that are
not 1-d integers from 0 to the total, out of the wrong dtype, shape or
layout, read-only or overlapping an input). It must raise TypeError,
ValueError or numpy.exceptions.AxisError whose message names a broken
argument, and leave a valid `out` untouched. A crash kills the run; a hang is
caught by faulthandler's watchdog.
"""

import faulthandler
import re

import numpy as np
import pytest

import fastattn

try:
    from numpy.exceptions import AxisError
except ImportError:  # pragma: no cover
    from numpy import AxisError

N_BASES = 60          # random valid calls per function; each gets every corruption
N_PAIRS = 400         # extra calls with two corruptions at once
BAD_DTYPES = [np.int8, np.int64, np.uint16, np.bool_, np.complex64, np.complex128, object,
              "U3", "S2", "datetime64[s]", "timedelta64[ms]", "V4"]


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _bad_array(rng, a, how):
    """`a` broken in way `how` (dtype / container); None if not applicable."""
    if how == "list-int":
        return np.ones(a.shape, np.int32).tolist() if a.size else [[1, 2], [3, 4]]
    if how == "ragged":
        return [[1.0, 2.0], [3.0]]
    if how == "object-floats":
        return a.astype(object)
    if how in ("none", "str", "dict"):
        return {"none": None, "str": "abc", "dict": {}}[how]
    return np.zeros(a.shape, dtype=how)


ARRAY_BREAKS = ["list-int", "ragged", "object-floats", "str", "dict"] + BAD_DTYPES


# -------------------------------------------------------- rowwise functions

def _rowwise_base(rng):
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(n) for n in rng.integers(0, 5, ndim))
    x = _f32(rng, *shape)
    return {"fn": str(rng.choice(["softmax", "log_softmax", "logsumexp"])), "x": x,
            "axis": int(rng.integers(-ndim, ndim)), "keepdims": bool(rng.integers(0, 2))}


def _rowwise_result_shape(b):
    x = b["x"]
    if b["fn"] != "logsumexp":
        return x.shape
    shape = list(x.shape)
    if b["keepdims"]:
        shape[b["axis"]] = 1
    else:
        del shape[b["axis"]]
    return tuple(shape)


def _rowwise_breaks(rng, b):
    """(argument name, change) pairs; change(b) edits the call in place."""
    x = b["x"]
    out = []
    for how in ARRAY_BREAKS + ["none"]:
        out.append(("x", lambda b, how=how: b.update(x=_bad_array(rng, x, how))))
    out.append(("x", lambda b: b.update(x=np.ma.masked_array(x))))
    for axis in [x.ndim, -x.ndim - 1, 2**63, -2**70, 10**30]:
        out.append(("axis", lambda b, axis=axis: b.update(axis=axis)))
    for axis in [1.0, None, "0", True, np.float64(0), (0,), [0]]:
        out.append(("axis", lambda b, axis=axis: b.update(axis=axis)))
    out.append(("axis", lambda b: b.update(x=np.float32(1.0), axis=0)))  # 0-d input
    out.append(("axis", lambda b: b.update(x=np.array(2.0), axis=-1)))
    if b["fn"] == "logsumexp":
        for kd in [1, None, "yes", np.array([True])]:
            out.append(("keepdims", lambda b, kd=kd: b.update(keepdims=kd)))
    out.extend(_out_breaks(rng, _rowwise_result_shape(b), {"x": x}))
    return out


def _call_rowwise(b):
    kw = {"axis": b["axis"]}
    if b["fn"] == "logsumexp":
        kw["keepdims"] = b["keepdims"]
    if "out" in b:
        kw["out"] = b["out"]
    return getattr(fastattn, b["fn"])(b["x"], **kw)


# -------------------------------------------------------- attention functions

def _attn_base(rng):
    gqa = bool(rng.integers(0, 2))
    hkv = int(rng.integers(1, 3))
    hq = hkv * int(rng.integers(1, 3))
    lead = tuple(int(n) for n in rng.integers(1, 3, int(rng.integers(0, 2))))
    L, S, D, Dv = (int(n) for n in rng.integers(1, 6, 4))
    q = _f32(rng, *lead, hq, L, D)
    k = _f32(rng, *lead, hkv if gqa else hq, S, D)
    v = _f32(rng, *lead, hkv if gqa else hq, S, Dv)
    b = {"fn": str(rng.choice(["sdpa", "causal", "sliding", "weights"])), "q": q, "k": k, "v": v,
         "kw": {"enable_gqa": gqa}}
    if rng.integers(0, 2):
        b["kw"]["attn_mask"] = (rng.random((L, S)) < 0.5 if rng.integers(0, 2)
                                else _f32(rng, 1, L, S))
    if b["fn"] == "sliding":
        b["window_size"] = int(rng.integers(1, 4))
    if b["fn"] in ("sdpa", "weights") and rng.integers(0, 2):
        b["kw"]["window"] = (int(rng.integers(0, 3)), None)
    # the score options, valid, now and then (each call breaks one or two arguments)
    if rng.integers(0, 3) == 0:
        b["kw"]["softcap"] = float(rng.uniform(0.5, 5))
    if rng.integers(0, 3) == 0:
        b["kw"]["alibi_slopes"] = _f32(rng, hq)
    if rng.integers(0, 3) == 0:
        b["kw"]["sinks"] = _f32(rng, *lead, hq)
    if rng.integers(0, 3) == 0:
        b["kw"]["segment_ids"] = (rng.integers(0, 2, L), rng.integers(0, 2, S))
    return b


def _attn_result_shape(b):
    q, v = b["q"], b["v"]
    if b["kw"].get("enable_gqa"):
        batch = np.broadcast_shapes(q.shape[:-3], b["k"].shape[:-3], v.shape[:-3]) + q.shape[-3:-2]
    else:
        batch = np.broadcast_shapes(q.shape[:-2], b["k"].shape[:-2], v.shape[:-2])
    last = b["k"].shape[-2] if b["fn"] == "weights" else v.shape[-1]
    return tuple(batch) + (q.shape[-2], last)


def _attn_breaks(rng, b):
    q, k, v = b["q"], b["k"], b["v"]
    L, D = q.shape[-2:]
    S = k.shape[-2]
    names = ("q", "k") if b["fn"] == "weights" else ("q", "k", "v")
    out = []
    for name in names:
        a = b[name]
        for how in ARRAY_BREAKS + ["none"]:
            out.append((name, lambda b, name=name, a=a, how=how: b.update({name: _bad_array(rng, a, how)})))
        out.append((name, lambda b, name=name, a=a: b.update({name: a[(0,) * (a.ndim - 1)]})))  # 1-d
        out.append((name, lambda b, name=name: b.update({name: np.float32(1.0)})))             # 0-d
        out.append((name, lambda b, name=name, a=a: b.update({name: np.ma.masked_array(a)})))
    out.append(("k", lambda b: b.update(k=_f32(rng, *k.shape[:-1], D + 1))))           # D mismatch
    out.append(("q|k|D", lambda b: b.update(q=q[..., :0], k=k[..., :0])))               # D = 0
    if "v" in names:
        out.append(("v", lambda b: b.update(v=_f32(rng, *v.shape[:-2], S + 1, v.shape[-1]))))
    out.append(("q|k|v", lambda b: b.update(q=_f32(rng, 5, *q.shape), k=_f32(rng, 3, *k.shape),
                                            v=_f32(rng, 3, *v.shape))))                # batch
    for bad in [np.ones((L, S + 1), bool), np.ones((L + 1, S), np.float32),
                np.ones((7, L, S), bool), np.ones((2, 3, 5, L, S), bool),
                np.ones((L, S), np.int8), np.ones((L, S), np.complex64),
                np.ones((L, S), object), np.ones((L, S), "U1"), [[True], [True, False]],
                {}, object(), "mask", np.ma.masked_array(np.ones((L, S), bool))]:
        out.append(("attn_mask", lambda b, bad=bad: b["kw"].update(attn_mask=bad)))
    for flag in ("is_causal", "enable_gqa") if b["fn"] in ("sdpa", "weights") else ("enable_gqa",):
        for bad in [1, 0, None, "True", np.array([True]), 1.0]:
            out.append((flag, lambda b, flag=flag, bad=bad: b["kw"].update({flag: bad})))
    if b["fn"] == "sdpa":
        for bad in [1, None, "yes"]:
            out.append(("return_lse", lambda b, bad=bad: b["kw"].update(return_lse=bad)))
    for bad in [float("nan"), float("inf"), -np.inf, 1e39, -1e39, np.float64(4e38), 10**400,
                -10**400, np.longdouble("1e4000"), "0.5", True, np.ones(2), 1j,
                [1.0], {}, b"1"]:
        out.append(("scale", lambda b, bad=bad: b["kw"].update(scale=bad)))
    if b["fn"] in ("sdpa", "weights"):
        for bad in [2, (2,), (1, 2, 3), (-1, 0), (0, -1), (-2**70, None), (1.5, 0), (1.0, 0),
                    (True, 0), (0, False), "ab", {1, 2}, np.array([1, 2]), ("1", 0), (None, [1]),
                    (None, 2j)]:
            out.append(("window", lambda b, bad=bad: b["kw"].update(window=bad)))
    for bad in [0, -1.0, float("nan"), float("inf"), -np.inf, 1e39, 10**400, 1e-45, "1.0", True,
                [1.0], np.ones(2), 1j, {}]:
        out.append(("softcap", lambda b, bad=bad: b["kw"].update(softcap=bad)))
    hq = q.shape[-3]
    for name in ("alibi_slopes", "sinks"):
        bads = [np.ones(hq + 1, np.float32), np.ones((7, hq), np.float32),
                np.ones((hq, 1, 1), np.float32), np.ones(hq, np.int64), np.ones(hq, bool),
                np.ones(hq, np.complex64), np.ones(hq, object), [1] * hq, "abc", {},
                [[1.0], [2.0, 3.0]], np.ma.masked_array(np.ones(hq))]
        if name == "alibi_slopes":
            bads += [np.full(hq, np.nan), np.full(hq, np.inf), np.full(hq, -np.inf),
                     np.full(hq, 1e300)]
        for bad in bads:
            out.append((name, lambda b, name=name, bad=bad: b["kw"].update({name: bad})))
    for bad in [(np.zeros(L, np.float32), np.zeros(S, np.int64)),
                (np.zeros(L, np.int64), np.zeros(S, bool)),
                (np.zeros(L + 1, np.int64), np.zeros(S, np.int64)),
                (np.zeros(L, np.int64), np.zeros(S + 1, np.int64)),
                (np.zeros((7, L), np.int64), np.zeros(S, np.int64)),
                (np.zeros(L, np.int64), np.zeros(S, np.int64), np.zeros(S, np.int64)),
                (np.zeros(L, np.int64),), np.zeros(L + S + 1, np.int64), "ab", {},
                np.zeros(L, object), (np.zeros(L, "U1"), np.zeros(S, np.int64)),
                (None, np.zeros(S, np.int64))]:
        out.append(("segment_ids", lambda b, bad=bad: b["kw"].update(segment_ids=bad)))
    if b["fn"] == "sliding":
        for bad in [0, -1, -2**70, True, False, 1.5, 2.0, "3", None, (2, 0), np.array(3.0)]:
            out.append(("window_size", lambda b, bad=bad: b.update(window_size=bad)))
        out.append(("window", lambda b: b["kw"].update(window=(1, 0))))
    if b["fn"] == "causal":
        out.append(("is_causal", lambda b: b["kw"].update(is_causal=True)))
    if b["fn"] == "weights":
        out.append(("out", lambda b: b["kw"].update(out=np.zeros(_attn_result_shape(b), np.float32))))
    else:
        inputs = {"q": q, "k": k, "v": v}
        mask = b["kw"].get("attn_mask")
        if isinstance(mask, np.ndarray):
            inputs["attn_mask"] = mask
        out.extend(_out_breaks(rng, _attn_result_shape(b), inputs))
    out.append(("unexpected|argument|keyword", lambda b: b["kw"].update(bogus=1)))
    return out


def _call_attn(b):
    kw = dict(b["kw"])
    if "out" in b:
        kw["out"] = b["out"]
    args = [b["q"], b["k"]]
    if b["fn"] == "weights":
        return fastattn.attention_weights(*args, **kw)
    args.append(b["v"])
    if b["fn"] == "sliding":
        return fastattn.sliding_window_attention(*args, b["window_size"], **kw)
    if b["fn"] == "causal":
        return fastattn.causal_attention(*args, **kw)
    return fastattn.scaled_dot_product_attention(*args, **kw)


# -------------------------------------------------------- varlen_attention

def _varlen_base(rng):
    B = int(rng.integers(1, 4))
    lens_q, lens_k = rng.integers(0, 5, B), rng.integers(0, 5, B)
    hkv = int(rng.integers(1, 3))
    hq = hkv * int(rng.integers(1, 3))
    D, Dv = (int(n) for n in rng.integers(1, 5, 2))
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_k = np.concatenate([[0], np.cumsum(lens_k)])
    b = {"fn": "varlen", "q": _f32(rng, int(cu_q[-1]), hq, D), "k": _f32(rng, int(cu_k[-1]), hkv, D),
         "v": _f32(rng, int(cu_k[-1]), hkv, Dv), "cu_q": cu_q, "cu_k": cu_k, "kw": {}}
    if rng.integers(0, 2):
        b["kw"]["is_causal"] = True
    if rng.integers(0, 3) == 0:
        b["kw"]["softcap"] = 3.0
    if rng.integers(0, 3) == 0:
        b["kw"]["sinks"] = _f32(rng, B, hq)
    if rng.integers(0, 3) == 0:
        b["kw"]["alibi_slopes"] = _f32(rng, hq)
    return b


def _varlen_result_shape(b):
    return (b["q"].shape[0], b["q"].shape[1], b["v"].shape[2])


def _varlen_breaks(rng, b):
    q, k, v, cu_q, cu_k = b["q"], b["k"], b["v"], b["cu_q"], b["cu_k"]
    out = []
    for name in ("q", "k", "v"):
        a = b[name]
        for how in ARRAY_BREAKS + ["none"]:
            out.append((name, lambda b, name=name, a=a, how=how: b.update({name: _bad_array(rng, a, how)})))
        out.append((name, lambda b, name=name, a=a: b.update({name: a[:, 0]})))
        out.append((name, lambda b, name=name, a=a: b.update({name: a[None]})))
    out.append(("k", lambda b: b.update(k=_f32(rng, k.shape[0], k.shape[1], q.shape[2] + 1))))
    out.append(("v", lambda b: b.update(v=_f32(rng, v.shape[0] + 1, *v.shape[1:]))))
    out.append(("q|k", lambda b: b.update(k=_f32(rng, k.shape[0], q.shape[1] + 1, q.shape[2]),
                                          v=_f32(rng, k.shape[0], q.shape[1] + 1, v.shape[2]))))
    for key, cu, total in (("cu_q", cu_q, q.shape[0]), ("cu_k", cu_k, k.shape[0])):
        name = "cu_seqlens_q" if key == "cu_q" else "cu_seqlens_k"
        for bad in [cu.astype(np.float64), cu.astype(bool), cu[None], cu[:0], cu + 1,
                    np.concatenate([cu, [total + 1]]), np.concatenate([cu, [total - 1]]),
                    np.concatenate([cu[:1], [total + 1], cu[1:]]), "abc", {}, None,
                    np.ma.masked_array(cu), [[0, 1], [2]], np.array(total)]:
            out.append((name, lambda b, key=key, bad=bad: b.update({key: bad})))
    out.append(("cu_seqlens_q|cu_seqlens_k",
                lambda b: b.update(cu_q=np.concatenate([cu_q, [q.shape[0]]]))))
    for bad in [0, -1.0, float("nan"), "1", 1e39]:
        out.append(("softcap", lambda b, bad=bad: b["kw"].update(softcap=bad)))
    B, hq = len(cu_q) - 1, q.shape[1]
    for name in ("alibi_slopes", "sinks"):
        for bad in [np.ones(hq + 1, np.float32), np.ones((B + 1, hq), np.float32),
                    np.ones(hq, np.int64), "x", np.ones(hq, np.complex64)]:
            out.append((name, lambda b, name=name, bad=bad: b["kw"].update({name: bad})))
    out.append(("alibi_slopes", lambda b: b["kw"].update(alibi_slopes=np.full(hq, np.inf))))
    for bad in [(-1, 0), 3, "ab"]:
        out.append(("window", lambda b, bad=bad: b["kw"].update(window=bad)))
    for bad in [np.nan, "0.5", 1j]:
        out.append(("scale", lambda b, bad=bad: b["kw"].update(scale=bad)))
    for bad in [1, None, "yes"]:
        out.append(("is_causal", lambda b, bad=bad: b["kw"].update(is_causal=bad)))
        out.append(("return_lse", lambda b, bad=bad: b["kw"].update(return_lse=bad)))
    out.extend(_out_breaks(rng, _varlen_result_shape(b), {"q": q, "k": k, "v": v}))
    out.append(("unexpected|argument|keyword", lambda b: b["kw"].update(bogus=1)))
    return out


def _call_varlen(b):
    kw = dict(b["kw"])
    if "out" in b:
        kw["out"] = b["out"]
    return fastattn.varlen_attention(b["q"], b["k"], b["v"], b["cu_q"], b["cu_k"], **kw)


# -------------------------------------------------------- out=

def _out_breaks(rng, shape, inputs):
    """Ways to get `out` wrong for a result of `shape` (written into b["out"])."""
    size = int(np.prod(shape))
    out = []
    for dt in [np.float64, np.float16, np.int32, np.complex64, object]:
        out.append(("out", lambda b, dt=dt: b.update(out=np.zeros(shape, dt))))
    out.append(("out", lambda b: b.update(out=np.zeros(shape, np.float32).tolist())))
    out.append(("out", lambda b: b.update(out=np.zeros(shape + (1,), np.float32))))
    out.append(("out", lambda b: b.update(out=np.zeros((size + 1,), np.float32))))
    out.append(("out", lambda b: b.update(out=np.zeros(shape, np.float32)[..., None, :]
                                          if shape else np.zeros((1,), np.float32))))
    if len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1 and size > 0:  # (empty: C-contiguous too)
        out.append(("out", lambda b: b.update(out=np.zeros(shape, np.float32, order="F"))))
    if size > 1 and shape:
        def strided(b):
            big = np.zeros(shape[:-1] + (2 * shape[-1],), np.float32)
            b["out"] = big[..., ::2]
        out.append(("out", strided))

    def read_only(b):
        o = np.zeros(shape, np.float32)
        o.setflags(write=False)
        b["out"] = o
    out.append(("out", read_only))
    for name, arr in inputs.items():
        if arr.dtype == np.float32 and arr.size >= size and size > 0:
            out.append(("out", lambda b, arr=arr: b.update(out=arr.reshape(-1)[:size].reshape(shape))))
    return out


# -------------------------------------------------------- the driver

ACCEPTED = (TypeError, ValueError, AxisError)


def _check_one(call, b, name):
    """Call; it must raise an accepted error naming `name` and leave out alone."""
    out = b.get("out")
    snapshot = None
    if isinstance(out, np.ndarray) and out.dtype != object:
        snapshot = out.tobytes()
    try:
        call(b)
    except ACCEPTED as exc:
        msg = str(exc)
        if not re.search(r"\b(" + name + r")\b", msg):
            return f"{type(exc).__name__} not naming {name!r}: {msg[:200]}"
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
        return f"{type(exc).__name__} (not TypeError/ValueError/AxisError): {str(exc)[:200]}"
    else:
        return "no error raised"
    if snapshot is not None and out.tobytes() != snapshot:
        return "out was written before the error"
    return None


def _sentinel_out(rng, b, shape):
    """A valid out filled with a recognisable pattern."""
    o = np.full(shape, 123.25, np.float32)
    b["out"] = o


def _run(make_base, make_breaks, call, result_shape, seed):
    rng = np.random.default_rng(seed)
    failures, ncalls = [], 0
    for _ in range(N_BASES):
        base = make_base(rng)
        breaks = make_breaks(rng, base)
        for name, change in breaks:
            b = {**base, "kw": dict(base.get("kw", {}))}
            if rng.integers(0, 2) and name != "out":
                _sentinel_out(rng, b, result_shape(base))
                if b["fn"] == "weights":
                    del b["out"]
            change(b)
            ncalls += 1
            err = _check_one(call, b, name)
            if err:
                failures.append((base["fn"], name, err, repr(b)[:300]))
    for _ in range(N_PAIRS):
        base = make_base(rng)
        breaks = make_breaks(rng, base)
        i, j = rng.choice(len(breaks), 2, replace=False)
        b = {**base, "kw": dict(base.get("kw", {}))}
        names = set()
        for idx in (i, j):
            name, change = breaks[idx]
            change(b)
            names.add(name)
        ncalls += 1
        err = _check_one(call, b, "|".join(names))
        if err:
            failures.append((base["fn"], "+".join(sorted(names)), err))
    return failures, ncalls


@pytest.fixture(autouse=True)
def _watchdog():
    faulthandler.dump_traceback_later(300, exit=True)  # a hang fails the run, with a traceback
    yield
    faulthandler.cancel_dump_traceback_later()


def _report(failures, ncalls, minimum):
    assert ncalls >= minimum, ncalls
    unique = sorted(set(failures))
    assert not unique, f"{len(failures)} of {ncalls} malformed calls misbehaved:\n" + "\n".join(
        map(str, unique[:30]))


def test_fuzz_rowwise_functions():
    failures, ncalls = _run(_rowwise_base, _rowwise_breaks, _call_rowwise, _rowwise_result_shape, 1)
    _report(failures, ncalls, 2000)


def test_fuzz_attention_functions():
    failures, ncalls = _run(_attn_base, _attn_breaks, _call_attn, _attn_result_shape, 2)
    _report(failures, ncalls, 5000)


def test_fuzz_varlen_attention():
    failures, ncalls = _run(_varlen_base, _varlen_breaks, _call_varlen, _varlen_result_shape, 3)
    _report(failures, ncalls, 5000)


def test_fuzz_set_num_threads():
    bad = [0, -1, -2**63, 4097, 2**70, 1.5, 2.0, "2", True, False, np.float32(2), [2], (2,), b"2"]
    failures = []
    try:
        for n in bad:
            err = _check_one(lambda b: fastattn.set_num_threads(b["n"]), {"n": n}, "n")
            if err:
                failures.append((n, err))
        assert fastattn.get_num_threads() >= 1
    finally:
        fastattn.set_num_threads(None)
    assert not failures, failures
