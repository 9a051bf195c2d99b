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
from headway.export.engine_keys import CONFIG_FILE, WEIGHTS_FILE, ExportError, method_of_config
from headway.heads.eagle import FORMAT as EAGLE_FORMAT

# config.json block of an engine export: where it came from (the source's `headway` block); engines ignore it.
EXPORT_BLOCK = "headway_export"


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
