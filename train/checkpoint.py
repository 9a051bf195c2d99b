"""Training checkpoints: accelerate's save_state (weights, optimizer, scheduler, RNG) + where the data was.

    runs/x/checkpoints/step-0000200/
        model.safetensors        trainable weights only (a frozen target is not copied into every checkpoint)
        optimizer.bin, scheduler.bin, random_states_{rank}.pkl
        trainer_state.json       step, epoch, batch position, trainable-weight signature
        run_settings.json        the run's settings (train/resume.py compares them on resume)
        COMPLETE                 written last, with every file's size: without it the checkpoint is ignored

A checkpoint is written into `saving-step-N/` and renamed to `step-N/` when complete, so a kill during a
save leaves no half folder (nor the safetensors writer's temporary file) among the checkpoints; the
leftover is removed at the next start. Rotation keeps the newest `keep` complete checkpoints and drops any
newer than the one just saved (an abandoned run's, after a fallback or train.resume=never).
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
STAGING = "saving-"  # + the checkpoint's name, while it is being written


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


def check_holds_weights(folder: Path, trainable_keys: set[str]) -> None:
    """Refuse a checkpoint whose model.safetensors lacks trainable weights: loading it (not strict) would
    silently keep the fresh ones. DeepSpeed's checkpoints have no such file and are loaded by DeepSpeed."""
    path = folder / "model.safetensors"
    if not path.is_file():
        return
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        missing = trainable_keys - set(f.keys())
    if missing:
        raise ValueError(
            f"checkpoint {folder} lacks {len(missing)} of the {len(trainable_keys)} trainable weights (e.g. "
            f"{sorted(missing)[0]}); multi-process launches before 2026-12-03 wrote such empty checkpoints. "
            "Delete the folder's checkpoints/ or set train.resume=never to start over"
        )


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


def staging_dir(root: Path, step: int) -> Path:
    return root / (STAGING + checkpoint_dir(root, step).name)


def clean_staging(root: Path) -> None:
    """Remove what a save cut off by a kill left behind."""
    for p in root.glob(f"{STAGING}*") if root.is_dir() else []:
        shutil.rmtree(p, ignore_errors=True)


def publish(staging: Path, final: Path) -> None:
    """Move a complete staged checkpoint to its name (replacing an abandoned run's checkpoint of that step)."""
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)


def mark_complete(folder: Path) -> None:
    """Written last: the size of every file, so a file cut short later is found before it is loaded."""
    sizes = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / COMPLETE_MARKER).write_text(json.dumps({"files": sizes}, indent=1) + "\n")


def recorded_sizes(folder: Path) -> dict[str, int]:
    """The file sizes the COMPLETE marker recorded ({} for checkpoints from before it recorded them)."""
    try:
        return json.loads((folder / COMPLETE_MARKER).read_text()).get("files", {})
    except (json.JSONDecodeError, AttributeError):
        return {}


def rotate(root: Path, keep: int, current: int | None = None) -> None:
    if current is not None:
        for p in root.glob(f"{PREFIX}*"):
            if int(p.name[len(PREFIX) :]) > current:
                shutil.rmtree(p, ignore_errors=True)
    found = complete_checkpoints(root)
    for old in found[: max(0, len(found) - max(1, keep))]:
        shutil.rmtree(old, ignore_errors=True)
    # Leftovers of a save that was cut off (no marker) older than the newest complete one.
    newest = found[-1] if found else None
    if newest is not None:
        for p in root.glob(f"{PREFIX}*"):
            if not (p / COMPLETE_MARKER).is_file() and int(p.name[len(PREFIX) :]) < int(newest.name[len(PREFIX) :]):
                shutil.rmtree(p, ignore_errors=True)
