"""FlashAttention's ``flash_attn.layers`` on NumPy arrays: :mod:`.rotary`.

Only the functions that models import next to the attention calls are here
(:func:`fastattn.flash_attn.layers.rotary.apply_rotary_emb`); FlashAttention's
torch modules (``RotaryEmbedding``, ``PatchEmbed``) are not.
"""
