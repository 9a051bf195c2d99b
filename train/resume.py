"""Resuming a run: from the newest checkpoint whose files are whole, and only with the settings it was made with.

    settings = run_settings(asdict(cfg), ds["train"])      # what decides the weights: config + train split
    refuse_early(cfg.train.output_dir, asdict(cfg))        # the same refusal before anything heavy loads
    folder, damaged = choose_checkpoint(ckpt_root)         # newest whole checkpoint; the damaged ones, named
    applied = check_settings(folder, settings, out_dir)    # ResumeRefused naming changed keys; else the
                                                           # harmless changes it applies
    truncate_log(out_dir / "metrics.jsonl", state.step)    # replayed steps are not logged twice

Every checkpoint keeps the run's settings (SETTINGS_FILE). A resumed run with other settings would train
the old run's schedule and data order under a run_config.json that says otherwise, so a change is refused
naming its keys, except the ones in SAFE_KEYS: they decide when to log, validate and save, or where files
live, never the weights. The data settings (`data.*`, paths) may change too, because the train split itself
is compared (its row count and a hash of every input id).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from headway.cli import UserError
from headway.diff import Change, diff
from headway.train.checkpoint import STATE_FILE, complete_checkpoints, recorded_sizes

SETTINGS_FILE = "run_settings.json"
RUN_CONFIG_FILE = "run_config.json"
TRAIN_SPLIT = "train split"

SAFE_KEYS = frozenset(
    f"train.{k}"
    for k in (
        "output_dir",
        "dataset_dir",
        "log_every",
        "eval_every",
        "save_every",
        "keep_checkpoints",
        "resume",
        "report_to",
        "wandb_project",
        "wandb_mode",
        "num_workers",
        "max_eval_rows",
        "log_row_ids",
    )
) | {"source_file", "medusa.feature_cache_dir", "eagle.feature_cache_dir"}
# Sections training never reads (inference, eval) or reads only through the train split (data).
SAFE_SECTIONS = ("inference.", "eval.", "data.")


class ResumeRefused(UserError):
    """The output folder holds a checkpoint made with other settings, or none that can be read."""


def run_settings(run_config: dict, train_rows) -> dict:
    """What a checkpoint records: the run config (as JSON reads it back) and the train split's fingerprint."""
    from headway.data.feature_cache import dataset_fingerprint

    return {"config": _as_json(run_config), TRAIN_SPLIT: dataset_fingerprint(train_rows)}


def _as_json(run_config: dict) -> dict:
    return json.loads(json.dumps(run_config, default=str))  # compared as a saved copy reads back


def write_settings(folder: Path, settings: dict) -> None:
    (folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=1) + "\n")


def _is_safe(key: str) -> bool:
    return key in SAFE_KEYS or key.startswith(SAFE_SECTIONS)


def settings_changes(saved: dict, now: dict) -> tuple[list[Change], list[Change]]:
    """(refused, applied): the changes from `saved` to `now` that alter the weights, and the harmless ones."""
    changes = diff(saved.get("config"), now.get("config"))
    if TRAIN_SPLIT in saved and TRAIN_SPLIT in now and saved[TRAIN_SPLIT] != now[TRAIN_SPLIT]:
        changes.append(Change(TRAIN_SPLIT, saved[TRAIN_SPLIT], now[TRAIN_SPLIT]))
    return [c for c in changes if not _is_safe(c.key)], [c for c in changes if _is_safe(c.key)]


def saved_settings(folder: Path, out_dir: Path) -> dict | None:
    """The settings `folder` was made with; for a checkpoint older than SETTINGS_FILE, the run's run_config.json."""
    if (folder / SETTINGS_FILE).is_file():
        return json.loads((folder / SETTINGS_FILE).read_text())
    if (out_dir / RUN_CONFIG_FILE).is_file():
        return {"config": json.loads((out_dir / RUN_CONFIG_FILE).read_text())}
    return None


def check_settings(folder: Path, now: dict, out_dir: Path) -> list[Change]:
    """Refuse to resume `folder` with settings that change the weights; return the harmless changes applied."""
    saved = saved_settings(folder, out_dir)
    if saved is None:
        return []
    refused, applied = settings_changes(saved, now)
    if refused:
        raise ResumeRefused(
            f"{folder} was trained with other settings ({'; '.join(map(str, refused[:5]))}). Nothing was "
            "changed: resume with the same settings, use another train.output_dir, or start over here with "
            "train.resume=never"
        )
    return applied


def refuse_early(output_dir: str | Path, run_config: dict) -> None:
    """The settings check against the newest checkpoint, before the target and data are loaded (config only)."""
    out_dir = Path(output_dir)
    found = complete_checkpoints(out_dir / "checkpoints")
    if found:
        check_settings(found[-1], {"config": _as_json(run_config)}, out_dir)


def applied_note(folder: Path, applied: list[Change]) -> str:
    return (
        f"resuming {folder.name} with changed {'; '.join(map(str, applied))}: applied "
        "(they decide when to log, validate and save, or where files are; not the weights)"
    )


# ---------------------------------------------------------------- damaged checkpoints


def damage(folder: Path) -> str | None:
    """What is wrong with a complete-looking checkpoint's files (named), or None when each one reads."""
    sizes = recorded_sizes(folder)
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} is {path.stat().st_size} bytes, the save wrote {size}"
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        problem = _unreadable(path)
        if problem:
            return f"{path.relative_to(folder)} {problem}"
    return None


def _unreadable(path: Path) -> str | None:
    """A cheap structural check by file kind: headers and indexes only, no tensor is loaded."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt"):
                pass  # the header must parse and the file must cover every tensor it lists
        elif path.suffix in (".bin", ".pt", ".pkl"):
            with zipfile.ZipFile(path):  # torch.save's format: a truncated file has no central directory
                pass
        elif path.name in (STATE_FILE, SETTINGS_FILE):
            json.loads(path.read_text())
    except Exception as e:  # each reader has its own error type; any of them means the file is unusable
        return f"cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def choose_checkpoint(root: Path) -> tuple[Path | None, list[str]]:
    """The newest complete checkpoint whose files are whole, and a line for each newer damaged one.

    Raises ResumeRefused when there are checkpoints and none of them is whole."""
    damaged = []
    found = complete_checkpoints(root)
    for folder in reversed(found):
        problem = damage(folder)
        if problem is None:
            return folder, damaged
        damaged.append(f"checkpoint {folder}: {problem}")
    if damaged:
        raise ResumeRefused(
            f"no checkpoint in {root} can be resumed ({'; '.join(damaged)}). To start over, delete {root} or "
            "set train.resume=never"
        )
    return None, damaged


def truncate_log(path: Path, step: int) -> None:
    """Drop the rows of a JSONL log (metrics, row ids) written after `step`: those steps are trained again."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _step_of(line) <= step]
    if len(kept) == len(lines):
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept))
    tmp.replace(path)


def _step_of(line: str) -> float:
    """A row's step; a line cut off by a kill is dropped (infinitely late)."""
    try:
        return json.loads(line).get("step", 0)
    except json.JSONDecodeError:
        return float("inf")
