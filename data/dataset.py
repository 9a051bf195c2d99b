"""The self-distilled dataset on disk, and batching it for training.

    ds = load_distilled("runs/smollm2-135m/data")      # DatasetDict: train, validation
    batch = collate(ds["train"].select(range(8)), pad_id=tok.pad_token_id, max_len=1024)

Columns: input_ids, loss_mask (1 exactly on target-generated tokens), domain, source, prompt_id, num_turns.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

COLUMNS = ("input_ids", "loss_mask", "domain", "source", "prompt_id", "num_turns", "finished")
DATASET_SUBDIR = "dataset"
META_FILE = "meta.json"


def features():
    """The dataset's column types (int32 ids and int8 masks keep it small on disk)."""
    from datasets import Features, List, Value

    return Features(
        {
            "input_ids": List(Value("int32")),
            "loss_mask": List(Value("int8")),
            "domain": Value("string"),
            "source": Value("string"),
            "prompt_id": Value("string"),
            "num_turns": Value("int32"),
            "finished": Value("bool"),
        }
    )


def load_distilled(output_dir: str | Path):
    """The finished dataset of a `generate_data.py` run, as a DatasetDict with train and validation."""
    from datasets import load_from_disk

    path = Path(output_dir) / DATASET_SUBDIR
    if not path.is_dir():
        raise FileNotFoundError(
            f"no self-distilled dataset in {path}: run `python scripts/generate_data.py --config <data.yaml>` first"
        )
    ds = load_from_disk(str(path))
    missing = [c for c in ("input_ids", "loss_mask") if c not in ds["train"].column_names]
    if missing:
        raise ValueError(f"{path}: dataset lacks columns {missing}")
    return ds


def load_meta(output_dir: str | Path) -> dict:
    """Generation settings and target identity recorded beside the dataset."""
    return json.loads((Path(output_dir) / META_FILE).read_text())


def collate(rows, pad_id: int, max_len: int | None = None) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, loss_mask [B, T]; rows cut at max_len."""
    if hasattr(rows, "to_dict") and not isinstance(rows, list):  # a datasets.Dataset slice
        rows = [dict(zip(rows.column_names, vals, strict=True)) for vals in zip(*rows.to_dict().values(), strict=True)]
    seqs = [list(r["input_ids"])[:max_len] for r in rows]
    masks = [list(r["loss_mask"])[:max_len] for r in rows]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss_mask[i, : len(m)] = torch.tensor(m)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask}
