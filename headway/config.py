"""Typed YAML configs: one file per target model and method.

    from headway.config import load_config
    cfg = load_config("configs/smollm2-135m/medusa.yaml", ["train.lr=5e-4"])

A YAML may start with `base: other.yaml` (relative to its own folder); its keys are
merged under the file's own, so the data mix lives once and every recipe inherits it.
Unknown keys, missing required keys and wrong types are errors that name the key and file.
Values are read by the key's declared type: only `true`/`false` are booleans when the YAML is read
(`mixed_precision: no` is the string "no"), a bool key also takes yes/no/on/off, and an override of a
string key takes its text as written (`eval.output_dir=2024`).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A config file or override does not fit the schema."""


# ---------------------------------------------------------------- schema


@dataclass
class TargetConfig:
    # "smollm2-135m-instruct" (built in, prepared offline), a Hugging Face id, or a local folder.
    name: str = "smollm2-135m-instruct"
    # auto: bf16 where supported (CUDA; a CPU with oneDNN bf16 kernels, where it is faster), else fp32.
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    # bf16 on a CPU: keep every linear weight pre-packed for oneDNN (headway/packed.py; same results, faster
    # decoding). Elsewhere it does nothing.
    pack_weights: bool = True
    # A Jinja chat template file for targets whose tokenizer has none (Vicuna). Paths are relative to the repo root.
    chat_template: str | None = None
    # Architecture facts, for the GPU configs: checked against the loaded model's config.
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    vocab_size: int | None = None


@dataclass
class SourceConfig:
    domain: str  # chat, code, math, translation, summarization, qa, general, ...
    # file: prompts read from `path`, a local .json/.jsonl file (relative to the repo root) or a HF dataset id.
    # context: prompts assembled from the passage file at `path` (data/prompts/passages/) and `task`.
    # self_written: the target writes the user turns itself (Magpie), steered by `task`; no path.
    kind: Literal["file", "context", "self_written"] = "file"
    path: str | None = None
    num_prompts: int | None = None  # None: all usable prompts
    split: str = "train"  # for HF dataset ids
    # How a row becomes turns. auto recognises: turns, conversations/messages, instruction(+input), question, prompt.
    format: Literal["auto", "turns", "conversations", "instruction", "question", "prompt"] = "auto"
    name: str | None = None  # short name recorded per row; default: file stem (kind file), else kind_domain
    # context: summarize | translate | qa. self_written: a short description of what users ask for, shown to
    # the target as its system turn while it writes the user turn (None: the template's own system turn).
    task: str | None = None
    languages: list[str] = field(default_factory=list)  # translate: pairs such as de-en, en-fr
    passages: int = 3  # qa: passages shown before the question (one holds the answer)
    min_words: int = 3  # prompts (self_written) or passages (context) with fewer words are dropped
    max_words: int = 400
    turns: int = 1  # self_written: user turns per conversation; later ones follow the target's own answer
    temperature: float = 0.8  # self_written: sampling of the user turns (seeded by data.seed)
    top_p: float = 0.95
    max_tokens: int = 160  # self_written: a user turn not ended within this many tokens is dropped


@dataclass
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    batch_size: int = 32
    max_prompt_tokens: int = 1024  # longer prompts are skipped and counted, never truncated
    max_turns: int = 2
    shard_size: int = 256  # conversations per resumable shard
    # local: the target here, continuous batching (data/generate.py). server: an OpenAI-compatible server
    # (vLLM, SGLang, llama.cpp's llama-server) at server_url, sent token ids and read back token ids
    # (data/server.py); batch_size requests in flight. A server keeps no hidden states: the first offline
    # recipe then extracts what data.features names in one pass (scripts/cache_features.py).
    backend: Literal["local", "server"] = "local"
    server_url: str | None = None  # e.g. http://127.0.0.1:8000
    server_api: Literal["openai", "llamacpp"] = "openai"  # /v1/completions, or llama.cpp's own /completion
    server_model: str | None = None  # the model name the server expects (openai); None: the server's only model


@dataclass
class DataConfig:
    output_dir: str = "runs/data"
    sources: list[SourceConfig] = field(default_factory=list)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    max_prompts_per_source: int | None = None  # caps every source's num_prompts (quick runs)
    val_fraction: float = 0.05
    seed: int = 0
    # Hidden states kept while generating, in <output_dir>/features: one cache every offline recipe of a
    # head named here trains from (no extraction pass; with a server backend, one extraction pass writes
    # them all). Names: medusa (final normed state), eagle (EAGLE-1: the last layer before the norm),
    # eagle3 (EAGLE-3's default three layers + final normed), final_normed, layer.N (decoder layer N's
    # output, 0-based: headway/features.py's numbering). Empty: none kept.
    features: list[str] = field(default_factory=list)


@dataclass
class MedusaConfig:
    num_heads: int = 4
    num_layers: int = 1
    draft_vocab_size: int | None = None  # None: the full target vocabulary
    loss_decay: float = 0.8  # w_k = decay^k
    lora: bool = False  # Medusa-2: train LoRA adapters on the target too
    lora_r: int = 32
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    medusa2_lambda: float = 0.2  # weight of the heads' loss next to the target's KL
    heads_only_steps: int = 0  # Medusa-2 stage 1: train the heads alone for this many steps
    lora_lr_ratio: float = 0.25  # adapters' lr = train.lr * this
    fc_bias: bool = True  # bias in the residual blocks' linears (the original Medusa has one)
    # Medusa-1: this share of each head's CE is against the target's distribution instead of its token.
    soft_label_weight: float = 0.0
    # offline: the target's final normed states are extracted once into feature_cache_dir (Medusa-1 only),
    # so every epoch after the first costs only the heads.
    hidden_states: Literal["online", "offline"] = "online"
    feature_cache_dir: str | None = None


@dataclass
class EagleConfig:
    version: Literal[1, 3] = 1
    # EAGLE-3 feature layers; None: [2, L // 2, L - 3] as in the reference.
    feature_layers: list[int] | None = None
    draft_vocab_size: int | None = None  # EAGLE-3 reduced vocabulary; None: full target vocabulary
    feature_norm: Literal["none", "per_dim"] = "per_dim"
    feature_loss_weight: float = 1.0  # EAGLE-1 SmoothL1 weight
    token_loss_weight: float = 0.1  # EAGLE-1 CE weight
    noise: float = 0.2  # uniform noise amplitude on input features (EAGLE-1)
    unroll_steps: int = 7  # EAGLE-3 training-time test
    step_decay: float = 0.8
    hidden_states: Literal["online", "offline"] = "online"
    feature_cache_dir: str | None = None
    # EAGLE-1's feature: the last layer before the final norm (the issue's choice) or after it (what the
    # EAGLE-1 reference trains on and vLLM's EAGLE-1 feeds its drafter).
    feature_source: Literal["pre_norm", "post_norm"] = "pre_norm"
    norm_stats_rows: int = 256  # online mode: train rows the per-dimension feature statistics come from
    # EAGLE-3: scale the fresh drafter's norm (copied from the target) to the least over-confident start.
    calibrate_init: bool = True


@dataclass
class TrainConfig:
    output_dir: str = "runs/train"
    dataset_dir: str | None = None  # default: data.output_dir
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_ratio: float = 0.05
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 8  # sequences per device per micro-batch
    grad_accum: int = 1
    max_seq_len: int = 2048
    grad_clip: float = 1.0
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "no"  # auto: bf16 where its matmuls are fast
    log_every: int = 10
    eval_every: int = 200
    save_every: int = 200
    keep_checkpoints: int = 2
    resume: Literal["auto", "never"] = "auto"
    report_to: Literal["none", "wandb", "tensorboard"] = "none"
    wandb_project: str = "headway"
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    seed: int = 0
    num_workers: int = 0
    group_by_length: bool = True  # batch rows of similar length together (far less padding), order still random
    max_eval_rows: int | None = None  # cap on validation rows per evaluation; None: the whole split
    log_row_ids: bool = False  # write which dataset rows each rank trained on (rows_rank{r}.jsonl)
    # After the last step, score the validation split per depth (scripts/head_accuracy.py) and save
    # head_accuracy.json beside the heads: the measured profile `tree_budget: auto` builds trees from.
    accuracy_profile: bool = True


@dataclass
class LookupConfig:
    """Prompt lookup (inference/drafters/lookup.py): continuations of n-gram matches in the prompt and the answer so far."""

    max_ngram: int = 4  # longest suffix matched (tried first)
    min_ngram: int = 1  # shortest suffix matched
    max_tokens: int = 10  # tokens per candidate continuation
    num_candidates: int = 3  # distinct continuations per step, merged into a trie
    # A candidate found by an n-token match drafts at most this x n tokens (None: max_tokens always).
    # Short matches are wrong more often: first-token acceptance 0.29 / 0.50 / 0.66 / 0.84 for n = 1..4
    # on Spec-Bench (36 prompts, SmolLM2), so long drafts after a 1-token match mostly buy verify cost.
    # Replayed on those answers: tokens per unit of verify cost +13% where 32 new tokens cost 1.9x one
    # (2-core CPU, no AMX), -2% where they cost 1.2x (AMX): on such machines and GPUs, set null.
    # Lookup alone only: a fused tree takes every candidate whole and prices each node by its match length.
    tokens_per_ngram: int | None = 3

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram {self.min_ngram}, max_ngram {self.max_ngram}")
        if self.tokens_per_ngram is not None and self.tokens_per_ngram < 1:
            raise ValueError(f"tokens_per_ngram must be >= 1 or null, got {self.tokens_per_ngram}")
        for name in ("max_tokens", "num_candidates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class InferenceConfig:
    # Where draft tokens come from: the recipe's trained heads (drafter), prompt lookup alone (lookup), or
    # the heads' tree with lookup candidates merged in, nodes split per step by what each accepts (fused).
    drafter: Literal["drafter", "lookup", "fused"] = "drafter"
    lookup: LookupConfig = field(default_factory=LookupConfig)
    tree: Literal["auto", "chain", "static", "dynamic"] = "auto"  # auto: static for Medusa, dynamic for EAGLE
    tree_budget: int | Literal["auto"] = "auto"  # nodes verified per step
    # Deepest draft node. With tree_budget auto, a dynamic tree of a drafter that runs one forward per
    # level (EAGLE, layer-skip) may get a shallower depth once that forward's cost is measured.
    depth: int = 5
    top_k: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    acceptance: Literal["exact", "typical"] = "exact"
    sample_top_k: int = 0  # sampling top-k, applied to target and drafter alike (0: off)
    children: Literal["topk", "sample"] = "topk"  # static trees when sampling: top-k ranks or draws from q
    tree_paths: str | None = None  # JSON list of paths for tree: static (default: built from accuracies)
    accuracy_file: str | None = None  # head_accuracy.json (default: CHECKPOINT/head_accuracy.json if present)
    max_budget: int = 127  # largest tree tree_budget: auto may choose
    typical_threshold: float = 0.09  # Medusa typical acceptance (not lossless)
    typical_alpha: float = 0.3
    # int8 drafter weights on a CPU (headway/int8.py): a draft forward reads a quarter of fp32's bytes. The
    # target verifies with its own weights, so outputs are unchanged; acceptance may move (measure it).
    # Nothing is quantised on CUDA, nor for layer_skip (its layers are the target's).
    draft_quantization: Literal["none", "int8"] = "none"


@dataclass
class EvalConfig:
    questions: str = "data/prompts/spec_bench/question.jsonl"
    per_domain: int = 10
    max_new_tokens: int = 128
    output_dir: str | None = None
    pld_num_tokens: int = 10  # HF prompt-lookup baseline (prompt_lookup_num_tokens)
    seed: int = 0
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 8])  # scripts/bench_batch.py


@dataclass
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    data: DataConfig = field(default_factory=DataConfig)
    medusa: MedusaConfig | None = None
    eagle: EagleConfig | None = None
    train: TrainConfig = field(default_factory=TrainConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Where the file came from, for messages and relative paths; not a YAML key.
    source_file: str | None = field(default=None, metadata={"internal": True})

    @property
    def method(self) -> str:
        if self.medusa is not None:
            return "medusa"
        if self.eagle is not None:
            return f"eagle{self.eagle.version}" if self.eagle.version != 1 else "eagle"
        return "data"


# ---------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """YAML with only true/false as booleans: YAML 1.1 also reads yes/no/on/off as booleans."""


_BOOL_TAG = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_BOOL_WORDS = {"yes": True, "no": False, "on": True, "off": False, "true": True, "false": False}


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)


class _OverrideText(str):
    """A command-line value: read as YAML for typed keys, taken as written for string keys."""


def load_config(path: str | Path, overrides: list[str] | None = None, schema: type = Config) -> Any:
    """Read a YAML (following `base:`), apply `section.key=value` overrides, build the dataclass."""
    path = Path(path)
    raw = _read_yaml_with_base(path, seen=())
    for item in overrides or []:
        _apply_override(raw, item, path)
    cfg = from_dict(schema, raw, where=str(path))
    if hasattr(cfg, "source_file"):
        cfg.source_file = str(path)
    return cfg


def _read_yaml_with_base(path: Path, seen: tuple[Path, ...]) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: `base:` chain loops back to itself")
    try:
        raw = _yaml(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    parent = _read_yaml_with_base(path.parent / base, seen + (path.resolve(),))
    return _merge(parent, raw)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _apply_override(raw: dict, item: str, path: Path) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form section.key=value")
    dotted, value = item.split("=", 1)
    keys = dotted.strip().split(".")
    node = raw
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {k!r} is not a section in {path}")
    node[keys[-1]] = _OverrideText(value) if value.strip() else None


def from_dict(cls: type, data: Any, where: str, key: str = "") -> Any:
    """Build dataclass `cls` from `data`, naming the key and file on any mismatch."""
    label = key or "<top level>"
    if isinstance(data, _OverrideText):
        data = _parse_override(data, where, label)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {label} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{key}." if key else ""
        known = ", ".join(sorted(fields))
        raise ConfigError(f"{where}: unknown key {prefix + unknown[0]!r} (known keys here: {known})")
    kwargs = {}
    for name, f in fields.items():
        sub = f"{key}.{name}" if key else name
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], where, sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: missing required key {sub!r}")
    try:
        return cls(**kwargs)
    except ValueError as e:  # a dataclass's own check of its values (__post_init__)
        raise ConfigError(f"{where}: {label}: {e}") from e


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _parse_override(text: str, where: str, key: str) -> Any:
    try:
        return _yaml(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", e)
        raise ConfigError(f"{where}: override of {key!r}: {text!r} is not valid YAML ({problem})") from e


def _takes_text(tp: Any, text: str) -> bool:
    """Whether `tp` accepts `text` as a string (str, a Literal naming it, a union with either)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_takes_text(arm, text) for arm in typing.get_args(tp))
    if origin is Literal:
        return text in typing.get_args(tp)
    return tp in (str, Any)


def _coerce(tp: Any, value: Any, where: str, key: str) -> Any:
    if isinstance(value, _OverrideText):
        text = str(value)
        try:
            return _coerce(tp, _parse_override(text, where, key), where, key)
        except ConfigError:
            if _takes_text(tp, text):
                return text
            raise
    origin = typing.get_origin(tp)
    err = ConfigError(f"{where}: key {key!r} expects {_type_name(tp)}, got {value!r} ({type(value).__name__})")
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            if dataclasses.is_dataclass(arm) and isinstance(value, dict):
                return from_dict(arm, value, where, key)  # a section: its own error names the inner key
            try:
                return _coerce(arm, value, where, key)
            except ConfigError:
                continue
        raise err
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise err
    if tp is type(None):
        if value is None:
            return None
        raise err
    if origin is list:
        if not isinstance(value, list):
            raise err
        (inner,) = typing.get_args(tp)
        return [_coerce(inner, v, where, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        raise err
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise err
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise err from None
        raise err
    if tp is str:
        if isinstance(value, str):
            return value
        raise err
    if tp is Any:
        return value
    raise ConfigError(f"{where}: key {key!r} has an unsupported type {tp!r} in the schema")
