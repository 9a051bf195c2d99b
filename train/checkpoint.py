"""Training checkpoints: accelerate's save_state (weights, optimizer, scheduler, RNG) + where the data was.

    runs/x/checkpoints/step-0000200/
        model.safetensors        trainable weights only (a frozen target is not copied into every checkpoint)
        optimizer.bin, scheduler.bin, random_states_{rank}.pkl
        trainer_state.json       step, epoch, batch position, trainable-weight signature
        COMPLETE                 written last: a checkpoint without it was cut off and is ignored

Rotation keeps the newest `keep` complete checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from torch import nn

STATE_FILE = "trainer_state.json"
COMPLETE_MARKER = "COMPLETE"
PREFIX = "step-"


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # data position: the next micro-batch is batches(epoch)[batch_in_epoch]
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    signature: str = ""  # names and shapes of the trainable weights


def trainable_signature(model: nn.Module) -> str:
    spec = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:16]


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step:07d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if (p / COMPLETE_MARKER).is_file() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def read_state(folder: Path) -> TrainerState:
    return TrainerState(**json.loads((folder / STATE_FILE).read_text()))


def write_state(folder: Path, state: TrainerState) -> None:
    (folder / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")


def mark_complete(folder: Path) -> None:
    (folder / COMPLETE_MARKER).write_text("ok\n")


def rotate(root: Path, keep: int) -> None:
    found = complete_checkpoints(root)
    for old in found[: max(0, len(found) - max(1, keep))]:
        shutil.rmtree(old, ignore_errors=True)
    # Leftovers of a save that was cut off (no marker) older than the newest complete one.
    newest = found[-1] if found else None
    if newest is not None:
        for p in root.glob(f"{PREFIX}*"):
            if not (p / COMPLETE_MARKER).is_file() and int(p.name[len(PREFIX) :]) < int(newest.name[len(PREFIX) :]):
                shutil.rmtree(p, ignore_errors=True)
