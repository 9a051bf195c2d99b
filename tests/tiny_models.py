"""Tiny random targets for unit tests on CPU (a test helper: the package never builds random models)."""

from __future__ import annotations

import torch


def tiny_llama(vocab_size: int = 512, hidden_size: int = 64, num_layers: int = 2, seed: int = 0, **overrides):
    """A random Llama small enough for unit tests on CPU (fp32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        **overrides,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval().requires_grad_(False)
    return model
