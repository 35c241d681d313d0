"""How a quantized KV cache changes SmolLM2's greedy text (examples/smollm2.py).

For each prompt, greedy decoding with a float32 cache and with each other
cache (float16, q8_0, q4_0: the rows are rounded or quantized as they are
written; fastattn's attention is then exact to those values), and per cache:

- agree: the new tokens equal to the float32 cache's at the same position
  (a fraction of all);
- prefix: new tokens before the first one that differs (the text after that
  follows a different history, so later positions are not comparable);
- the cache's bytes per position.

    python tools/kv_cache_agreement.py [--tokens 32] [--caches float16 q8_0 q4_0]
"""
import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("smollm2", ROOT / "examples" / "smollm2.py")
smollm2 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(smollm2)

#: Short prompts with one well-known continuation each, chat-formatted.
PROMPTS = [
    "What is the capital of France?",
    "Name the three primary colors.",
    "What is 7 times 8?",
    "Who wrote Romeo and Juliet?",
    "What gas do plants take in from the air?",
    "How many days are there in a leap year?",
    "What is the boiling point of water in Celsius?",
    "Translate 'thank you' into Spanish.",
    "What is the largest planet in the solar system?",
    "Write one sentence about the sea.",
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="new tokens a prompt")
    parser.add_argument("--caches", nargs="+", default=["float16", "q8_0", "q4_0"],
                        choices=["float16", "bfloat16", "q8_0", "q4_0"])
    args = parser.parse_args(argv)
    model = smollm2.load_model()
    c = model.config
    rows = {name: [0, 0, 0] for name in args.caches}  # agree, total, prefix sum
    for prompt in PROMPTS:
        ids = smollm2.encode(model, smollm2.chat_prompt(model, prompt))
        ref = smollm2.generate(model, ids, args.tokens, stop_at_eos=False)[len(ids):]
        print(f"{prompt!r}\n  float32: {smollm2.decode(model, ref)!r}")
        for name in args.caches:
            got = smollm2.generate(model, ids, args.tokens, stop_at_eos=False,
                                   kv_dtype=name)[len(ids):]
            same = [a == b for a, b in zip(got, ref)]
            prefix = same.index(False) if False in same else len(same)
            rows[name][0] += sum(same)
            rows[name][1] += len(same)
            rows[name][2] += prefix
            print(f"  {name:>7}: {smollm2.decode(model, got)!r}  (prefix {prefix})")
    print(f"\n{model.name}, {len(PROMPTS)} prompts x {args.tokens} greedy tokens "
          f"({c.n_layers} layers, {c.n_kv_heads} kv heads x {c.head_dim})")
    print(f"{'cache':<9}{'agree':>8}{'mean prefix':>13}{'bytes/position':>16}")
    f32 = smollm2.KVCache(c, 1).nbytes
    print(f"{'float32':<9}{'100.0%':>8}{args.tokens:>13.1f}{f32:>16}")
    for name, (agree, total, prefix) in rows.items():
        nbytes = smollm2.KVCache(c, 1, dtype=name).nbytes
        print(f"{name:<9}{100 * agree / total:>7.1f}%{prefix / len(PROMPTS):>13.1f}"
              f"{nbytes:>16} ({nbytes / f32:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
