"""The target-feature contract: what a head asks of the frozen target, and how those features are named.

    spec = FeatureSpec(layers=(1, 7, 26), final_normed=True)     # a head's request
    with LayerCapture(target, spec.layers) as out:                 # forward hooks, pre-norm outputs
        target.get_decoder()(input_ids=ids)
    feats = TargetFeatures(layers=out)
    flat = feats.as_dict()                                          # {"features.layer.7": ..., ...}
    feature_key("layer", 7) == "features.layer.7"; parse_feature_key("features.layer.7") == ("layer", 7)

A head states what it needs (`FeatureSpec`); it receives exactly that as `TargetFeatures`, whether
computed online (data/features.py, inference/engine.py: both through `LayerCapture`) or read from an
offline cache (data/feature_cache.py). Wherever features travel as a flat dict of tensors (training
batches, cache shards, feature statistics) they are named by `feature_key` and read back by
`parse_feature_key`: one scheme.

Layer numbering (the one convention; convert only with the functions below):
- `FeatureSpec.layers` / `TargetFeatures.layers` index i = the output of decoder layer i (0-based),
  before any final norm. The last layer's pre-norm output is seen only by a hook: transformers'
  `output_hidden_states` shows it after the final norm.
- transformers' `hidden_states[i]` is the *input* of decoder layer i = the output of layer i - 1
  (`hidden_states[0]` is the embedding). EAGLE-3's `feature_layers` count this way, as vLLM's
  `eagle_aux_hidden_state_layer_ids` do. SGLang's ids count layer outputs (it adds 1 and captures the
  input of that layer), i.e. FeatureSpec's numbering.
  `hidden_state_to_layer(i) = i - 1` and `layer_to_hidden_state(j) = j + 1` convert.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

FEATURE_PREFIX = "features."
FEATURE_KINDS = ("layer", "final_normed", "logits")


@dataclass(frozen=True)
class FeatureSpec:
    layers: tuple[int, ...] = ()  # outputs of these decoder layers (0-based, pre-norm; see above)
    final_normed: bool = False  # the last hidden state after the final norm (what lm_head reads)
    logits: bool = False  # the target's logits (soft labels for distillation losses)


@dataclass
class TargetFeatures:
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, T, h]
    final_normed: torch.Tensor | None = None  # [B, T, h]
    logits: torch.Tensor | None = None  # [B, T, V]

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The features under their `feature_key` names."""
        out = {feature_key("layer", i): t for i, t in self.layers.items()}
        if self.final_normed is not None:
            out[feature_key("final_normed")] = self.final_normed
        if self.logits is not None:
            out[feature_key("logits")] = self.logits
        return out

    @classmethod
    def from_dict(cls, tensors: dict[str, torch.Tensor], spec: FeatureSpec | None = None) -> TargetFeatures:
        """The features of `spec` from a dict holding them under `feature_key` names (other keys are
        ignored); a missing one is a KeyError naming the features present. spec None: every feature there."""
        if spec is None:
            parsed = [(parse_feature_key(k), k) for k in tensors if k.startswith(FEATURE_PREFIX)]
            layers = {layer: tensors[k] for (kind, layer), k in parsed if kind == "layer"}
            final, logits = feature_key("final_normed"), feature_key("logits")
            return cls(layers=layers, final_normed=tensors.get(final), logits=tensors.get(logits))

        def get(key: str) -> torch.Tensor:
            if key not in tensors:
                have = sorted(k for k in tensors if k.startswith(FEATURE_PREFIX))
                raise KeyError(f"no feature {key!r} (features present: {have})")
            return tensors[key]

        return cls(
            layers={i: get(feature_key("layer", i)) for i in spec.layers},
            final_normed=get(feature_key("final_normed")) if spec.final_normed else None,
            logits=get(feature_key("logits")) if spec.logits else None,
        )


# ---------------------------------------------------------------- names


def feature_key(kind: str, layer: int | None = None) -> str:
    """The name of a feature: features.layer.{i}, features.final_normed, features.logits."""
    if kind not in FEATURE_KINDS:
        raise ValueError(f"unknown feature kind {kind!r} (known: {', '.join(FEATURE_KINDS)})")
    if (kind == "layer") != (layer is not None):
        raise ValueError(f"feature kind {kind!r} with layer={layer!r}: only 'layer' takes (and needs) a layer")
    return f"{FEATURE_PREFIX}layer.{layer}" if kind == "layer" else FEATURE_PREFIX + kind


def parse_feature_key(key: str) -> tuple[str, int | None]:
    """The inverse of `feature_key`: 'features.layer.7' -> ('layer', 7), 'features.logits' -> ('logits', None)."""
    kind, _, layer = key.removeprefix(FEATURE_PREFIX).partition(".")
    try:
        parsed = (kind, int(layer) if kind == "layer" else None)
        if key.startswith(FEATURE_PREFIX) and feature_key(*parsed) == key:
            return parsed
    except ValueError:
        pass
    raise ValueError(f"{key!r} is not a feature name (features.layer.<i>, features.final_normed, features.logits)")


def feature_keys(spec: FeatureSpec) -> list[str]:
    """The names of the features `spec` asks for: its layers in order, then final_normed, then logits."""
    keys = [feature_key("layer", i) for i in dict.fromkeys(spec.layers)]
    return keys + [feature_key(k) for k in ("final_normed", "logits") if getattr(spec, k)]


# ---------------------------------------------------------------- layer numbering


def hidden_state_to_layer(index: int) -> int:
    """transformers' hidden_states[index] (the input of decoder layer index) is the output of layer index - 1."""
    return index - 1


def layer_to_hidden_state(layer: int) -> int:
    """The output of decoder layer `layer` is transformers' hidden_states[layer + 1]."""
    return layer + 1


# ---------------------------------------------------------------- capturing layer outputs


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder-layer list of a transformers causal LM or its base model (also through a peft wrapper)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"cannot find the decoder layers of {type(model).__name__} (expected .get_decoder().layers)")
    return layers


class _StopForward(Exception):
    """Raised by the hook on the deepest wanted layer: nothing after it is computed."""


class LayerCapture:
    """Forward hooks that keep the outputs (pre-norm) of chosen decoder layers, for the forwards run
    inside `with`; entering yields a fresh dict layer -> [B, T, h], filled as the forward passes.

    stop_after_deepest: the deepest wanted layer's hook ends the forward there, and the `with` block is
    left quietly at that point (statements after the forward in it do not run).
    """

    def __init__(self, model: nn.Module, layers: Iterable[int], stop_after_deepest: bool = False) -> None:
        self.decoder_layers = decoder_layers(model)
        n = len(self.decoder_layers)
        self.wanted = tuple(sorted(set(layers)))
        for i in self.wanted:
            if not 0 <= i < n:
                raise ValueError(f"feature layer {i} does not exist: the target has decoder layers 0..{n - 1}")
        self.stop_at = self.wanted[-1] if stop_after_deepest and self.wanted else None
        self._handles: list = []

    def __enter__(self) -> dict[int, torch.Tensor]:
        outputs: dict[int, torch.Tensor] = {}

        def hook_for(i: int):
            def hook(_module, _args, output):
                outputs[i] = output[0] if isinstance(output, tuple) else output
                if i == self.stop_at:
                    raise _StopForward

            return hook

        self._handles = [self.decoder_layers[i].register_forward_hook(hook_for(i)) for i in self.wanted]
        return outputs

    def __exit__(self, exc_type, exc, tb) -> bool:
        for h in self._handles:
            h.remove()
        self._handles = []
        return exc_type is _StopForward


# What EAGLE drafters read, here in the core so that data/ (caches, features kept while generating)
# needs nothing from heads/.


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's reference choice: a low, a middle and a high layer (hidden_states indices)."""
    return [2, num_layers // 2, num_layers - 3]


def eagle_feature_spec(
    version: int,
    num_target_layers: int,
    feature_layers: list[int] | None = None,
    feature_source: str = "pre_norm",
    training: bool = False,
) -> FeatureSpec:
    """The target features an EAGLE drafter reads, from its settings (no drafter needed: caching uses it).
    training=True adds what the loss needs: EAGLE-3 learns from the target's distributions, i.e. its
    final normed state; EAGLE-1 learns from the feature it reads."""
    if version == 3:
        layers = feature_layers or default_feature_layers(num_target_layers)
        return FeatureSpec(layers=tuple(hidden_state_to_layer(i) for i in layers), final_normed=training)
    if feature_source == "post_norm":
        return FeatureSpec(final_normed=True)
    return FeatureSpec(layers=(num_target_layers - 1,))  # the last layer's output, pre-norm
