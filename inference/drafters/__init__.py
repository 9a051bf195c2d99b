"""Drafter adapters: each head type implements the `inference.drafter.Drafter` protocol.

- `MedusaDrafter`: all heads at once from the last accepted token's final hidden state.
- `ModelDrafter`: any small causal LM over the target's vocabulary, autoregressive with its own
  KV cache and tree attention (two-model speculative decoding); `layer_skip` builds one from the
  target's first layers.
- `EagleTreeDrafter`: EAGLE-1 / EAGLE-3 feature drafters (heads/eagle.py), step by step over the tree.
- `LookupDrafter`: n-gram matches in the prompt and the text so far (no model).
- `FusedDrafter`: a trained drafter's tree with lookup candidates merged in, nodes split per step.
"""

from headway.inference.drafters.eagle import EagleTreeDrafter
from headway.inference.drafters.fused import FusedDrafter
from headway.inference.drafters.lookup import LookupDrafter
from headway.inference.drafters.medusa import MedusaDrafter
from headway.inference.drafters.model import ModelDrafter, layer_skip

__all__ = ["EagleTreeDrafter", "FusedDrafter", "LookupDrafter", "MedusaDrafter", "ModelDrafter", "layer_skip"]
