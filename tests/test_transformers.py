"""fastattn.transformers: attn_implementation="fastattn" in Hugging Face transformers.

Tiny models with random weights, built from their config classes (nothing is
downloaded): Llama, Qwen2, Mistral (sliding window), Gemma 2 (soft cap and
alternating sliding windows), gpt-oss (sinks, alternating windows) and BERT
(an encoder). With "fastattn" each gives the logits of transformers' own
"eager" attention within float32 rounding (TOL) at every position a real
token holds, the same greedy tokens from a left-padded batch with a dynamic
and a static KV cache, and the same parameter gradients. The registration of
the mask builder (without which transformers passes no mask and causality is
lost) and the refusal of dropout in training are tested, and so are the
cheaper forms the attention gives transformers' masks. Skipped without
PyTorch or transformers.
"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", minversion="5")

import fastattn.torch  # noqa: E402
import fastattn.transformers as ftr  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

# Two float32 computations of a 2-layer model whose logits are of order 1-10:
# they agree to a few float32 ulps (measured: below 1e-6); the bound leaves
# room for other SIMD paths and thread counts.
TOL = dict(atol=1e-5, rtol=1e-5)
GRAD_TOL = dict(atol=1e-5, rtol=1e-4)  # gradients: sums over the batch and the positions

# Small enough to be quick, with weights large enough (initializer_range) that
# the attention is far from uniform, so that a wrong mask, window, soft cap or
# sink changes the logits.
COMMON = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              initializer_range=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=99)


def _llama():
    return transformers.LlamaConfig(**COMMON), transformers.LlamaForCausalLM


def _qwen2():
    return transformers.Qwen2Config(**COMMON), transformers.Qwen2ForCausalLM


def _mistral():
    return transformers.MistralConfig(sliding_window=4, **COMMON), transformers.MistralForCausalLM


def _gemma2():
    # layer 0 slides over 4 tokens, layer 1 sees all; scores capped at 1.5
    config = transformers.Gemma2Config(head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                                       attn_logit_softcapping=1.5, final_logit_softcapping=None,
                                       **COMMON)
    return config, transformers.Gemma2ForCausalLM


def _gpt_oss():
    config = transformers.GptOssConfig(head_dim=8, sliding_window=4, num_local_experts=2,
                                       num_experts_per_tok=1, **COMMON)
    return config, transformers.GptOssForCausalLM


def _bert():
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     max_position_embeddings=64, initializer_range=0.3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     pad_token_id=0)
    return config, transformers.BertForMaskedLM


DECODERS = {"llama": _llama, "qwen2": _qwen2, "mistral": _mistral, "gemma2": _gemma2,
            "gpt_oss": _gpt_oss}
MODELS = {**DECODERS, "bert": _bert}


def build(name, attn="eager"):
    config, cls = MODELS[name]()
    config._attn_implementation = attn
    torch.manual_seed(0)
    model = cls(config).eval()
    if name == "gpt_oss":  # sinks of the order of the scores, so that they matter
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    return model


def batch(padding_side="left", B=3, T=11):
    """Token ids (B, T) and their attention mask: row 0 unpadded, the others
    padded by 3 and 6 tokens on `padding_side`."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 99, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    for b, pad in ((1, 3), (2, 6)):
        if padding_side == "left":
            mask[b, :pad] = 0
        else:
            mask[b, T - pad:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


# ---- registration

def test_both_interfaces_hold_fastattn():
    assert AttentionInterface._global_mapping["fastattn"] is ftr.attention_forward
    assert AttentionMaskInterface._global_mapping["fastattn"] is ftr.create_mask
    assert "fastattn" in transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS.valid_keys()


def test_register_is_idempotent_and_restores():
    AttentionMaskInterface.register("fastattn", lambda *a, **k: None)
    try:
        ids, mask = batch()
        model = build("llama")
        assert not torch.allclose(logits(model, "fastattn", ids, mask),
                                  logits(model, "eager", ids, mask), **TOL)
    finally:
        ftr.register()
    ftr.register()
    assert AttentionMaskInterface._global_mapping["fastattn"] is ftr.create_mask
    assert AttentionInterface._global_mapping["fastattn"] is ftr.attention_forward


def test_without_the_mask_builder_causality_is_lost():
    """The fault the second registration prevents: an attention function
    registered alone gets attention_mask=None, and a padded batch of a causal
    model attends to every key. Registered as "fastattn" it does not."""
    name = "fastattn_without_mask"
    AttentionInterface.register(name, ftr.attention_forward)
    try:
        model = build("llama")
        ids, mask = batch()
        eager = logits(model, "eager", ids, mask)
        real = mask.bool()
        assert not torch.allclose(logits(model, name, ids, mask)[real], eager[real], **TOL)
        torch.testing.assert_close(logits(model, "fastattn", ids, mask)[real], eager[real], **TOL)
    finally:
        del AttentionInterface._global_mapping[name]


# ---- the models against eager attention

@pytest.mark.parametrize("name", sorted(MODELS))
def test_logits_match_eager(name):
    model = build(name)
    side = "right" if name == "bert" else "left"
    ids, mask = batch(side)
    eager = logits(model, "eager", ids, mask)
    ours = logits(model, "fastattn", ids, mask)
    real = mask.bool()
    torch.testing.assert_close(ours[real], eager[real], **TOL)
    # Positions of padding: no NaN. A left-padding query that may attend to no
    # key gets zeros from fastattn (as from sdpa), the mean of the values from
    # eager: its logits differ, and nothing else reads them.
    assert torch.isfinite(ours).all()
    # without padding, every position
    ids, mask = ids[:1], mask[:1]
    torch.testing.assert_close(logits(model, "fastattn", ids, mask),
                               logits(model, "eager", ids, mask), **TOL)


def test_padding_rows_match_sdpa():
    """Left-padding rows (no allowed key) give what PyTorch's SDPA gives."""
    model = build("llama")
    ids, mask = batch()
    torch.testing.assert_close(logits(model, "fastattn", ids, mask),
                               logits(model, "sdpa", ids, mask), **TOL)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", sorted(DECODERS))
def test_greedy_generation_matches_eager(name, cache):
    model = build(name)
    ids, mask = batch("left")
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    if cache == "static":
        kw["cache_implementation"] = "static"
    out = {}
    for impl in ("eager", "fastattn"):
        model.set_attn_implementation(impl)
        out[impl] = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert out["fastattn"].shape == (3, ids.shape[1] + 8)
    assert out["fastattn"].tolist() == out["eager"].tolist()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_match_eager(name):
    """Parameter gradients of a language-model loss in training mode
    (attention dropout 0). The labels are -100 at the padding and, with left
    padding, at the first token, which a causal model predicts from the last
    padding position: that position's logits differ from eager's (see
    test_logits_match_eager)."""
    side = "right" if name == "bert" else "left"
    ids, mask = batch(side)
    labels = ids.masked_fill(mask == 0, -100)
    if side == "left":
        labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
    grads = {}
    for impl in ("eager", "fastattn"):
        model = build(name, impl).train()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads["fastattn"].keys() == grads["eager"].keys()
    if name == "gpt_oss":
        assert any(n.endswith("sinks") for n in grads["fastattn"])
    for n, g in grads["eager"].items():
        torch.testing.assert_close(grads["fastattn"][n], g, **GRAD_TOL, msg=n)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_from_pretrained_and_set_attn_implementation(name, tmp_path):
    build(name).save_pretrained(tmp_path)
    auto = transformers.AutoModelForMaskedLM if name == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(tmp_path, attn_implementation="fastattn").eval()
    assert model.config._attn_implementation == "fastattn"
    ids, mask = batch("right" if name == "bert" else "left")
    real = mask.bool()
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[real], logits(model, "eager", ids, mask)[real], **TOL)
    model.set_attn_implementation("fastattn")
    assert model.config._attn_implementation == "fastattn"
    encoder = transformers.AutoModel.from_pretrained(tmp_path, attn_implementation="fastattn")
    assert encoder.config._attn_implementation == "fastattn"


# ---- the attention function

class Layer(torch.nn.Module):
    is_causal = True


def qkv(B=2, Hq=4, Hkv=2, L=7, S=7, D=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L, Hq, D, generator=g).to(dtype).transpose(1, 2)  # a model's layout
    k = torch.randn(B, S, Hkv, D, generator=g).to(dtype).transpose(1, 2)
    v = torch.randn(B, S, Hkv, D, generator=g).to(dtype).transpose(1, 2)
    return q, k, v


def dense(q, k, v, mask, **kw):
    """The same attention with the mask as it is."""
    out = fastattn.torch.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True, **kw)
    return out.transpose(1, 2)


def test_dropout_is_refused_in_training():
    q, k, v = qkv()
    layer = Layer().train()
    with pytest.raises(ValueError, match="dropout"):
        ftr.attention_forward(layer, q, k, v, None, dropout=0.1)
    ftr.attention_forward(layer, q, k, v, None, dropout=0.0)
    ftr.attention_forward(layer.eval(), q, k, v, None, dropout=0.1)  # eval: no dropout, as eager
    model = build("bert")
    model.config.attention_probs_dropout_prob = 0.1
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    model.set_attn_implementation("fastattn")
    ids, mask = batch("right")
    with pytest.raises(ValueError, match="dropout"):
        model.train()(input_ids=ids, attention_mask=mask)


def masks(B, L, S, q_offset):
    """Masks as transformers builds them: (kind, bool mask (B, 1, L, S),
    expected keys, window). Query i is at position q_offset + i, key j at j."""
    i = torch.arange(L)[:, None] + q_offset
    j = torch.arange(S)[None, :]
    pad = torch.ones(B, S, dtype=torch.bool)
    pad[1, :3] = False  # left padding of item 1
    used = q_offset + L  # keys past it: a static cache's empty tail
    pad[:, used:] = False
    causal = (j <= i)[None, None]
    window = causal & (j > i - 4)[None, None]
    return [("causal", causal & pad[:, None, None, :], used, (None, 0)),
            ("sliding", window & pad[:, None, None, :], used, (3, 0)),
            ("bidirectional", pad[:, None, None, :].expand(B, 1, L, S), used, None)]


@pytest.mark.parametrize("L, S, q_offset", [(7, 7, 0), (1, 9, 8), (3, 12, 5), (5, 16, 0)])
def test_masks_become_windows_and_key_padding(L, S, q_offset):
    q, k, v = qkv(L=L, S=S)
    for kind, mask, keys, window in masks(2, L, S, q_offset):
        form = ftr._analyse(mask, L, S)
        assert not form.dense, kind
        assert form.keys == keys
        if L == 1 and window is not None:  # one query: no key lies after it
            window = None if window[0] is None else (window[0], None)
        assert form.window == window, kind
        assert form.padding is not None and form.padding.shape == (2, 1, 1, keys)
        out, weights = ftr.attention_forward(Layer(), q, k, v, mask)
        assert weights is None and out.shape == (2, L, 4, 8) and out.is_contiguous()
        torch.testing.assert_close(out, dense(q, k, v, mask), **TOL)


def test_other_masks_are_used_as_they_are():
    L = S = 9
    q, k, v = qkv(L=L, S=S)
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(2, 1, L, S, generator=g) > 0.5
    mask[..., 0] = True
    assert ftr._analyse(mask, L, S).dense
    out, _ = ftr.attention_forward(Layer(), q, k, v, mask)
    torch.testing.assert_close(out, dense(q, k, v, mask), **TOL)
    fmask = torch.randn(2, 1, L, S, generator=g)  # a float mask: added to the scores
    out, _ = ftr.attention_forward(Layer(), q, k, v, fmask)
    torch.testing.assert_close(out, dense(q, k, v, fmask), **TOL)


def test_no_mask_is_causal_top_left_as_sdpa():
    """attention_mask=None with L > 1: the layer's causal rule, top-left (an
    empty static cache's tail is left out), as transformers' sdpa."""
    q, k, v = qkv(L=5, S=12)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    out, _ = ftr.attention_forward(Layer(), q, k, v, None)
    torch.testing.assert_close(out, ref.transpose(1, 2), **TOL)
    out, _ = ftr.attention_forward(Layer(), q, k, v, None, is_causal=False)
    torch.testing.assert_close(out, dense(q, k, v, None), **TOL)
    q1 = q[:, :, :1]  # decoding: one query sees every key
    out, _ = ftr.attention_forward(Layer(), q1, k, v, None)
    torch.testing.assert_close(out, dense(q1, k, v, None), **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    q, k, v = qkv(dtype=dtype)
    mask = masks(2, 7, 7, 0)[0][1]
    out, _ = ftr.attention_forward(Layer(), q, k, v, mask, softcap=2.0)
    assert out.dtype == dtype
    ref = dense(q.float(), k.float(), v.float(), mask, softcap=2.0)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


def test_the_mask_is_analysed_once(monkeypatch):
    q, k, v = qkv()
    mask = masks(2, 7, 7, 0)[0][1]
    calls = []
    analyse = ftr._analyse
    monkeypatch.setattr(ftr, "_analyse", lambda *a: calls.append(1) or analyse(*a))
    for _ in range(3):
        ftr.attention_forward(Layer(), q, k, v, mask)
    assert len(calls) == 1
    mask[0, 0, 0, 0] = True  # changed in place: analysed again
    ftr.attention_forward(Layer(), q, k, v, mask)
    assert len(calls) == 2
