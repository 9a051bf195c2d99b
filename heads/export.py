"""Export headway checkpoints to what vLLM and SGLang load, and load such folders back into headway.

    from headway.heads.export import export, load_exported
    export("runs/llama-3.1-8b-instruct/eagle3", to="vllm", out="exports/llama-3.1-8b-instruct/eagle3-vllm")
    drafter = load_exported("exports/llama-3.1-8b-instruct/eagle3-vllm", "vllm", target)  # same draft logits
    python scripts/export.py --checkpoint runs/smollm2-135m/eagle3 --to sglang --out exports/smollm2-eagle3-sglang

An engine folder is config.json + model.safetensors exactly as heads/engine_keys.py's table for the
(engine, method) says. It is written under a temporary name beside --out, checked against the table,
and only then renamed into place, so a refused or killed export leaves --out as it was.
config.json also carries a `headway_export` block (the source's headway config; engines ignore it).
Loading back reads the engine's own keys, plus the target for what they do not say.

What is exact, per (engine, method):
- Medusa -> vLLM: the same names and weights (heads/medusa.py already uses vLLM's names).
- EAGLE-1 -> vLLM / SGLang: the engines feed the target's final *normed* hidden state and take logits
  as the target's lm_head(feature), no norm, no scale. Only drafters trained with
  `eagle.feature_source: post_norm` and `eagle.feature_norm: none` have that graph; others are refused,
  as no rewrite of the weights reproduces them. SGLang's fc has a bias: a zero one is written.
- EAGLE-3 -> vLLM / SGLang: a per-dimension feature scale folds into fc (fc(f / s) = (W / s) f), so
  the folder has no `feature_scale` and loads back as a drafter with feature_norm none (equal logits up
  to float rounding of the fold; bit-identical without a scale).
Both engines build a Llama decoder layer for these drafters: a drafter of another layer type (Qwen2:
q/k/v biases) is refused.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from headway.heads.eagle import FORMAT as EAGLE_FORMAT
from headway.heads.eagle import EagleDrafterConfig, default_feature_layers, load_drafter
from headway.heads.engine_keys import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ExportError,
    check_folder,
    dims_from_config,
    method_of_config,
    read_config,
    table_for,
    weight_header,
)
from headway.heads.medusa import MedusaHeads, MedusaHeadsConfig
from headway.target import servable_target

TARGETS = ("vllm", "sglang", "hf")
EXPORT_BLOCK = "headway_export"
# Files of a training run that travel with an `hf` export (the rest, checkpoints/, stays behind).
RUN_FILES = ("run_config.json", "train_summary.json")
HEADWAY_ARCH = {"eagle1": ["EagleLlamaForCausalLM"], "eagle3": ["LlamaForCausalLMEagle3"]}
# Layer types the engines' EAGLE models reproduce: they build vLLM/SGLang's Llama decoder layer.
LLAMA_LAYERS = ("llama",)


@dataclass
class Checkpoint:
    """A headway checkpoint in memory: config.json (with its `headway` block) and the weights."""

    method: str  # medusa | eagle1 | eagle3
    config: dict
    state: dict[str, torch.Tensor]
    folder: Path | None = None  # where it was read from (None: converted from an engine folder)

    @property
    def own(self) -> dict:
        return self.config["headway"]

    @property
    def target_name(self) -> str:
        return (self.own.get("target") or {}).get("name") or "?"


@dataclass
class ExportResult:
    out: Path
    engine: str
    method: str
    notes: list[str] = field(default_factory=list)  # what the user must know (printed by the CLI)


# ---------------------------------------------------------------- reading headway checkpoints


def method_of_headway(config: dict, where: str) -> str:
    own = config.get("headway")
    if isinstance(own, dict) and own.get("format") == "medusa-heads":
        return "medusa"
    if isinstance(own, dict) and own.get("format") == EAGLE_FORMAT:
        return f"eagle{own.get('version')}"
    engine_method = method_of_config(config)
    hint = (
        f"; it looks like an engine export of a {engine_method} draft: pass --from vllm or --from sglang"
        if engine_method or EXPORT_BLOCK in config
        else ""
    )
    raise ExportError(f"{where}: not a headway checkpoint (no `headway` block with a known format){hint}")


def read_checkpoint(folder: str | Path) -> Checkpoint:
    from safetensors.torch import load_file

    folder = Path(folder)
    config = read_config(folder)
    method = method_of_headway(config, str(folder / CONFIG_FILE))
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise ExportError(f"{folder} has no {WEIGHTS_FILE}")
    return Checkpoint(method, config, load_file(str(weights)), folder)


# ---------------------------------------------------------------- headway -> engine


def engine_files(ckpt: Checkpoint, engine: str) -> tuple[dict, dict[str, torch.Tensor], list[str]]:
    """(config.json, weights, notes) of `ckpt` in `engine`'s format; refuses what the engine cannot run."""
    table_for(engine, ckpt.method)  # refuses a method the engine lacks (SGLang + Medusa)
    if ckpt.method == "medusa":
        return _medusa_files(ckpt)
    return _eagle_files(ckpt, engine)


def _provenance(ckpt: Checkpoint, engine: str, **extra) -> dict:
    return {"engine": engine, "method": ckpt.method, "from": copy.deepcopy(ckpt.own), **extra}


def _medusa_files(ckpt: Checkpoint):
    cfg = MedusaHeadsConfig.from_json(ckpt.config, "config.json")
    config = cfg.to_json()
    config.pop("headway")
    config[EXPORT_BLOCK] = _provenance(ckpt, "vllm")
    notes = []
    if ckpt.folder is not None and (ckpt.folder / "lora").is_dir():
        notes.append(
            "Medusa-2 checkpoint: these heads were trained with LoRA adapters on the target (lora/); serve the "
            "target with that adapter merged, or the heads read other hidden states than they learned"
        )
    return config, dict(ckpt.state), notes


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


def _eagle_files(ckpt: Checkpoint, engine: str):
    own, table = ckpt.own, table_for(engine, ckpt.method)
    name = f"EAGLE-{own['version']}"
    if own.get("model_type") not in LLAMA_LAYERS:
        raise ExportError(
            f"{name} drafter built on a {own.get('model_type')!r} decoder layer: {engine} builds a Llama layer "
            f"for {table.architectures[0]}, which would drop what differs (e.g. Qwen2's q/k/v biases)"
        )
    state = {k: v for k, v in ckpt.state.items() if k != "feature_scale"}
    scale = ckpt.state.get("feature_scale")
    notes: list[str] = []
    config = {k: v for k, v in ckpt.config.items() if k != "headway"}
    config.update(_legacy_rope(config))
    config.update(
        architectures=list(table.architectures),
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
    )
    extra = {}
    if ckpt.method == "eagle1":
        if own.get("feature_source") != "post_norm":
            raise ExportError(
                f"{name} drafter trained on the target's pre-norm features (eagle.feature_source: "
                f"{own.get('feature_source')}): {engine} feeds the final normed hidden state and computes logits "
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
    else:
        if scale is not None:
            w = state["fc.weight"]
            state["fc.weight"] = (w.float() / scale.float()[None, :]).to(w.dtype)
            extra["folded_feature_scale"] = True
        config["draft_vocab_size"] = int(own.get("draft_vocab_size") or own["vocab_size"])
        config["target_hidden_size"] = int(
            own["hidden_size"]
        )  # the drafter's fc reads 3 target-sized features
        layers = list(own["feature_layers"])
        if layers != default_feature_layers(own["num_target_layers"]):
            # Layer ids: vLLM counts the input of layer i as i (as headway does); SGLang captures id + 1.
            if engine == "vllm":
                config["eagle_aux_hidden_state_layer_ids"] = layers
            else:
                config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]}
            notes.append(
                f"feature layers {layers} differ from the engines' default {default_feature_layers(own['num_target_layers'])}: "
                f"written for {engine}, but engine versions that predate configurable EAGLE-3 layers ignore it"
            )
    config[EXPORT_BLOCK] = _provenance(ckpt, engine, **extra)
    return config, state, notes


def expected_dims(ckpt: Checkpoint):
    """The sizes the exported config must declare, from the source's `headway` block and layer config."""
    own = ckpt.own
    if ckpt.method == "medusa":
        return dims_from_config("medusa", MedusaHeadsConfig.from_json(ckpt.config, "config.json").to_json())
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
    layers = None
    if method == "eagle3":
        if dims.target_hidden != dims.hidden:
            raise ExportError(
                f"{where}: target_hidden_size={dims.target_hidden} differs from hidden_size={dims.hidden}; "
                "headway's EAGLE-3 drafter has the target's hidden size"
            )
        if engine == "vllm" and config.get("eagle_aux_hidden_state_layer_ids"):
            layers = list(config["eagle_aux_hidden_state_layer_ids"])
        elif engine == "sglang" and (config.get("eagle_config") or {}).get(
            "eagle_aux_hidden_state_layer_ids"
        ):
            layers = [i + 1 for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        else:
            layers = default_feature_layers(num_layers)
    own = EagleDrafterConfig(
        version=1 if method == "eagle1" else 3,
        hidden_size=dims.hidden,
        vocab_size=dims.vocab,
        num_target_layers=num_layers,
        model_type=model_type,
        feature_layers=layers or [],
        # The engines' EAGLE-1 graph: normed target features in, lm_head(feature) out.
        feature_source="post_norm" if method == "eagle1" else source.get("feature_source", "pre_norm"),
        feature_norm="none",  # a scale never reaches an engine folder (refused, or folded into fc)
        draft_vocab_size=dims.draft_vocab if method == "eagle3" else None,
        target=target,
    )
    drop = (EXPORT_BLOCK, "eagle_config", "eagle_aux_hidden_state_layer_ids")
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


def write_headway(ckpt: Checkpoint, folder: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in ckpt.state.items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(ckpt.config, indent=2, default=str) + "\n")


def load_exported(folder: str | Path, engine: str, target=None, device=None, dtype=None):
    """An engine folder back as a headway object (MedusaHeads, Eagle1Drafter or Eagle3Drafter).

    EAGLE needs the target (shared embedding, lm_head, layer class); Medusa checks it when given.
    """
    folder = Path(folder)
    if method_of_config(read_config(folder)) != "medusa":
        if target is None:
            raise ExportError(f"{folder}: loading an EAGLE drafter needs its target")
        check_layer_config(folder, read_config(folder), target)
    ckpt = to_headway(folder, engine, target.config if target is not None else None)
    with tempfile.TemporaryDirectory() as tmp:
        write_headway(ckpt, Path(tmp))
        if ckpt.method == "medusa":
            return MedusaHeads.from_pretrained(tmp, target=target, device=device, dtype=dtype)
        return load_drafter(tmp, target, device=device, dtype=dtype)


# ---------------------------------------------------------------- writing folders


def cast_floats(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Floating weights to `dtype`; the int64/bool maps (d2t, t2d, token_map) stay as they are."""
    if dtype is None:
        return state
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def check_out(out: Path, force: bool, source: Path | None) -> None:
    if source is not None:
        o, s = out.resolve(), source.resolve()
        if o == s or o in s.parents:
            raise ExportError(f"--out {out} is the checkpoint folder or holds it: choose another folder")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} is not empty: choose another folder, or pass --force to replace it")


def _public(folder: Path) -> None:
    """The umask's permissions, not mkdtemp's 0700: a serving engine may run as another user."""
    mask = os.umask(0)
    os.umask(mask)
    for p in [folder, *folder.rglob("*")]:
        p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def write_atomically(out: Path, write, check) -> None:
    """write(tmp) then check(tmp) in a temporary folder beside `out`; only a checked folder replaces `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        _public(tmp)
        check(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def export(
    checkpoint: str | Path | Checkpoint,
    to: str,
    out: str | Path,
    force: bool = False,
    dtype: torch.dtype | None = None,
    report: str | Path | None = None,
) -> ExportResult:
    """Write `checkpoint` (a headway folder, or a Checkpoint from to_headway) for `to` into `out`."""
    from safetensors.torch import save_file

    if to not in TARGETS:
        raise ExportError(f"--to {to!r}: choose one of {', '.join(TARGETS)}")
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    out = Path(out)
    check_out(out, force, ckpt.folder)
    if to == "hf":
        return _export_hf(ckpt, out, dtype, report)

    config, state, notes = engine_files(ckpt, to)
    state = cast_floats(state, dtype)
    if dtype is not None and ckpt.method != "medusa":
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    want = expected_dims(ckpt)

    def write(tmp: Path) -> None:
        save_file(
            {k: v.contiguous() for k, v in state.items()}, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"}
        )
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str) + "\n")

    write_atomically(out, write, lambda tmp: check_folder(tmp, to, ckpt.method, expect=want))
    return ExportResult(out, to, ckpt.method, notes)


def _export_hf(ckpt: Checkpoint, out: Path, dtype, report) -> ExportResult:
    from headway.heads.model_card import find_report, model_card

    state = cast_floats(ckpt.state, dtype)
    report_path = find_report(ckpt.folder, report)
    run_files = [ckpt.folder / n for n in RUN_FILES if ckpt.folder and (ckpt.folder / n).is_file()]
    lora = ckpt.folder / "lora" if ckpt.folder and (ckpt.folder / "lora").is_dir() else None
    notes = [f"model card with the measured speed from {report_path}"] if report_path else []
    if report_path is None:
        notes.append("no report.json found beside the checkpoint: the model card has no measured speed")

    def write(tmp: Path) -> None:
        write_headway(Checkpoint(ckpt.method, ckpt.config, state), tmp)
        for f in run_files:
            shutil.copy2(f, tmp / f.name)
        if lora is not None:
            shutil.copytree(lora, tmp / "lora")
        if report_path is not None:
            shutil.copy2(report_path, tmp / "report.json")
        (tmp / "README.md").write_text(model_card(ckpt, report_path))

    def check(tmp: Path) -> None:
        method_of_headway(read_config(tmp), str(tmp / CONFIG_FILE))
        have = weight_header(tmp / WEIGHTS_FILE)
        if set(have) != set(state):
            diff = sorted(set(have) ^ set(state))
            raise ExportError(f"{tmp / WEIGHTS_FILE}: keys differ from the checkpoint's: {diff}")
        for k, v in state.items():
            if have[k][0] != tuple(v.shape):
                raise ExportError(
                    f"{tmp / WEIGHTS_FILE}: key {k!r} has shape {list(have[k][0])}, the checkpoint {list(v.shape)}"
                )

    write_atomically(out, write, check)
    return ExportResult(out, "hf", ckpt.method, notes)


# ---------------------------------------------------------------- how to serve an exported folder


def serve_command(method: str, engine: str, folder: str, target: str, num_heads: int = 5) -> str:
    """The engine command line that serves `target` with the exported draft in `folder`."""
    target = servable_target(target)  # a built-in name means nothing to an engine: its folder or Hub id
    if engine == "vllm":
        name = {"medusa": "medusa", "eagle1": "eagle", "eagle3": "eagle3"}[method]
        k = num_heads if method == "medusa" else 3
        spec = json.dumps({"method": name, "model": folder, "num_speculative_tokens": k})
        return f"vllm serve {target} --speculative-config '{spec}'"
    algo = {"eagle1": "EAGLE", "eagle3": "EAGLE3"}[method]
    return (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm {algo} "
        f"--speculative-draft-model-path {folder} --speculative-num-steps 3 --speculative-eagle-topk 4 "
        "--speculative-num-draft-tokens 16"
    )
