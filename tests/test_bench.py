"""`python -m fastattn bench`: the timing command and its helpers.

`--models` and its peers: each peer computes the same attention as fastattn
on the cases it expresses (else the ratios would compare different work);
the timing rules (ratios as medians of per-round ratios, a minimum time);
the options grid, half-precision and (B, L, H, D) layouts; counts and shapes
it refuses with a usage error (exit status 2) rather than ignoring them or
failing later; and the timing tools of tools/ that include the kernels'
sources, which must keep up with them.
"""
import os
import subprocess
import threading

import numpy as np
import pytest

import fastattn
from fastattn._bench import (MODEL_CASES, PinnedThreads, Problem, as_bhld, check_peer, geomean,
                             time_problem, vs_faster_peer)

from conftest import ROOT, ml_dtypes

SMALL = [Problem(2, 4, 4, 5, 9, 8, padding=True), Problem(1, 4, 4, 6, 6, 8, causal=True),
         Problem(2, 6, 2, 1, 33, 16), Problem(1, 6, 3, 4, 20, 8, causal=True),
         Problem(1, 2, 2, 1, 40, 8)]


PEER_MODULES = {"torch": ("torch",), "onnxruntime": ("onnxruntime", "onnx"),
                "openvino": ("openvino",), "jax": ("jax",)}


@pytest.mark.parametrize("impl", ["reference", "torch", "onnxruntime", "openvino", "jax"])
@pytest.mark.parametrize("prob", SMALL + [Problem(2, 4, 4, 6, 9, 8, causal=True, padding=True),
                                          Problem(2, 6, 3, 3, 9, 8, padding=True)],
                         ids=lambda p: p.label())
def test_peers_compute_what_fastattn_computes(impl, prob):
    for module in PEER_MODULES.get(impl, ()):
        pytest.importorskip(module)
    r = prob.runner(impl, 1)
    if r is None:
        # (torch and ORT: no causal with a padding mask; ORT: no padding with grouped heads)
        assert (impl in ("torch", "onnxruntime") and prob.causal and prob.padding
                or impl == "onnxruntime" and (prob.gqa and prob.padding
                                              or not prob.gqa and prob.causal))
        pytest.skip("not expressible by this peer")
    q, k, v, mask = prob.inputs()
    want = fastattn.scaled_dot_product_attention(q, k, v, mask, is_causal=prob.causal,
                                                 enable_gqa=prob.gqa)
    got = as_bhld(impl, r[0](), prob)
    want = want[:got.shape[0], :got.shape[1]]  # (the reference may run on a slice of the heads)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if impl != "reference":
        check_peer(impl, r[0](), want, prob)  # (what the bench checks before timing)


def test_onnxruntime_softmax_computes_fastattn_softmax():
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from fastattn._bench import onnxruntime_softmax

    x = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32) * 30
    want = fastattn.softmax(x)
    np.testing.assert_allclose(onnxruntime_softmax(x, 1)(), want, rtol=1e-5, atol=1e-7)
    out = np.zeros_like(x)
    assert onnxruntime_softmax(x, 1, out)() is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)


def test_a_peer_that_computes_something_else_is_refused():
    prob = Problem(1, 2, 2, 3, 5, 8, causal=True)
    q, k, v, _ = prob.inputs()
    causal = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    full = fastattn.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError, match="torch does not compute fastattn's result"):
        check_peer("torch", full, causal, prob)


def test_the_bench_times_no_peer_that_disagrees_or_fails(monkeypatch, capsys):
    prob = Problem(1, 2, 2, 3, 5, 8)
    q, k, v, _ = prob.inputs()
    real = Problem.runner

    def runner(self, impl, threads, seed=0):
        if impl == "torch":  # the causal result for a full-attention case
            return (lambda: fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)), 1.0
        if impl == "jax":
            def fails():
                raise RuntimeError("no kernel for this shape")
            return fails, 1.0
        if impl == "openvino":  # (its setup refuses: fewer cores than threads)
            raise RuntimeError("openvino runs 1 threads, not 2")
        return real(self, impl, threads, seed)

    monkeypatch.setattr(Problem, "runner", runner)
    times = time_problem(prob, impls=("fastattn", "torch", "jax", "openvino"), threads=1,
                         repeat=1)
    assert times["fastattn"] > 0
    assert times["torch"] is None and times["jax"] is None and times["openvino"] is None
    err = capsys.readouterr().err
    assert "torch not timed on (1, 2, 3, 5, 8): RuntimeError: torch does not compute" in err
    assert "jax not timed on (1, 2, 3, 5, 8): RuntimeError: no kernel for this shape" in err
    assert "openvino not timed on (1, 2, 3, 5, 8): RuntimeError: openvino runs 1" in err


def test_the_bench_times_the_implementations_in_sweeps(monkeypatch):
    # Each implementation is warmed up once, then timed once a sweep, in turn
    # within the sweep (a slow phase of the host falls on one sweep of each,
    # not on all of one library's calls); each keeps its best over the sweeps.
    from fastattn import _bench

    prob = Problem(1, 2, 2, 3, 5, 8)
    q, k, v, _ = prob.inputs()
    calls = []  # every call of an implementation, in order
    turns = []  # the timed turns: (implementation, no warm-up call)
    # each sweep's time of each (torch's first sweep slow, fastattn's last)
    scripted = {"fastattn": [0.02, 0.03, 0.05], "torch": [0.09, 0.04, 0.06]}

    def runner(self, impl, threads, seed=0):
        def fn():
            calls.append(impl)
            return fastattn.scaled_dot_product_attention(q, k, v)
        return fn, 1.0

    def best_time(fn, repeat, min_time=0.0, warm_up=True):
        fn()
        impl = calls[-1]
        turns.append((impl, not warm_up))
        return scripted[impl][sum(1 for t in turns if t[0] == impl) - 1]

    monkeypatch.setattr(Problem, "runner", runner)
    monkeypatch.setattr(_bench, "best_time", best_time)
    monkeypatch.setattr(_bench.time, "sleep", lambda s: None)  # (the settling pauses)
    times = time_problem(prob, impls=("fastattn", "torch"), threads=1, repeat=3)
    # fastattn's warm-up; torch's call checked against fastattn's result, its warm-up
    assert calls[:3] == ["fastattn", "torch", "torch"]
    assert turns == [("fastattn", True), ("torch", True)] * 3
    assert times == {"fastattn": 0.02, "torch": 0.04}


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a process that may run on 2 cores or more")
def test_pinned_threads_pin_every_thread_and_give_the_cores_back():
    before = os.sched_getaffinity(0)
    started = threading.Event()
    stop = threading.Event()

    def worker():
        started.set()
        stop.wait(10)

    with PinnedThreads(1) as pin:
        assert pin.pinned
        t = threading.Thread(target=worker)  # started inside: inherits the one core
        t.start()
        started.wait(10)
        pin.check()
        assert len(os.sched_getaffinity(t.native_id)) == 1
        assert len(os.sched_getaffinity(0)) == 1
    assert os.sched_getaffinity(0) == before
    assert os.sched_getaffinity(t.native_id) == before  # (restored too)
    stop.set()
    t.join()
    with PinnedThreads(len(before)) as pin:  # no more cores than the process has: no-op
        assert not pin.pinned


def test_reference_slices_big_cases():
    prob = dict(MODEL_CASES)["D = 96"]
    fn, factor = prob.runner("reference", 1)
    assert factor == 8.0  # 4 of 32 heads: 4 * 2048 * 2048 = 2**24 scores


def test_flops_and_ratios():
    assert Problem(1, 1, 1, 4, 4, 8).flops() == 4 * 16 * 8
    assert Problem(1, 1, 1, 2, 3, 1, causal=True).flops() == 4 * (2 + 3)  # rows see 2, 3 keys
    assert vs_faster_peer({"fastattn": 2.0, "torch": 4.0, "onnxruntime": 3.0}) == \
        (1.5, "onnxruntime")
    assert vs_faster_peer({"fastattn": 2.0, "torch": None, "onnxruntime": None}) == (None, None)
    assert geomean([2.0, 8.0, None]) == pytest.approx(4.0)


def test_bench_models_prints_the_grid(capsys):
    from fastattn.__main__ import main

    assert main(["bench", "--models", "--case", "tiny call", "--repeat", "1"]) == 0
    text = capsys.readouterr().out
    assert "tiny call" in text and "(1, 1, 4, 4, 8)" in text
    assert "first call in a fresh process" in text
    assert main(["bench", "--models", "-L", "8"]) == 2


def test_extra_peak_sees_a_temporary_in_a_child_of_a_larger_process():
    # the peak-memory figures (and the working-memory tests) rest on this:
    # 64 MiB touched and freed inside the call counts, 8 MiB freed before
    # does not, in a child started while its parent holds more than both.
    import subprocess
    import sys

    import numpy as np

    script = ("import numpy as np\n"
              "from fastattn._bench import extra_peak_kib\n"
              "np.ones(2**21, np.float32)\n"
              "print(extra_peak_kib(lambda: np.ones(2**24, np.float32).sum()),"
              " extra_peak_kib(lambda: None))\n")
    parent = np.ones(2**26, np.float32)  # 256 MiB resident in this process
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert parent[-1] == 1 and res.returncode == 0, res.stderr
    temporary, nothing = (int(x) / 1024 for x in res.stdout.split())
    assert 60 < temporary < 72 and nothing < 2, res.stdout


def test_fma_peak_is_positive_or_absent():
    from fastattn import _core

    for lanes in (8, 16):
        g = _core.fma_peak(lanes, 1, 1000)
        assert g is None or g > 0
    assert _core.fma_peak(4, 1, 1000) is None


def _build_tool(tmp_path, name, flags=()):
    """tools/<name>.c built with gcc into tmp_path (skips where it cannot be)."""
    import platform
    import shutil

    src = ROOT / "tools" / f"{name}.c"
    gcc = shutil.which("gcc")
    if gcc is None or not src.exists() or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs gcc, an x86-64 CPU and the source tree")
    exe = tmp_path / name
    subprocess.run([gcc, "-O2", "-fopenmp", "-std=gnu11", "-I", str(ROOT / "csrc"), *flags,
                    str(src), "-o", str(exe), "-lm"], check=True)
    return exe


@pytest.mark.parametrize("variant", ["avx512", "avx2"])
def test_loop_ceiling_tool_builds_and_runs(tmp_path, variant):
    # tools/loop_ceiling.c includes the kernels' sources: it must keep up with
    # their signatures.
    exe = _build_tool(tmp_path, "loop_ceiling", ["-DCEILING_AVX2"] if variant == "avx2" else [])
    out = subprocess.run([str(exe), "32", "20", "3"], check=True, capture_output=True,
                         text=True).stdout
    assert "lacks" in out or ("of the peak (the ceiling of these loops)" in out
                              and "D = 32" in out and "a walk of 3 tiles" in out), out
    bad = subprocess.run([str(exe), "20"], capture_output=True, text=True)
    assert bad.returncode == 2 and "multiple of 16" in bad.stderr


@pytest.mark.parametrize("variant", ["avx512", "avx2"])
def test_decode_ceiling_tool_builds_and_runs(tmp_path, variant):
    # tools/decode_ceiling.c includes the AVX-512 (or AVX2) kernels' sources:
    # it must keep up with the few-rows kernels' signatures.
    exe = _build_tool(tmp_path, "decode_ceiling", ["-DCEILING_AVX2"] if variant == "avx2" else [])
    for D, rows in (("40", "3"), ("64", "1")):  # (64: contiguous rows of a constant length)
        out = subprocess.run([str(exe), D, rows, "128", "2"], check=True, capture_output=True,
                             text=True).stdout
        assert "lacks" in out or (f"{rows} query rows, 128 keys" in out and f"D = {D}" in out
                                  and all(f"{dt} " in out for dt in ("float32", "float16",
                                                                     "bfloat16"))), out
    bad = subprocess.run([str(exe), "128", "9"], capture_output=True, text=True)
    assert bad.returncode == 2 and "ROWS: 1 to 8" in bad.stderr


def test_long_grid_rows_and_peak_fraction(monkeypatch, capsys):
    # The grid's bookkeeping with stand-in timings (the real one takes minutes).
    import fastattn._bench as bench

    monkeypatch.setattr(bench, "time_problem", lambda p, impls=None, threads=2, repeat=3:
                        {"fastattn": 1.0, "torch": 1.1, "onnxruntime": 0.9})
    monkeypatch.setattr(bench, "best_time", lambda fn, repeat: 0.5)
    monkeypatch.setattr(bench, "fma_peaks", lambda threads: {"AVX2": 100.0, "AVX-512": 200.0})
    monkeypatch.setattr(bench, "_randn",
                        lambda shape, seed: np.zeros([min(s, 4) for s in shape], np.float32))
    rows = {r[0]: r for r in bench.grid(repeat=1, memory=False)}
    rate = 4 * 8 * 4096 * 4096 * 128 / 1e9  # GFLOP per second of the stand-in 1 s
    assert rows["SDPA L=S=4096 D=128 / AVX2 FMA peak"][1].endswith(f"= {rate / 100:.0%}")
    assert rows["SDPA L=S=4096 D=128 / AVX-512 FMA peak"][1].endswith(f"= {rate / 200:.0%}")
    assert rows["SDPA H=8 D=64 L=S=1024 vs faster peer"][1] == "1000 ms, 0.90x onnxruntime"
    assert rows["SDPA grid: geometric mean vs faster peer"][3] == "NO"
    assert "AVX-512 200.0 GFLOP/s" in capsys.readouterr().out


def test_best_time_runs_until_min_time_or_a_cap():
    import fastattn._bench as bench

    calls = []
    assert bench.best_time(lambda: calls.append(1), 2) >= 0.0
    assert len(calls) == 3  # a warm-up and the two runs asked for
    calls.clear()
    bench.best_time(lambda: calls.append(1), 2, min_time=3600.0)
    assert len(calls) == 1001  # never reaches an hour: capped at 1000 runs


def test_bench_kv_dtype_and_layout_options(capsys):
    from fastattn.__main__ import main
    for kv in ["float16"] + (["bfloat16"] if ml_dtypes is not None else []):
        assert main(["bench", "-H", "4", "--kv-heads", "2", "-L", "1", "-S", "64", "-D", "8",
                     "--repeat", "1", "--no-torch", "--kv-dtype", kv, "--layout", "blhd"]) == 0
        out = capsys.readouterr().out
        assert f"sdpa B=1 H=4/2 L=1 S=64 D=8 kv={kv} blhd" in out and "f32/fa" in out


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


def test_bench_ratios_are_medians_of_per_round_ratios(monkeypatch):
    # a fake clock: the second call takes twice the first, the host's speed
    # changes in steps between rounds; each round's ratio stays 2
    import fastattn._bench as bench
    clock = [0.0]
    speed = iter([1.0] * 2 + [3.0] * 6 + [1.5] * 6 + [1.0] * 6)
    order = []

    def call(n, cost):
        def run():
            order.append(n)
            clock[0] += cost * next(speed)
        return run
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    times, ratios = bench.ratios_alternated([call(0, 1.0), call(1, 2.0)], 9)
    assert ratios == [1.0, 2.0]
    assert times[0] == np.median([3.0] * 3 + [1.5] * 3 + [1.0] * 3)
    assert order[2:6] == [0, 1, 1, 0]  # (after the warm-up round, the first rotates)


def test_bench_options_prints_every_row(capsys):
    import fastattn._bench as bench
    rows = bench.options_grid(repeat=1, L=64, heads=2, D=8)
    assert [name.split(",")[0].split(" (")[0] for name, _, _ in rows][:4] == [
        "causal", "softcap=30", "alibi_slopes", "sinks"]
    assert len(rows) == 12 and all(t > 0 and r > 0 for _, t, r in rows)
    assert [name.split(":")[0] for name, _, _ in rows].count("floor") == 2
    assert "medians of 7 rounds" in capsys.readouterr().out
