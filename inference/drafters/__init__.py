"""Drafter adapters: each head type implements the `inference.drafter.Drafter` protocol.

- `MedusaDrafter`: all heads at once from the last accepted token's final hidden state.
- `ModelDrafter`: any small causal LM over the target's vocabulary, autoregressive with its own
  KV cache and tree attention (two-model speculative decoding); `layer_skip` builds one from the
  target's first layers. It is the template for EAGLE drafters, which add the target's features.
"""

from inference.drafters.medusa import MedusaDrafter
from inference.drafters.model import ModelDrafter, layer_skip

__all__ = ["MedusaDrafter", "ModelDrafter", "layer_skip"]
