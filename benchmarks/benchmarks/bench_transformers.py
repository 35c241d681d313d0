"""Hugging Face transformers with ``attn_implementation="fastattn"`` against
``"sdpa"`` (PyTorch's own attention): a decoder of SmolLM2-135M's shape
(Llama: 30 layers, width 576, 9 query heads over 3 kv heads of 64, float32)
with random weights, so that no model file is needed, on 2 threads: the
prefill of 4096 tokens, then 32 greedy decoding steps against that KV cache.
Random weights cost what trained ones cost."""
import time

import fastattn

from .common import torch_or_skip

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, rope_theta=100000.0,
                    tie_word_embeddings=True)
PROMPT, NEW = 4096, 32


def prefill_and_decode(model, ids, new):
    """(seconds of the prefill of `ids`, seconds of `new` greedy steps after it)."""
    import torch

    with torch.inference_mode():
        start = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill = time.perf_counter() - start
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(new):
            out = model(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return prefill, time.perf_counter() - start


class TransformersSmolLM2Shape:
    """Tokens per second of the decode and seconds of the prefill."""

    params = (["fastattn", "sdpa"],)
    param_names = ["attn_implementation"]
    timeout = 900
    number = 1
    repeat = 1

    def setup(self, impl):
        torch = torch_or_skip()
        try:
            from transformers import LlamaConfig, LlamaForCausalLM

            import fastattn.transformers  # noqa: F401  (registers "fastattn")
        except ImportError:
            raise NotImplementedError("transformers is not installed") from None
        torch.manual_seed(0)
        torch.set_num_threads(2)
        fastattn.set_num_threads(2)
        self.model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).eval()
        self.model.set_attn_implementation(impl)
        self.ids = torch.randint(0, SMOLLM2_135M["vocab_size"], (1, PROMPT))
        prefill_and_decode(self.model, self.ids[:, :64], 2)  # warm up
        self.times = prefill_and_decode(self.model, self.ids, NEW)

    def track_decode_tokens_per_second(self, impl):
        return NEW / self.times[1]

    track_decode_tokens_per_second.unit = "tokens/s"

    def track_prefill_seconds(self, impl):
        return self.times[0]

    track_prefill_seconds.unit = "seconds"
