"""What each serving engine loads for each draft method: weights (name, shape, dtype) and config keys.

    from headway.export.engine_keys import TABLES, dims_from_config
    dims = dims_from_config("eagle3", json.load(open("exports/eagle3-vllm/config.json")))
    for name, (shape, dtype) in TABLES[("vllm", "eagle3")].expected(dims).items(): print(name, shape, dtype)

A weight the file lacks stays as the engine initialised it, without an error, and a name the engine
does not expect is skipped without a word by SGLang's EAGLE-3 loader and by vLLM up to 0.32 (vLLM 0.33
raises, except for names ending in `.bias`), so a wrongly named export may draft garbage silently.
These tables are the contract: export writes to them and checks the written folder against them
(export/check.py); `--from` checks a folder against them before loading it back. One table per
(engine, method), shared by every release range of that engine; what changed between releases is in
export/releases.py. Shapes are functions of the draft config's sizes (`Dims`), which come from the
folder's own config.json.

Checked against these loader sources (read, not copied; repo, path @ commit):
- vLLM Medusa: vllm-project/vllm vllm/model_executor/models/medusa.py
  @ 09cddad8f0324594022359cd2b07e962a14b895f (names identical @ 01dbb08195ca9c70ac9044786a906a353e07fcdf);
  config: vllm/transformers_utils/configs/medusa.py @ 4bb77b3239adff81001f12cd9c9a39b65800a373
  (and @ 0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f).
- vLLM EAGLE-1: vllm/model_executor/models/llama_eagle.py @ e1c4a55214c63e19e83f82ad6c552d82148bae0b;
  architecture naming: vllm/transformers_utils/configs/eagle.py @ 23c5aa92d517802488a0c77a5f58cd0a2019c5a3.
- vLLM EAGLE-3: vllm/model_executor/models/llama_eagle3.py @ 583507d13075783a12ccbd774575974d10ca4959.
- SGLang EAGLE-1: sgl-project/sglang python/sglang/srt/models/llama_eagle.py
  @ 3b64d5dee0756de843b5f022966f69c995cd15ea.
- SGLang EAGLE-3: python/sglang/srt/models/llama_eagle3.py @ d737979cbd17c6162f39c1953cfa72d3d23cc0d0.
SGLang has no Medusa model, so there is no (sglang, medusa) table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CONFIG_FILE = "config.json"
# config.json block of an engine export: where it came from (the source's `headway` block); engines ignore it.
EXPORT_BLOCK = "headway_export"
LAYER_IDS = "eagle_aux_hidden_state_layer_ids"  # EAGLE-3 feature layers, in each engine's numbering
WEIGHTS_FILE = "model.safetensors"
# Files an engine would read weights from besides ours: a stray one would be loaded too.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")

FLOAT, INT64, BOOL = "float", "int64", "bool"

ENGINES = ("vllm", "sglang")
METHODS = ("medusa", "eagle1", "eagle3")


class ExportError(ValueError):
    """A folder does not match what an engine loads, or a checkpoint cannot be exported exactly."""


@dataclass(frozen=True)
class Dims:
    """The sizes a table's shapes are functions of (0 where a method has no such size)."""

    hidden: int  # h: the draft's hidden size
    vocab: int  # V: the target's vocabulary
    draft_vocab: int = 0  # V': Medusa truncated_vocab_size, EAGLE-3 draft_vocab_size
    intermediate: int = 0  # I: MLP width (EAGLE)
    heads: int = 0  # attention heads (EAGLE)
    kv_heads: int = 0  # key/value heads (EAGLE)
    head_dim: int = 0  # d (EAGLE)
    target_hidden: int = 0  # the target's hidden size, read by EAGLE-3's fc
    num_heads: int = 0  # Medusa heads K
    num_layers: int = 0  # Medusa residual layers per head
    fc_bias: bool = False  # Medusa `medusa_fc_bias`


@dataclass(frozen=True)
class Entry:
    """One required weight; `{i}` ranges over Medusa heads, `{j}` over the layers of a head."""

    name: str
    shape: str  # the formula, for messages and docs
    size: Callable[[Dims], tuple[int, ...]]
    dtype: str = FLOAT
    when: Callable[[Dims], bool] | None = None  # required only when true, unexpected otherwise

    def expand(self, d: Dims) -> dict[str, tuple[tuple[int, ...], str]]:
        if self.when is not None and not self.when(d):
            return {}
        heads = range(d.num_heads) if "{i}" in self.name else [0]
        layers = range(d.num_layers) if "{j}" in self.name else [0]
        return {self.name.format(i=i, j=j): (self.size(d), self.dtype) for i in heads for j in layers}


@dataclass(frozen=True)
class Source:
    repo: str
    path: str
    commit: str


@dataclass(frozen=True)
class EngineTable:
    engine: str
    method: str
    architectures: tuple[str, ...]  # config.json `architectures` the engine dispatches on
    entries: tuple[Entry, ...]
    config_values: dict  # config.json keys with the value the loader needs
    config_required: tuple[str, ...]  # config.json keys that must be present (sizes)
    config_forbidden: tuple[str, ...]  # keys that must be absent or false (they change the graph)
    sources: tuple[Source, ...]

    def expected(self, d: Dims) -> dict[str, tuple[tuple[int, ...], str]]:
        out: dict[str, tuple[tuple[int, ...], str]] = {}
        for e in self.entries:
            out.update(e.expand(d))
        return out

    def entry_of(self, name: str) -> Entry | None:
        """The entry a weight name instantiates (None for a name outside the table)."""
        return next((e for e in self.entries if _matches(e.name, name)), None)


def _matches(pattern: str, name: str) -> bool:
    a, b = pattern.split("."), name.split(".")
    if len(a) != len(b):
        return False
    return all(x == y or (x in ("{i}", "{j}") and y.isdigit()) for x, y in zip(a, b, strict=True))


# ---------------------------------------------------------------- the tables

_VLLM = "vllm-project/vllm"
_SGL = "sgl-project/sglang"


def _llama_layer(prefix: str, qkv_width: int, input_norm: bool, extra_norms: tuple[str, ...] = ()):
    """A Llama decoder layer as the engines' loaders name it (q/k/v and gate/up are stacked at load time).

    qkv_width: q/k/v read qkv_width * h inputs (EAGLE-3: 2, the [embedding ; feature] concatenation).
    """
    q = lambda d: (d.heads * d.head_dim, qkv_width * d.hidden)  # noqa: E731
    kv = lambda d: (d.kv_heads * d.head_dim, qkv_width * d.hidden)  # noqa: E731
    wide = "h" if qkv_width == 1 else f"{qkv_width}h"
    out = [
        Entry(f"{prefix}.self_attn.q_proj.weight", f"[heads*head_dim, {wide}]", q),
        Entry(f"{prefix}.self_attn.k_proj.weight", f"[kv_heads*head_dim, {wide}]", kv),
        Entry(f"{prefix}.self_attn.v_proj.weight", f"[kv_heads*head_dim, {wide}]", kv),
        Entry(
            f"{prefix}.self_attn.o_proj.weight",
            "[h, heads*head_dim]",
            lambda d: (d.hidden, d.heads * d.head_dim),
        ),
        Entry(f"{prefix}.mlp.gate_proj.weight", "[I, h]", lambda d: (d.intermediate, d.hidden)),
        Entry(f"{prefix}.mlp.up_proj.weight", "[I, h]", lambda d: (d.intermediate, d.hidden)),
        Entry(f"{prefix}.mlp.down_proj.weight", "[h, I]", lambda d: (d.hidden, d.intermediate)),
        Entry(f"{prefix}.post_attention_layernorm.weight", "[h]", lambda d: (d.hidden,)),
    ]
    norms = (("input_layernorm",) if input_norm else ()) + extra_norms
    out += [Entry(f"{prefix}.{n}.weight", "[h]", lambda d: (d.hidden,)) for n in norms]
    return tuple(out)


MEDUSA_ENTRIES = (
    Entry("blocks.{i}.layers.{j}.weight", "[h, h]", lambda d: (d.hidden, d.hidden)),
    Entry("blocks.{i}.layers.{j}.bias", "[h]", lambda d: (d.hidden,), when=lambda d: d.fc_bias),
    Entry("lm_heads.{i}.weight", "[V', h]", lambda d: (d.draft_vocab, d.hidden)),
    # Read only when truncated_vocab_size < vocab_size; then vLLM scatters logits to these target ids.
    Entry("token_map", "[V']", lambda d: (d.draft_vocab,), INT64, when=lambda d: d.draft_vocab < d.vocab),
)

# layer 0 has no input_layernorm (the engines replace it by the identity); embedding and lm_head are the target's.
EAGLE1_ENTRIES = (
    Entry("fc.weight", "[h, 2h]", lambda d: (d.hidden, 2 * d.hidden)),
    *_llama_layer("layers.0", 1, input_norm=False),
)

EAGLE3_ENTRIES = (
    Entry("fc.weight", "[h, 3*target_h]", lambda d: (d.hidden, 3 * d.target_hidden)),
    *_llama_layer("midlayer", 2, input_norm=True, extra_norms=("hidden_norm",)),
    Entry("norm.weight", "[h]", lambda d: (d.hidden,)),
    Entry("lm_head.weight", "[V', h]", lambda d: (d.draft_vocab, d.hidden)),
    # target id = draft id + d2t[draft id]. Only with a reduced vocabulary: with V' = V vLLM >= 0.31 has
    # no parameter to load d2t into (it raises), and without d2t every engine maps draft id = target id.
    Entry("d2t", "[V']", lambda d: (d.draft_vocab,), INT64, when=lambda d: d.draft_vocab < d.vocab),
    Entry("t2d", "[V]", lambda d: (d.vocab,), BOOL, when=lambda d: d.draft_vocab < d.vocab),
)

# Sizes, and the values that change the layer's output without changing a shape.
_EAGLE_CONFIG = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "rms_norm_eps",
    "rope_theta",
)
# Biased projections: the engines' EAGLE layers are built without biases (vLLM/SGLang EAGLE-3 qkv bias=False).
_EAGLE_FORBIDDEN = ("attention_bias", "mlp_bias")

TABLES: dict[tuple[str, str], EngineTable] = {
    ("vllm", "medusa"): EngineTable(
        engine="vllm",
        method="medusa",
        architectures=("MedusaModel",),
        entries=MEDUSA_ENTRIES,
        config_values={"model_type": "medusa"},
        config_required=(
            "hidden_size",
            "vocab_size",
            "num_heads",
            "num_hidden_layers",
            "truncated_vocab_size",
        ),
        # original_lm_head: one shared lm_head for every head, loaded from lm_heads.0 only.
        config_forbidden=("original_lm_head",),
        sources=(
            Source(_VLLM, "vllm/model_executor/models/medusa.py", "09cddad8f0324594022359cd2b07e962a14b895f"),
            Source(
                _VLLM, "vllm/transformers_utils/configs/medusa.py", "4bb77b3239adff81001f12cd9c9a39b65800a373"
            ),
        ),
    ),
    ("vllm", "eagle1"): EngineTable(
        engine="vllm",
        method="eagle1",
        # EAGLEConfig keeps a name starting with "Eagle"; anything else would be renamed Eagle<arch>.
        architectures=("EagleLlamaForCausalLM",),
        entries=EAGLE1_ENTRIES,
        config_values={"model_type": "llama", "num_hidden_layers": 1},
        config_required=_EAGLE_CONFIG,
        config_forbidden=_EAGLE_FORBIDDEN,
        sources=(
            Source(
                _VLLM, "vllm/model_executor/models/llama_eagle.py", "e1c4a55214c63e19e83f82ad6c552d82148bae0b"
            ),
            Source(
                _VLLM, "vllm/transformers_utils/configs/eagle.py", "23c5aa92d517802488a0c77a5f58cd0a2019c5a3"
            ),
        ),
    ),
    ("sglang", "eagle1"): EngineTable(
        engine="sglang",
        method="eagle1",
        architectures=("LlamaForCausalLMEagle",),
        # SGLang's fc is nn.Linear(2h, h) with its default bias: a missing bias stays uninitialised memory.
        entries=(*EAGLE1_ENTRIES, Entry("fc.bias", "[h]", lambda d: (d.hidden,))),
        config_values={"model_type": "llama", "num_hidden_layers": 1},
        config_required=_EAGLE_CONFIG,
        config_forbidden=_EAGLE_FORBIDDEN,
        sources=(
            Source(
                _SGL, "python/sglang/srt/models/llama_eagle.py", "3b64d5dee0756de843b5f022966f69c995cd15ea"
            ),
        ),
    ),
    ("vllm", "eagle3"): EngineTable(
        engine="vllm",
        method="eagle3",
        architectures=("LlamaForCausalLMEagle3",),
        entries=EAGLE3_ENTRIES,
        config_values={"model_type": "llama", "num_hidden_layers": 1},
        config_required=(*_EAGLE_CONFIG, "draft_vocab_size", "target_hidden_size"),
        config_forbidden=_EAGLE_FORBIDDEN,
        sources=(
            Source(
                _VLLM,
                "vllm/model_executor/models/llama_eagle3.py",
                "583507d13075783a12ccbd774575974d10ca4959",
            ),
        ),
    ),
    ("sglang", "eagle3"): EngineTable(
        engine="sglang",
        method="eagle3",
        architectures=("LlamaForCausalLMEagle3",),
        entries=EAGLE3_ENTRIES,
        # tie_word_embeddings true would make SGLang use embed_tokens as the (draft-vocabulary) lm_head.
        config_values={"model_type": "llama", "num_hidden_layers": 1, "tie_word_embeddings": False},
        config_required=(*_EAGLE_CONFIG, "draft_vocab_size", "target_hidden_size"),
        # `bias: true` gives SGLang's EAGLE-3 fc a bias we never write.
        config_forbidden=(*_EAGLE_FORBIDDEN, "bias"),
        sources=(
            Source(
                _SGL, "python/sglang/srt/models/llama_eagle3.py", "d737979cbd17c6162f39c1953cfa72d3d23cc0d0"
            ),
        ),
    ),
}


# ---------------------------------------------------------------- reading a folder


def method_of_config(config: dict) -> str | None:
    """The draft method an engine config.json declares (None if it is not one of ours)."""
    arch = tuple(config.get("architectures") or ())
    if config.get("model_type") == "medusa" or arch == ("MedusaModel",):
        return "medusa"
    if arch in (("EagleLlamaForCausalLM",), ("LlamaForCausalLMEagle",)):
        return "eagle1"
    if arch == ("LlamaForCausalLMEagle3",):
        return "eagle3"
    return None


def table_for(engine: str, method: str) -> EngineTable:
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if (engine, method) == ("sglang", "medusa"):
        raise ExportError(
            "SGLang has no Medusa drafter (its speculative algorithms are EAGLE/EAGLE3, MTP, standalone draft "
            "models and n-gram): export Medusa heads with --to vllm, or --to hf"
        )
    if (engine, method) not in TABLES:
        raise ExportError(f"no {engine} table for method {method!r}; known methods: {', '.join(METHODS)}")
    return TABLES[(engine, method)]


def config_value(config: dict, key: str, where: str):
    """config[key], or an ExportError naming the key."""
    if key not in config or config[key] is None:
        raise ExportError(f"{where}: config key {key!r} is missing")
    return config[key]


def dims_from_config(method: str, config: dict, where: str = CONFIG_FILE) -> Dims:
    """The sizes a folder's config.json declares, read the way the engines read them."""
    h, V = int(config_value(config, "hidden_size", where)), int(config_value(config, "vocab_size", where))
    if method == "medusa":
        return Dims(
            hidden=h,
            vocab=V,
            draft_vocab=int(config.get("truncated_vocab_size") or V),
            num_heads=int(config_value(config, "num_heads", where)),
            num_layers=int(config_value(config, "num_hidden_layers", where)),
            fc_bias=bool(config.get("medusa_fc_bias", False)),  # vLLM's default: no bias
        )
    heads = int(config_value(config, "num_attention_heads", where))
    return Dims(
        hidden=h,
        vocab=V,
        draft_vocab=int(config_value(config, "draft_vocab_size", where)) if method == "eagle3" else 0,
        intermediate=int(config_value(config, "intermediate_size", where)),
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or h // heads),
        target_hidden=int(config.get("target_hidden_size") or h) if method == "eagle3" else 0,
    )
