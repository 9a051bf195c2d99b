"""Target features for training: online from the frozen target, or carried in the batch from a cache.

    extract = OnlineFeatures(target, FeatureSpec(layers=(2, 15, 27), final_normed=True))
    feats = extract(batch)        # TargetFeatures: layers {i: [B, T, h]}, final_normed, logits (when asked)

Online extraction runs the target's base model (no lm_head) once; `LayerCapture` (headway/features.py)
keeps the requested decoder layers' outputs (pre-norm, including the last layer's, which
`output_hidden_states` only shows after the final norm). Logits are computed only when the spec asks.
When nothing after the deepest requested layer is needed, the forward stops there.

Offline: a collate function that loads cached tensors puts them in the batch under their `feature_key`
names; `BatchFeatures()` turns those back into `TargetFeatures`, so the training loop handles both alike.

`data_feature_spec(["medusa", "eagle3"], num_layers)` is what `data.features` names: the union of those
heads' needs, the one feature cache generation (or one extraction pass) writes for all of them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from headway.features import FeatureSpec, LayerCapture, TargetFeatures, eagle_feature_spec

DATA_FEATURE_NAMES = ("medusa", "eagle", "eagle3", "final_normed", "layer.N")

FeatureSource = Callable[[dict[str, torch.Tensor]], TargetFeatures]


class OnlineFeatures:
    """Callable batch -> TargetFeatures from a forward of the (frozen) target."""

    def __init__(self, model: nn.Module, spec: FeatureSpec, grad: bool = False) -> None:
        self.model = model
        self.spec = spec
        self.grad = grad  # Medusa-2 trains adapters inside the target: keep the graph then
        only_layers = not (spec.final_normed or spec.logits)
        self.capture = LayerCapture(model, spec.layers, stop_after_deepest=only_layers)

    def __call__(self, batch: dict[str, torch.Tensor]) -> TargetFeatures:
        final = None
        with torch.set_grad_enabled(self.grad), self.capture as layers:
            final = self.model.get_decoder()(
                input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False
            ).last_hidden_state
        out = TargetFeatures(layers={i: layers[i] for i in self.spec.layers})
        if self.spec.final_normed:
            out.final_normed = final
        if self.spec.logits:
            with torch.set_grad_enabled(self.grad):
                out.logits = self.model.get_output_embeddings()(final)
        return out


class BatchFeatures:
    """Callable batch -> TargetFeatures from tensors a caching collate put under their `feature_key` names."""

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec

    def __call__(self, batch: dict[str, torch.Tensor]) -> TargetFeatures:
        return TargetFeatures.from_dict(batch, self.spec)


def union(*specs: FeatureSpec) -> FeatureSpec:
    """Every layer and final state any of `specs` asks for (logits are never cached)."""
    layers = sorted({i for s in specs for i in s.layers})
    return FeatureSpec(layers=tuple(layers), final_normed=any(s.final_normed for s in specs))


def data_feature_spec(names: list[str], num_layers: int) -> FeatureSpec:
    """The features `data.features` names, for a target of `num_layers` decoder layers (see headway/config.py)."""
    specs = []
    for name in names:
        if name in ("medusa", "final_normed"):
            spec = FeatureSpec(final_normed=True)  # what Medusa-1 heads read
        elif name == "eagle":
            spec = eagle_feature_spec(1, num_layers, training=True)
        elif name == "eagle3":
            spec = eagle_feature_spec(3, num_layers, training=True)
        elif name.startswith("layer.") and name[6:].isdigit():
            spec = FeatureSpec(layers=(int(name[6:]),))
        else:
            raise ValueError(f"data.features: {name!r} is not one of {', '.join(DATA_FEATURE_NAMES)}")
        if any(not 0 <= i < num_layers for i in spec.layers):
            raise ValueError(
                f"data.features: {name!r} asks for decoder layers {list(spec.layers)}, the target has layers "
                f"0..{num_layers - 1} (layer.N counts decoder layer outputs, 0-based)"
            )
        specs.append(spec)
    return union(*specs)
