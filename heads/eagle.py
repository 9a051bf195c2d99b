"""EAGLE feature drafters: EAGLE-1 (one layer on [token ; last feature]) and EAGLE-3 (fused low/mid/high features).

    drafter = Eagle3Drafter.from_target(target, feature_layers=[2, 15, 27], vocab=draft_vocab)
    z = drafter.features_from_target(feats)             # TargetFeatures -> model-space features [B, T, h]
    cache = drafter.new_cache()
    out = drafter.step(next_ids, z, position_ids, cache) # DraftStep: feature [B, q, h] (fed back), logits
    target_ids = drafter.to_target_ids(out.logits.argmax(-1))
    drafter.save_pretrained("runs/x/eagle3")             # config.json + model.safetensors
    drafter = load_drafter("runs/x/eagle3", target)      # refuses another target, naming both values

Position t of the drafter reads [embedding of token t+1 ; feature of position t] and predicts the feature
of position t+1 (fed back as the next step's input) and token t+2.

- EAGLE-1: f_t is the target's last decoder layer output, before the final norm (`feature_source:
  pre_norm`, the default) or after it (`post_norm`, what vLLM's EAGLE-1 feeds). fc(2h->h, no bias) ->
  transformers' own decoder layer for the target's architecture with no input norm -> the predicted
  feature; logits = target lm_head(target final norm(feature)) (no norm for post_norm). The target's
  embedding, final norm and lm_head are shared, frozen and never saved.
- EAGLE-3: f_t = concat of the inputs of target layers (2, L/2, L-3 by default; transformers'
  hidden_states[i], see headway/features.py for the numbering) -> fc(3h->h). The midlayer is the target's decoder-layer class with q/k/v widened to
  2h: attention reads [input_layernorm(embedding) ; hidden_norm(feature)], the residual is the feature.
  Its output (pre-norm) is fed back; logits = own lm_head(own norm(output)) over the draft vocabulary
  (`d2t`, `t2d`, as in heads/vocab.py).

Parameter names are the serving engines' (vLLM llama_eagle.py / llama_eagle3.py, SGLang llama_eagle3.py):
EAGLE-1 `fc.weight`, `layers.0.*` (no input_layernorm); EAGLE-3 `fc.weight`, `midlayer.*`, `norm.weight`,
`lm_head.weight`, `d2t`, `t2d`. With `feature_norm: per_dim` the drafter also holds `feature_scale`
(per-dimension std of the target features on the training data): the model works on f / scale, which
keeps outlier dimensions (SmolLM2: std up to ~200 against a median of ~19) from dominating the
regression. On the input side that scale folds into `fc` exactly at export (export/rules.py); EAGLE-1's
output side (scale before the shared lm_head) does not fold into vLLM's EAGLE-1 graph.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from headway.features import FeatureSpec, TargetFeatures, default_feature_layers, eagle_feature_spec
from headway.heads import eagle_attention
from headway.heads.base import CONFIG_FILE, WEIGHTS_FILE, checkpoint_files, shift_left
from headway.heads.vocab import DraftVocab
from headway.kv import cache_kwarg

FORMAT = "eagle-drafter"


# ---------------------------------------------------------------- config


@dataclass
class EagleDrafterConfig:
    version: int  # 1 or 3
    hidden_size: int
    vocab_size: int  # the target's (lm_head rows)
    num_target_layers: int
    model_type: str
    # EAGLE-3: fuse the inputs of these target decoder layers (transformers' hidden_states[i]; headway.features).
    feature_layers: list[int] = field(default_factory=list)
    feature_source: str = "pre_norm"  # EAGLE-1: pre_norm | post_norm
    feature_norm: str = "none"  # none | per_dim
    draft_vocab_size: int | None = None  # EAGLE-3: rows of its own lm_head
    target: dict = field(default_factory=dict)  # name (+ fingerprint)

    def __post_init__(self) -> None:
        if self.version not in (1, 3):
            raise ValueError(f"EAGLE version must be 1 or 3, got {self.version}")
        if self.feature_source not in ("pre_norm", "post_norm"):
            raise ValueError(f"feature_source must be pre_norm or post_norm, got {self.feature_source!r}")
        if self.feature_norm not in ("none", "per_dim"):
            raise ValueError(f"feature_norm must be none or per_dim, got {self.feature_norm!r}")
        if self.version == 3:
            L = self.num_target_layers
            if len(self.feature_layers) != 3:
                raise ValueError(f"EAGLE-3 fuses 3 feature layers, got feature_layers={self.feature_layers}")
            bad = [i for i in self.feature_layers if not 1 <= i <= L]
            if bad:
                raise ValueError(
                    f"feature_layers {bad}: each must be a decoder layer's input in 1..{L} (the target has {L} layers)"
                )

    @property
    def feature_width(self) -> int:
        """Width of the target features the drafter reads (and of `feature_scale`)."""
        return self.hidden_size * (3 if self.version == 3 else 1)


# ---------------------------------------------------------------- the target's shared parts


@dataclass
class TargetParts:
    """What a drafter borrows from the target: frozen, shared, never saved; plus its architecture classes."""

    config: object  # the target's transformers config
    embed_tokens: nn.Module
    final_norm: nn.Module
    lm_head: nn.Module
    layer_cls: type
    norm_cls: type
    rotary_cls: type

    @classmethod
    def of(cls, target: nn.Module) -> TargetParts:
        base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
        layers = getattr(base, "layers", None)
        if not isinstance(layers, nn.ModuleList) or not len(layers):
            raise TypeError(f"cannot find the decoder layers of {type(target).__name__}")
        for name in ("norm", "rotary_emb", "embed_tokens"):
            if not hasattr(base, name):
                raise TypeError(f"{type(base).__name__} has no `{name}`: not a Llama-style decoder")
        layer = layers[0]
        return cls(
            config=target.config,
            embed_tokens=target.get_input_embeddings(),
            final_norm=base.norm,
            lm_head=target.get_output_embeddings(),
            layer_cls=type(layer),
            norm_cls=type(layer.post_attention_layernorm),
            rotary_cls=type(base.rotary_emb),
        )


def layer_config_for(target_config) -> object:
    """The drafter's single-layer config: the target's, with our attention kernel (float masks, TTT)."""
    c = copy.deepcopy(target_config)
    base_attn = getattr(target_config, "_attn_implementation", None) or "sdpa"
    c.num_hidden_layers = 1
    if getattr(c, "layer_types", None):
        c.layer_types = ["full_attention"]
    if hasattr(c, "use_sliding_window"):
        c.use_sliding_window = False
    c._attn_implementation = eagle_attention.ATTENTION_NAME
    setattr(c, eagle_attention.BASE_ATTENTION_ATTR, "eager" if base_attn == "eager" else "sdpa")
    return c


def check_target_matches(config: EagleDrafterConfig, target: nn.Module, where: str) -> None:
    """A drafter trained for one target must not load onto another shape: name both values."""
    have = {
        "hidden_size": target.config.hidden_size,
        "vocab_size": target.get_output_embeddings().weight.shape[0],
        "num_hidden_layers": target.config.num_hidden_layers,
    }
    want = {
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_hidden_layers": config.num_target_layers,
    }
    for key, value in want.items():
        if value != have[key]:
            raise ValueError(
                f"{where}: the EAGLE-{config.version} drafter was trained for a target with {key}={value} "
                f"({config.target.get('name', '?')!r}), this target has {key}={have[key]}"
            )


@dataclass
class DraftStep:
    feature: torch.Tensor  # [B, q, h] model-space feature: the next step's input
    logits: torch.Tensor  # [B, q, V_draft] (EAGLE-1: the full target vocabulary)


@dataclass
class UnrolledStep:
    """One step of the training-time unroll, on Q anchors per row."""

    hidden: torch.Tensor  # [B, Q, h] the step's output features (predict token anchor+2+i)
    index: torch.Tensor  # [B, Q] the anchor positions t
    valid: torch.Tensor  # bool [B, Q]: a real anchor (not padding of the gathered set)

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, ...] at this step's anchors -> [B, Q, ...]."""
        idx = self.index.reshape(*self.index.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
        return x.gather(1, idx)


def anchor_index(anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [B, T] -> (positions [B, A] in order, padded with 0; valid [B, A]), A = the most anchors in a row."""
    counts = anchors.sum(1)
    A = max(1, int(counts.max()))
    order = torch.argsort((~anchors).to(torch.int8), dim=1, stable=True)[:, :A]
    valid = torch.arange(A, device=anchors.device)[None] < counts[:, None]
    return torch.where(valid, order, torch.zeros_like(order)), valid


# ---------------------------------------------------------------- drafters


class EagleDrafter(nn.Module):
    """Shared machinery: embedding lookup, rotary, feature scaling, the step and the unrolled training forward."""

    # int8 weights (inference.draft_quantization) leave fc alone: it reads the target's un-normed features,
    # whose outliers int8 activations with one scale per call cannot hold (SmolLM2, fc quantised: step-1
    # top-1 0.350 -> 0.126). Every other linear quantised: each depth's top-1 within 0.002 (headway/int8.py).
    unquantized_linears = ("fc",)

    def __init__(self, config: EagleDrafterConfig, parts: TargetParts) -> None:
        super().__init__()
        self.config = config
        object.__setattr__(self, "_parts", parts)  # plain attribute: not a submodule, not saved, not trained
        self.layer_config = layer_config_for(parts.config)
        self.rotary_emb = parts.rotary_cls(config=self.layer_config)
        if config.feature_norm == "per_dim":
            self.register_buffer("feature_scale", torch.ones(config.feature_width))
        else:
            self.feature_scale = None

    # ------------------------------------------------------------ what a subclass provides

    def _layer(self, embeds, features, position_embeddings, position_ids, mask, cache, **attn_kwargs):
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def feature_spec(self) -> FeatureSpec:
        """The target features drafting needs."""
        c = self.config
        return eagle_feature_spec(c.version, c.num_target_layers, c.feature_layers, c.feature_source)

    def raw_target_features(self, feats: TargetFeatures) -> torch.Tensor:
        """The target features the drafter reads, unscaled, concatenated: [B, T, feature_width]."""
        raise NotImplementedError

    # ------------------------------------------------------------ common

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def target_parts(self) -> TargetParts:
        return self._parts

    def set_feature_scale(self, std: torch.Tensor, floor_ratio: float = 1e-2) -> None:
        """Per-dimension std of the target features on training data; tiny stds floored (no blow-up)."""
        if self.feature_scale is None:
            raise ValueError("this drafter was built with feature_norm='none': no feature scale to set")
        if std.shape != self.feature_scale.shape:
            raise ValueError(
                f"feature std of shape {tuple(std.shape)}, the drafter expects {tuple(self.feature_scale.shape)}"
            )
        std = std.detach().float()
        if not torch.isfinite(std).all():
            raise ValueError("feature std has non-finite entries")
        floor = std.median().clamp_min(1e-6) * floor_ratio
        with torch.no_grad():
            self.feature_scale.copy_(std.clamp_min(floor).to(self.feature_scale))

    def scale_features(self, raw: torch.Tensor) -> torch.Tensor:
        x = raw.to(self.dtype)
        return x if self.feature_scale is None else x / self.feature_scale.to(x.dtype)

    def features_from_target(self, feats: TargetFeatures) -> torch.Tensor:
        """The model-space feature of each target position (EAGLE-3: fused): step inputs [B, T, h]."""
        return self.scale_features(self.raw_target_features(feats))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._parts.embed_tokens(input_ids).to(self.dtype)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.layer_config)

    def step(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        position_ids: torch.Tensor,
        cache=None,
        attention_mask: torch.Tensor | None = None,
    ) -> DraftStep:
        """One drafting forward: ids [B, q] (token t+1), features [B, q, h] (model space), explicit positions [B, q].

        `cache` is the drafter's own transformers cache (new_cache()), extended in place. `attention_mask`
        is a float mask [B or 1, 1, q, past + q] (0 = see, dtype min = masked); None means a chain, each
        query seeing the whole cache and the queries before it.
        """
        if features.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"step features have width {features.shape[-1]}, the drafter's hidden size is {self.config.hidden_size}"
                " (EAGLE-3: fuse target features with features_from_target first)"
            )
        if position_ids.dim() == 1:
            position_ids = position_ids[None].expand(input_ids.shape[0], -1)
        if attention_mask is None:
            past = cache.get_seq_length() if cache is not None else 0
            attention_mask = eagle_attention.offset_causal_mask(
                input_ids.shape[1], past, self.dtype, input_ids.device
            )
        hidden = self.forward_hidden(input_ids, features, position_ids, attention_mask.to(self.dtype), cache)
        return DraftStep(feature=hidden, logits=self.logits(hidden))

    def forward_hidden(self, input_ids, features, position_ids, mask, cache, **attn_kwargs) -> torch.Tensor:
        embeds = self.embed(input_ids)
        features = features.to(self.dtype)
        rope = self.rotary_emb(features, position_ids)
        return self._layer(embeds, features, rope, position_ids, mask, cache, **attn_kwargs)

    def unroll(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        attention_mask: torch.Tensor,
        steps: int,
        pad_id: int = 0,
        anchors: torch.Tensor | None = None,
    ) -> list[UnrolledStep]:
        """Training-time test: `steps` draft steps from every anchor t at once.

        Step i at anchor t reads token t+1+i and step i-1's output feature at t (step 0: the target's
        feature f_t), sits at position t+i, and attends to step-0 keys s <= t plus its own chain at t:
        what drafting from anchor t sees. Its output predicts token t+2+i.
        Step 0 runs on every position (all are keys); steps >= 1 run only on `anchors` (bool [B, T],
        e.g. the positions whose chain stays inside an answer) when given: same results there, less work.
        """
        B, T = input_ids.shape
        block_mask = eagle_attention.causal_mask(attention_mask, self.dtype)
        cache = self.new_cache()
        positions = torch.arange(T, device=input_ids.device)[None].expand(B, -1)
        ids_0 = shift_left(input_ids, 1, fill=pad_id)
        hidden = self.forward_hidden(ids_0, features, positions, block_mask, cache, eagle_ttt_block=T)
        outs = [UnrolledStep(hidden, positions, attention_mask.bool())]
        if steps == 1:
            return outs
        if anchors is None:
            index, valid = positions, attention_mask.bool()
        else:
            index, valid = anchor_index(anchors)
        rows_mask = block_mask.gather(2, index[:, None, :, None].expand(-1, 1, -1, T))
        hidden = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
        for i in range(1, steps):
            ids_i = shift_left(input_ids, 1 + i, fill=pad_id).gather(1, index)
            hidden = self.forward_hidden(ids_i, hidden, index + i, rows_mask, cache, eagle_ttt_block=T)
            outs.append(UnrolledStep(hidden, index, valid))
        return outs

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    # ------------------------------------------------------------ save / load

    def hf_config(self) -> dict:
        """config.json: the target's single-layer config plus the engines' EAGLE keys and headway's own."""
        c = self.layer_config.to_dict()
        for k in list(c):
            if k.startswith("_") or k in ("transformers_version", eagle_attention.BASE_ATTENTION_ATTR):
                c.pop(k)
        c["num_hidden_layers"] = 1
        c["tie_word_embeddings"] = False  # SGLang ties an EAGLE-3 lm_head to embed_tokens otherwise
        c["torch_dtype"] = str(self.dtype).removeprefix("torch.")
        c.update(self._engine_keys())
        c["headway"] = {"format": FORMAT, "version": 1, **asdict(self.config)}
        return c

    def _engine_keys(self) -> dict:
        return {}

    def save_pretrained(self, folder: str | Path) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        tmp = folder / (WEIGHTS_FILE + ".tmp")
        save_file(state, str(tmp), metadata={"format": "pt"})
        tmp.replace(folder / WEIGHTS_FILE)
        (folder / CONFIG_FILE).write_text(json.dumps(self.hf_config(), indent=2, default=str) + "\n")
        return folder

    def _apply(self, fn, *args, **kwargs):
        # Casting the drafter (to bf16, say) must not cast the rotary frequencies: keep them fp32.
        out = super()._apply(fn, *args, **kwargs)
        bufs = self.rotary_emb._buffers
        for name, buf in bufs.items():
            if buf is not None and buf.is_floating_point() and buf.dtype != torch.float32:
                bufs[name] = buf.float()
        return out


class Eagle1Drafter(EagleDrafter):
    def __init__(self, config: EagleDrafterConfig, parts: TargetParts) -> None:
        super().__init__(config, parts)
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        layer = parts.layer_cls(self.layer_config, layer_idx=0)
        layer.input_layernorm = nn.Identity()  # EAGLE-1's layer 0 has no input norm (not saved)
        self.layers = nn.ModuleList([layer])

    @classmethod
    def from_target(
        cls,
        target: nn.Module,
        feature_source: str = "pre_norm",
        feature_norm: str = "none",
        target_name: str = "",
        fingerprint: dict | None = None,
    ) -> Eagle1Drafter:
        c = target.config
        config = EagleDrafterConfig(
            version=1,
            hidden_size=c.hidden_size,
            vocab_size=target.get_output_embeddings().weight.shape[0],
            num_target_layers=c.num_hidden_layers,
            model_type=c.model_type,
            feature_source=feature_source,
            feature_norm=feature_norm,
            target={"name": target_name, **({"fingerprint": fingerprint} if fingerprint else {})},
        )
        return cls(config, TargetParts.of(target)).to(target.get_input_embeddings().weight.device)

    def raw_target_features(self, feats: TargetFeatures) -> torch.Tensor:
        if self.config.feature_source == "post_norm":
            if feats.final_normed is None:
                raise ValueError("EAGLE-1 (post_norm) needs the target's final normed hidden state")
            return feats.final_normed
        (last,) = self.feature_spec().layers
        if last not in feats.layers:
            raise ValueError(
                f"EAGLE-1 needs the output of the target's last layer {last}; got layers {sorted(feats.layers)}"
            )
        return feats.layers[last]

    def _layer(self, embeds, features, rope, position_ids, mask, cache, **attn_kwargs):
        x = self.fc(torch.cat([embeds, features], dim=-1))
        return self.layers[0](
            x,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=rope,
            **cache_kwarg(self.layers[0], cache),
            **attn_kwargs,
        )

    def unscale(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden if self.feature_scale is None else hidden * self.feature_scale.to(hidden.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Predicted feature -> the target's own head: lm_head(final_norm(f)) (post_norm: lm_head(f))."""
        return self.target_logits(self.unscale(hidden))

    def target_logits(self, raw_feature: torch.Tensor) -> torch.Tensor:
        """The target's logits from its own (raw, unscaled) last feature; the soft labels of training."""
        x = raw_feature
        if self.config.feature_source == "pre_norm":
            x = self._parts.final_norm(x).to(raw_feature.dtype)
        w = self._parts.lm_head.weight
        return F.linear(x, w.to(x.dtype))

    def _engine_keys(self) -> dict:
        return {"architectures": ["EagleLlamaForCausalLM"], "model_type": self.layer_config.model_type}


class Eagle3Drafter(EagleDrafter):
    def __init__(
        self, config: EagleDrafterConfig, parts: TargetParts, vocab: DraftVocab | None = None
    ) -> None:
        super().__init__(config, parts)
        h = config.hidden_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        mid = parts.layer_cls(self.layer_config, layer_idx=0)
        attn = mid.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):  # the attention reads [embedding ; feature]: 2h wide
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * h, old.out_features, bias=old.bias is not None))
        eps = getattr(self.layer_config, "rms_norm_eps", 1e-6)
        mid.hidden_norm = parts.norm_cls(h, eps=eps)
        self.midlayer = mid
        self.norm = parts.norm_cls(h, eps=eps)
        v_out = config.draft_vocab_size or config.vocab_size
        self.lm_head = nn.Linear(h, v_out, bias=False)
        vocab = vocab or (
            DraftVocab.full(config.vocab_size)
            if v_out == config.vocab_size
            else DraftVocab(
                torch.arange(v_out, dtype=torch.int64), config.vocab_size
            )  # placeholder until loaded
        )
        if vocab.size != v_out or vocab.target_vocab_size != config.vocab_size:
            raise ValueError(
                f"draft vocabulary of {vocab.size} tokens over {vocab.target_vocab_size}; the drafter expects "
                f"{v_out} over {config.vocab_size}"
            )
        self.register_buffer("d2t", vocab.d2t.clone())
        self.register_buffer("t2d", vocab.t2d.clone())

    @classmethod
    def from_target(
        cls,
        target: nn.Module,
        feature_layers: list[int] | None = None,
        vocab: DraftVocab | None = None,
        feature_norm: str = "none",
        target_name: str = "",
        fingerprint: dict | None = None,
    ) -> Eagle3Drafter:
        """A fresh drafter; its norm and lm_head start as the target's final norm and lm_head rows of V'."""
        c = target.config
        lm_head = target.get_output_embeddings().weight
        V = lm_head.shape[0]
        if vocab is not None and vocab.target_vocab_size != V:
            raise ValueError(
                f"draft vocabulary built for a vocabulary of {vocab.target_vocab_size}, the target has {V}"
            )
        config = EagleDrafterConfig(
            version=3,
            hidden_size=c.hidden_size,
            vocab_size=V,
            num_target_layers=c.num_hidden_layers,
            model_type=c.model_type,
            feature_layers=list(feature_layers or default_feature_layers(c.num_hidden_layers)),
            feature_norm=feature_norm,
            draft_vocab_size=vocab.size if vocab is not None else V,
            target={"name": target_name, **({"fingerprint": fingerprint} if fingerprint else {})},
        )
        parts = TargetParts.of(target)
        drafter = cls(config, parts, vocab)
        with torch.no_grad():
            rows = lm_head.detach()[drafter.token_map.to(lm_head.device)]
            drafter.lm_head.weight.copy_(rows.float().cpu())
            drafter.norm.weight.copy_(parts.final_norm.weight.detach().float().cpu())
        return drafter.to(lm_head.device)

    @property
    def token_map(self) -> torch.Tensor:
        """int64 [V']: draft id -> target id."""
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    @property
    def draft_vocab(self) -> DraftVocab:
        return DraftVocab(self.token_map.cpu(), self.config.vocab_size)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def raw_target_features(self, feats: TargetFeatures) -> torch.Tensor:
        want = list(self.feature_spec().layers)
        missing = [i for i in want if i not in feats.layers]
        if missing:
            raise ValueError(
                f"EAGLE-3 needs target layer outputs {want}; missing {missing} (have {sorted(feats.layers)})"
            )
        return torch.cat([feats.layers[i] for i in want], dim=-1)

    def features_from_target(self, feats: TargetFeatures) -> torch.Tensor:
        return self.fc(self.scale_features(self.raw_target_features(feats)))

    def _layer(self, embeds, features, rope, position_ids, mask, cache, **attn_kwargs):
        mid = self.midlayer
        x = torch.cat([mid.input_layernorm(embeds), mid.hidden_norm(features)], dim=-1)
        attn, _ = mid.self_attn(
            hidden_states=x,
            position_embeddings=rope,
            attention_mask=mask,
            position_ids=position_ids,
            **cache_kwarg(mid.self_attn, cache),
            **attn_kwargs,
        )
        hidden = features + attn  # the residual is the (fused or fed-back) feature
        return hidden + mid.mlp(mid.post_attention_layernorm(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    def _engine_keys(self) -> dict:
        keys = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "draft_vocab_size": self.lm_head.out_features,
        }
        if self.config.hidden_size != self._parts.config.hidden_size:
            keys["target_hidden_size"] = self._parts.config.hidden_size
        return keys


# ---------------------------------------------------------------- loading


def load_drafter(
    folder: str | Path,
    target: nn.Module,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> EagleDrafter:
    """Load an EAGLE-1 or EAGLE-3 drafter folder onto `target` (checked: hidden size, vocabulary, layers)."""
    from safetensors.torch import load_file

    cfg_path, w_path = checkpoint_files(folder, "EAGLE drafter")
    raw = json.loads(cfg_path.read_text())
    own = raw.get("headway")
    if not isinstance(own, dict) or own.get("format") != FORMAT:
        raise ValueError(f"{cfg_path}: not a headway EAGLE drafter config (no 'headway.format: {FORMAT}')")
    known = set(EagleDrafterConfig.__dataclass_fields__)
    config = EagleDrafterConfig(**{k: v for k, v in own.items() if k in known})
    check_target_matches(config, target, str(folder))
    state = load_file(str(w_path))
    parts = TargetParts.of(target)
    if config.version == 3:
        if "d2t" not in state:
            raise ValueError(f"{w_path}: an EAGLE-3 drafter needs its d2t map")
        drafter = Eagle3Drafter(config, parts, DraftVocab.from_d2t(state["d2t"], config.vocab_size))
    else:
        drafter = Eagle1Drafter(config, parts)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{w_path}: missing weights {missing}, unexpected weights {unexpected}")
    drafter.to(device=device or target.get_input_embeddings().weight.device)
    if dtype is not None:
        drafter.to(dtype=dtype)
    return drafter.eval()
