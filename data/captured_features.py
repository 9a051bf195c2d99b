"""Features kept while generating (`data.features`), stored as one feature cache every offline recipe reads.

    write_shard(folder, k, rows, feats, train)     # generation shard k: its rows' features, one file
    write_manifest(folder, ...)                    # at assembly: which file and row each dataset row reads

    <data.output_dir>/features/shards/shard-00000.safetensors   one per generation shard
    <data.output_dir>/features/manifest.json                    headway.data.feature_cache's format (v3)

A shard file holds, per `feature_key`, the features of the shard's rows at every position (prompt and
answers, never cut), "offsets" [rows + 1], and the per-dimension moments over the generated tokens of the
rows the train split will hold ("stats.*"). It is written (atomically) before the shard's rows, so a
shard whose rows exist has its features. The train/validation split is assigned at assembly; the
manifest maps every split row to (file, row in file) and merges the train moments into one file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from headway.data.feature_cache import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    STATS_PREFIX,
    FeatureCache,
    atomic_write_json,
    dataset_fingerprint,
    spec_to_json,
)
from headway.data.feature_stats import FeatureMoments
from headway.features import FeatureSpec

FEATURES_SUBDIR = "features"
STATS_FILE = "train-stats.safetensors"


def shard_file(k: int) -> str:
    """Shard k's file, relative to the cache folder."""
    return f"shards/shard-{k:05d}.safetensors"


def _save(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)  # atomic: a killed run never leaves half a file


def train_moments(rows: list[dict], feats: list[dict[str, torch.Tensor]], train: list[bool]) -> FeatureMoments:
    """Feature moments over the generated tokens (loss_mask 1) of the rows marked train."""
    moments = FeatureMoments()
    for row, f, is_train in zip(rows, feats, train, strict=True):
        if is_train:
            generated = torch.tensor(row["loss_mask"], dtype=torch.bool)
            for key, t in f.items():
                moments.add(key, t[generated])
    return moments


def write_shard(folder: Path, k: int, rows: list[dict], feats: list[dict[str, torch.Tensor]], train: list[bool]) -> None:
    """Generation shard k's features (rows in order); `train`: which rows the train split will hold."""
    for row, f in zip(rows, feats, strict=True):
        for key, t in f.items():
            if t.shape[0] != len(row["input_ids"]):
                raise RuntimeError(f"{row['prompt_id']}: {key} has {t.shape[0]} positions, the row {len(row['input_ids'])}")
    keys = sorted(feats[0]) if feats else []
    tensors = {key: torch.cat([f[key] for f in feats]).contiguous() for key in keys}
    lengths = [len(r["input_ids"]) for r in rows]
    tensors["offsets"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    tensors.update(train_moments(rows, feats, train).to_tensors(STATS_PREFIX))
    _save(Path(folder) / shard_file(k), tensors)


def write_manifest(
    folder: Path,
    spec: FeatureSpec,
    dtype: torch.dtype,
    target_fingerprint: dict,
    datasets: dict,
    places: dict[str, list[tuple[int, int]]],
    shards: list[int],
    moved: bool,
) -> FeatureCache:
    """The cache's manifest over the files of `shards`; places[split][i] = (shard, row in shard) of split row i.

    moved: the split moved a row against its prompt_id's verdict (tiny runs keep both splits non-empty),
    so the shards' train moments do not cover exactly the train split: they are recomputed from the rows."""
    folder = Path(folder)
    files = [{"path": shard_file(k), "bytes": (folder / shard_file(k)).stat().st_size} for k in shards]
    file_of = {k: i for i, k in enumerate(shards)}
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "target": target_fingerprint,
        "spec": spec_to_json(spec),
        "dtype": str(dtype).removeprefix("torch."),
        "max_len": None,  # rows are whole
        "made_by": "generation",
        "datasets": {s: dataset_fingerprint(datasets[s]) for s in places},
        "files": files,
        "splits": {
            s: {"num_rows": len(p), "rows": {"file": [file_of[k] for k, _ in p], "local": [i for _, i in p]}} for s, p in places.items()
        },
        "stats_file": STATS_FILE,
        "complete": False,
    }
    atomic_write_json(folder / MANIFEST, manifest)
    if moved:
        cache = FeatureCache(folder, partial=True)
        rows = datasets["train"]
        feats = [cache.row("train", i) for i in range(len(rows))]
        moments = train_moments(list(rows), feats, [True] * len(rows))
    else:
        from safetensors import safe_open

        moments = FeatureMoments()
        for f in files:
            with safe_open(str(folder / f["path"]), framework="pt") as sf:
                keys = [key for key in sf.keys() if key.startswith(STATS_PREFIX)]
                moments.merge(FeatureMoments.from_tensors({key: sf.get_tensor(key) for key in keys}, STATS_PREFIX))
    _save(folder / STATS_FILE, moments.to_tensors(STATS_PREFIX))
    manifest["complete"] = True
    atomic_write_json(folder / MANIFEST, manifest)
    return FeatureCache(folder)
