"""A headway checkpoint folder in memory: config.json (with its `headway` block) and the weights.

    ckpt = read_checkpoint("runs/smollm2-135m/eagle3")   # Checkpoint: method, config, state, folder
    write_headway(ckpt, Path("runs/copy"))
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from headway.export.check import read_config
from headway.export.engine_keys import CONFIG_FILE, EXPORT_BLOCK, WEIGHTS_FILE, ExportError, method_of_config
from headway.heads.eagle import FORMAT as EAGLE_FORMAT

__all__ = ["EXPORT_BLOCK", "Checkpoint", "method_of_headway", "read_checkpoint", "write_headway"]


@dataclass
class Checkpoint:
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


def write_headway(ckpt: Checkpoint, folder: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in ckpt.state.items()}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(ckpt.config, indent=2, default=str) + "\n")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _declared_dtype(config: dict) -> torch.dtype | None:
    name = config.get("dtype") or config.get("torch_dtype")
    return _DTYPES.get(str(name).removeprefix("torch.")) if name else None


def target_dtype(ckpt: Checkpoint) -> tuple[torch.dtype | None, str]:
    """The dtype the checkpoint's target is served in, and where that was read (None: nowhere).

    The target's own config.json when it is here (a built-in's prepared folder, a local folder, the
    Hugging Face cache); else the dtype the drafter's layer config copied from the target in training.
    """
    from headway.target import servable_target

    name = ckpt.target_name
    path = Path(servable_target(name)) if name != "?" else None
    if path is not None and (path / CONFIG_FILE).is_file():
        found = _declared_dtype(json.loads((path / CONFIG_FILE).read_text()))
        if found is not None:
            return found, f"the target's {path / CONFIG_FILE}"
    if name != "?" and path is not None and not path.exists():
        try:
            from transformers import AutoConfig

            found = _declared_dtype(AutoConfig.from_pretrained(name, local_files_only=True).to_dict())
            if found is not None:
                return found, f"the target {name}'s cached config"
        except (OSError, ValueError):
            pass  # not in the local Hugging Face cache: no network here
    # `dtype` of an EAGLE config is the target's, copied with its layer config (`torch_dtype` is the drafter's).
    found = _DTYPES.get(str(ckpt.config.get("dtype")).removeprefix("torch."))
    return (found, "the dtype the target ran in during training (the drafter's config)") if found else (None, "")
