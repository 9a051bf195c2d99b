"""The export rule: what changes between a headway checkpoint and the folder an engine loads, both ways.

    state = engine_weights(read_checkpoint("runs/x/eagle3"), "sglang")   # the weights SGLang loads
    config, state, notes = engine_files(ckpt, "vllm")                    # and the config.json beside them
    ckpt = to_headway("exports/x-eagle3-vllm", "vllm", target.config)    # an engine folder, back

What is exact, per (engine, method):
- Medusa -> vLLM: the same names and weights (heads/medusa.py already uses vLLM's names).
- EAGLE-1 -> vLLM / SGLang: the engines feed the target's final *normed* hidden state and take logits
  as the target's lm_head(feature), no norm, no scale. Only drafters trained with
  `eagle.feature_source: post_norm` and `eagle.feature_norm: none` have that graph; others are refused,
  as no rewrite of the weights reproduces them. SGLang's fc has a bias: a zero one is written.
- EAGLE-3 -> vLLM / SGLang: a per-dimension feature scale folds into fc (fc(f / s) = (W / s) f), so
  the folder has no `feature_scale` and loads back as a drafter with feature_norm none (equal logits up
  to float rounding of the fold; bit-identical without a scale). Every folder names its feature layers
  in both engines' numbering (headway/features.py): the top-level `eagle_aux_hidden_state_layer_ids`
  (hidden_states indices, what vLLM and llama.cpp read) and `eagle_config.eagle_aux_hidden_state_layer_ids`
  (layer outputs, what SGLang reads and adds 1 to), so a folder written for one engine reads the same
  layers in the other. Both engines concatenate the captured states in layer order: layers listed out
  of order are sorted and fc's input blocks permuted with them (exact); SGLang cannot capture the last
  layer's output (hidden_states[L]), so such a drafter is refused for SGLang. With the full vocabulary
  (V' = V) `d2t`/`t2d` are left out (vLLM >= 0.31 raises on a `d2t` there; without it draft id = target id).
Both engines build a Llama decoder layer for these drafters: a drafter of another layer type (Qwen2:
q/k/v biases) is refused. What a release range cannot load at all is refused by export/releases.py.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path

import torch

from headway.export.check import check_folder, named_layer_ids, read_config
from headway.export.checkpoint import Checkpoint
from headway.export.engine_keys import (
    CONFIG_FILE,
    EXPORT_BLOCK,
    LAYER_IDS,
    WEIGHTS_FILE,
    Dims,
    ExportError,
    dims_from_config,
    method_of_config,
    table_for,
)
from headway.export.releases import Release, check_release, release_for
from headway.features import default_feature_layers, hidden_state_to_layer
from headway.heads.eagle import FORMAT as EAGLE_FORMAT
from headway.heads.eagle import EagleDrafterConfig
from headway.heads.medusa import MedusaHeadsConfig
from headway.heads.vocab import DraftVocab

HEADWAY_ARCH = {"eagle1": ["EagleLlamaForCausalLM"], "eagle3": ["LlamaForCausalLMEagle3"]}
# Layer types the engines' EAGLE models reproduce: they build vLLM/SGLang's Llama decoder layer.
LLAMA_LAYERS = ("llama",)


# ---------------------------------------------------------------- headway -> engine


def engine_weights(ckpt: Checkpoint, engine: str) -> dict[str, torch.Tensor]:
    """The weights `engine` loads for `ckpt`, rewritten from headway's by the rules above; a drafter no
    rewrite reproduces, or a method the engine lacks, is an ExportError saying what to train instead."""
    table = table_for(engine, ckpt.method)  # refuses a method the engine lacks (SGLang + Medusa)
    if ckpt.method == "medusa":
        return dict(ckpt.state)
    own = ckpt.own
    name = f"EAGLE-{own['version']}"
    if own.get("model_type") not in LLAMA_LAYERS:
        raise ExportError(
            f"{name} drafter built on a {own.get('model_type')!r} decoder layer: {engine} builds a Llama layer "
            f"for {table.architectures[0]}, which would drop what differs (e.g. Qwen2's q/k/v biases)"
        )
    state = {k: v for k, v in ckpt.state.items() if k != "feature_scale"}
    scale = ckpt.state.get("feature_scale")
    if ckpt.method == "eagle3":
        layers = check_feature_layers(own, engine)
        w = state["fc.weight"]
        if scale is not None:
            w = (w.float() / scale.float()[None, :]).to(w.dtype)
        # fc reads [f_a ; f_b ; f_c] in the listed order; the engines concatenate in layer order.
        blocks = w.split(w.shape[1] // len(layers), dim=1)
        order = sorted(range(len(layers)), key=lambda i: layers[i])
        state["fc.weight"] = torch.cat([blocks[i] for i in order], dim=1)
        if not reduced_vocab(own):
            state.pop("d2t", None)
            state.pop("t2d", None)
        return state
    if own.get("feature_source") != "post_norm":
        raise ExportError(
            f"{name} drafter trained on the target's pre-norm features (feature_source="
            f"{own.get('feature_source')!r}): {engine} feeds the final normed hidden state and computes logits "
            "as lm_head(feature) without a norm, so it would draft with other inputs than it learned. "
            "Train with eagle.feature_source=post_norm eagle.feature_norm=none to export EAGLE-1"
        )
    if scale is not None:
        raise ExportError(
            f"{name} drafter trained with a per-dimension feature scale (eagle.feature_norm: per_dim): "
            f"{engine} feeds the drafter's output back through the same fc and into the target's lm_head "
            "unscaled, which no rewrite of the weights reproduces. Train with eagle.feature_norm=none"
        )
    if engine == "sglang":  # SGLang's fc is built with a bias: write a zero one, never leave it unset
        w = state["fc.weight"]
        state["fc.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    return state


def reduced_vocab(own: dict) -> bool:
    """An EAGLE-3 drafter over fewer tokens than the target (d2t/t2d are written only then)."""
    return bool(own.get("draft_vocab_size")) and int(own["draft_vocab_size"]) < int(own["vocab_size"])


def check_feature_layers(own: dict, engine: str) -> list[int]:
    """EAGLE-3's feature layers (hidden_states indices) as the engine can capture them, else an ExportError."""
    layers, L = list(own["feature_layers"]), int(own["num_target_layers"])
    if len(set(layers)) != len(layers):
        raise ExportError(
            f"EAGLE-3 feature_layers {layers} repeat a layer: the engines capture each layer once, so fc would "
            "read fewer features than it was trained on"
        )
    if engine == "sglang" and L in layers:
        raise ExportError(
            f"EAGLE-3 feature_layers {layers} include hidden_states[{L}], the last layer's output: SGLang "
            f"captures the input of layer (id + 1), so its capture stops at the input of layer {L - 1}; "
            "serve this drafter with vLLM or llama.cpp, or train with feature layers below the last"
        )
    return layers


def engine_layer_ids(feature_layers: list[int]) -> dict:
    """config.json keys naming EAGLE-3's feature layers (hidden_states indices) in both engines' numbering,
    ascending (the order the engines concatenate the captured states in)."""
    layers = sorted(feature_layers)
    return {LAYER_IDS: layers, "eagle_config": {LAYER_IDS: [hidden_state_to_layer(i) for i in layers]}}


def feature_layers_of(config: dict, engine: str, num_layers: int) -> list[int]:
    """The feature layers (hidden_states indices) `engine` reads from a folder's config, else its default."""
    top, nested = named_layer_ids(config)
    ids = top if engine == "vllm" else nested
    return ids or default_feature_layers(num_layers)


def _legacy_rope(config: dict) -> dict:
    """rope_theta / rope_scaling from transformers 5's rope_parameters: engines on transformers 4 read only those."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict):
        return {}
    out = {}
    if "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    out["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    return out


def _provenance(ckpt: Checkpoint, release: Release, **extra) -> dict:
    return {
        "engine": release.engine,
        "engine_version": release.name,
        "method": ckpt.method,
        "from": copy.deepcopy(ckpt.own),
        **extra,
    }


def engine_config(ckpt: Checkpoint, engine: str, release: Release | None = None) -> tuple[dict, list[str]]:
    """(config.json, notes for the user) of `ckpt` in `engine`'s format."""
    own, notes = ckpt.own, []
    release = release or release_for(engine)
    if ckpt.method == "medusa":
        config = MedusaHeadsConfig.from_json(ckpt.config, CONFIG_FILE).to_json()
        config.pop("headway")
        config[EXPORT_BLOCK] = _provenance(ckpt, release)
        if ckpt.folder is not None and (ckpt.folder / "lora").is_dir():
            notes.append(
                "Medusa-2 checkpoint: these heads were trained with LoRA adapters on the target (lora/); serve "
                "the target with that adapter merged, or the heads read other hidden states than they learned"
            )
        return config, notes
    config = {k: v for k, v in ckpt.config.items() if k != "headway"}
    config.update(_legacy_rope(config))
    config.update(
        architectures=list(table_for(engine, ckpt.method).architectures),
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
    )
    extra = {}
    if ckpt.method == "eagle3":
        if "feature_scale" in ckpt.state:
            extra["folded_feature_scale"] = True
        config["draft_vocab_size"] = int(own.get("draft_vocab_size") or own["vocab_size"])
        config["target_hidden_size"] = int(own["hidden_size"])  # the drafter's fc reads 3 target-sized features
        layers, default = list(own["feature_layers"]), default_feature_layers(own["num_target_layers"])
        config.update(engine_layer_ids(layers))
        if layers != sorted(layers):
            notes.append(f"feature layers {layers} written in layer order {sorted(layers)}, fc's input blocks with them")
        if sorted(layers) != default and release.name == "<=0.11":
            notes.append(
                f"feature layers {sorted(layers)} differ from the engines' default {default}: vLLM releases "
                "that predate configurable EAGLE-3 layers (before eagle_aux_hidden_state_layer_ids) read the default"
            )
    config[EXPORT_BLOCK] = _provenance(ckpt, release, **extra)
    return config, notes


def engine_files(
    ckpt: Checkpoint, engine: str, release: Release | None = None
) -> tuple[dict, dict[str, torch.Tensor], list[str]]:
    """(config.json, weights, notes) of `ckpt` in `engine`'s format; refuses what the engine, or the
    release range (default: the newest checked), cannot run."""
    release = release or release_for(engine)
    if release.engine != engine:
        raise ExportError(f"release {release.label} is not a {engine} release")
    where = str(ckpt.folder) if ckpt.folder is not None else "checkpoint"
    table_for(engine, ckpt.method)  # the engine's own refusals first (SGLang has no Medusa at all)
    check_release(release, ckpt.method, expected_dims(ckpt), where)
    state = engine_weights(ckpt, engine)
    config, notes = engine_config(ckpt, engine, release)
    return config, state, notes


def expected_dims(ckpt: Checkpoint) -> Dims:
    """The sizes the exported config must declare, from the source's `headway` block and layer config."""
    own = ckpt.own
    if ckpt.method == "medusa":
        return dims_from_config("medusa", MedusaHeadsConfig.from_json(ckpt.config, CONFIG_FILE).to_json())
    src = {k: v for k, v in ckpt.config.items() if k != "headway"}
    src.update(hidden_size=own["hidden_size"], vocab_size=own["vocab_size"])
    if ckpt.method == "eagle3":
        src.update(
            draft_vocab_size=own.get("draft_vocab_size") or own["vocab_size"],
            target_hidden_size=own["hidden_size"],
        )
    return dims_from_config(ckpt.method, src)


# ---------------------------------------------------------------- engine -> headway


def to_headway(folder: str | Path, engine: str, target_config=None) -> Checkpoint:
    """An engine folder (checked against its table) as a headway checkpoint.

    `target_config` (the target's transformers config) supplies what the engine keys do not say for
    EAGLE (the target's layer count and type); without it, the folder's `headway_export` block must.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    dims = check_folder(folder, engine)
    config = read_config(folder)
    method = method_of_config(config)
    state = load_file(str(folder / WEIGHTS_FILE))
    source = (config.get(EXPORT_BLOCK) or {}).get("from") or {}
    target = source.get("target") or {}
    if method == "medusa":
        own = MedusaHeadsConfig(
            num_heads=dims.num_heads,
            num_layers=dims.num_layers,
            hidden_size=dims.hidden,
            vocab_size=dims.vocab,
            draft_vocab_size=dims.draft_vocab if dims.draft_vocab < dims.vocab else None,
            fc_bias=dims.fc_bias,
            target=target,
        )
        return Checkpoint(method, own.to_json(), state)

    where = str(folder / CONFIG_FILE)
    if target_config is not None:
        num_layers, model_type = target_config.num_hidden_layers, target_config.model_type
    elif "num_target_layers" in source and "model_type" in source:
        num_layers, model_type = source["num_target_layers"], source["model_type"]
    else:
        raise ExportError(
            f"{where}: no {EXPORT_BLOCK} block says the target's layers: pass the target (--target)"
        )
    if method == "eagle1" and engine == "sglang":
        bias = state.pop("fc.bias")
        if bias.abs().max() != 0:
            raise ExportError(
                f"{folder / WEIGHTS_FILE}: key 'fc.bias' is not zero; headway's EAGLE-1 fc has no bias to hold it"
            )
    if method == "eagle3" and dims.target_hidden != dims.hidden:
        raise ExportError(
            f"{where}: target_hidden_size={dims.target_hidden} differs from hidden_size={dims.hidden}; "
            "headway's EAGLE-3 drafter has the target's hidden size"
        )
    if method == "eagle3" and "d2t" not in state:  # full vocabulary: the engines' identity map
        full = DraftVocab.full(dims.vocab)
        state.update(d2t=full.d2t, t2d=full.t2d)
    own = EagleDrafterConfig(
        version=1 if method == "eagle1" else 3,
        hidden_size=dims.hidden,
        vocab_size=dims.vocab,
        num_target_layers=num_layers,
        model_type=model_type,
        feature_layers=feature_layers_of(config, engine, num_layers) if method == "eagle3" else [],
        # The engines' EAGLE-1 graph: normed target features in, lm_head(feature) out.
        feature_source="post_norm" if method == "eagle1" else source.get("feature_source", "pre_norm"),
        feature_norm="none",  # a scale never reaches an engine folder (refused, or folded into fc)
        draft_vocab_size=dims.draft_vocab if method == "eagle3" else None,
        target=target,
    )
    drop = (EXPORT_BLOCK, "eagle_config", LAYER_IDS)
    new = {k: v for k, v in config.items() if k not in drop}
    new["architectures"] = HEADWAY_ARCH[method]
    new["headway"] = {"format": EAGLE_FORMAT, **asdict(own)}
    return Checkpoint(method, new, state)


def check_layer_config(folder: Path, config: dict, target) -> None:
    """Values that change the drafter's output without changing a shape must be the target's."""
    tc = target.config.to_dict()
    keys = ("rms_norm_eps", "hidden_act", "rope_parameters", "head_dim")
    want = {k: tc[k] for k in keys if tc.get(k) is not None}
    want.update({k: v for k, v in _legacy_rope(tc).items() if k == "rope_theta"})
    for key, value in want.items():
        if key in config and config[key] != value:
            raise ExportError(
                f"{folder / CONFIG_FILE}: {key}={config[key]!r}, the target has {key}={value!r}"
            )
