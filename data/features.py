"""Target features for training: online from the frozen target, or carried in the batch from a cache.

    extract = OnlineFeatures(target, FeatureSpec(layers=(2, 15, 27), final_normed=True))
    feats = extract(batch)        # TargetFeatures: layers {i: [B, T, h]}, final_normed, logits (when asked)

Online extraction runs the target's base model (no lm_head) once under no_grad; forward hooks on the
requested decoder layers keep just those outputs (pre-norm, including the last layer's, which
`output_hidden_states` only shows after the final norm). Logits are computed only when the spec asks.
When nothing after the deepest requested layer is needed, the forward stops there.

Offline: a collate function that loads cached tensors puts them in the batch under `feature_key(...)`
names; `BatchFeatures()` turns those back into `TargetFeatures`, so the training loop handles both alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from headway.heads.base import FeatureSpec, TargetFeatures

FeatureSource = Callable[[dict[str, torch.Tensor]], TargetFeatures]

FEATURE_PREFIX = "features."


def feature_key(kind: str, layer: int | None = None) -> str:
    """Batch key of a carried feature: features.layer.{i}, features.final_normed, features.logits."""
    if kind == "layer":
        return f"{FEATURE_PREFIX}layer.{layer}"
    if kind not in ("final_normed", "logits"):
        raise ValueError(f"unknown feature kind {kind!r}")
    return FEATURE_PREFIX + kind


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list of a transformers causal LM (also through a peft wrapper)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"cannot find the decoder layers of {type(model).__name__} (expected .get_decoder().layers)")
    return layers


class _StopForward(Exception):
    """Raised by the hook on the deepest layer needed: nothing after it is computed."""


class OnlineFeatures:
    """Callable batch -> TargetFeatures from a forward of the (frozen) target."""

    def __init__(self, model: nn.Module, spec: FeatureSpec, grad: bool = False) -> None:
        self.model = model
        self.spec = spec
        self.grad = grad  # Medusa-2 trains adapters inside the target: keep the graph then
        self.layers = decoder_layers(model)
        n = len(self.layers)
        for i in spec.layers:
            if not 0 <= i < n:
                raise ValueError(f"feature layer {i} does not exist: the target has decoder layers 0..{n - 1}")
        self._captured: dict[int, torch.Tensor] = {}
        self._stop_after = max(spec.layers) if spec.layers and not (spec.final_normed or spec.logits) else None

    def _hook(self, index: int):
        def hook(_module, _args, output):
            self._captured[index] = output[0] if isinstance(output, tuple) else output
            if index == self._stop_after:
                raise _StopForward

        return hook

    def __call__(self, batch: dict[str, torch.Tensor]) -> TargetFeatures:
        handles = [self.layers[i].register_forward_hook(self._hook(i)) for i in sorted(set(self.spec.layers))]
        self._captured = {}
        out = TargetFeatures()
        try:
            with torch.set_grad_enabled(self.grad):
                try:
                    base_out = self.model.get_decoder()(
                        input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False
                    )
                    final = base_out.last_hidden_state
                except _StopForward:
                    final = None
                if final is not None and self.spec.final_normed:
                    out.final_normed = final
                if final is not None and self.spec.logits:
                    out.logits = self.model.get_output_embeddings()(final)
        finally:
            for h in handles:
                h.remove()
        out.layers = {i: self._captured[i] for i in self.spec.layers}
        self._captured = {}
        return out


class BatchFeatures:
    """Callable batch -> TargetFeatures from tensors a caching collate put under `feature_key` names."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec

    def __call__(self, batch: dict[str, torch.Tensor]) -> TargetFeatures:
        def get(key: str) -> torch.Tensor:
            if key not in batch:
                have = sorted(k for k in batch if k.startswith(FEATURE_PREFIX))
                raise KeyError(f"the batch carries no {key!r} (cached features present: {have})")
            return batch[key]

        return TargetFeatures(
            layers={i: get(feature_key("layer", i)) for i in self.spec.layers},
            final_normed=get(feature_key("final_normed")) if self.spec.final_normed else None,
            logits=get(feature_key("logits")) if self.spec.logits else None,
        )
