"""Offline target features: run the target once over the dataset, keep the needed layers as safetensors shards.

    python scripts/cache_features.py --config configs/smollm2-135m/eagle3.yaml      # resumable
    cache = FeatureCache("runs/smollm2-135m/features")
    cache.check(spec, target_fingerprint=fp, datasets=ds, max_len=1024)            # refuses a stale cache
    collate = cache.collate_fn(spec, pad_id=2, max_len=1024)                         # rows -> batch + features
    moments = cache.moments()                                                        # train-split feature stats

Layout (an extraction pass, `write_cache`):
    manifest.json                     target fingerprint, feature spec, dtype, max_len, dataset fingerprints,
                                      and per split the finished shards (rows, tokens, bytes)
    {split}/shard-00000.safetensors   per feature, under its `feature_key` name ("features.layer.{i}",
                                      "features.final_normed"): [tokens of the shard's rows, h] (rows in
                                      order, each cut at max_len); "offsets" [rows + 1] int64; and (train)
                                      the shard's feature moments on generated tokens ("stats.*")

Layout (kept while generating, headway.data.captured_features): the same tensors, one file per generation
shard (rows of both splits, never cut: max_len null), and per split a row map in the manifest
("rows": {"file": [...], "local": [...]}: which file, and which row in it, each dataset row reads), the
files with their sizes ("files"), and the train split's moments in one file ("stats_file").

A shard is written to a temporary file, renamed, then recorded in the manifest: a killed run resumes at
the first unrecorded shard and ends with the same files. Rows are batched by length inside a shard so
little compute goes to padding. Training rows find their features by (`feature_split`, `row_index`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from headway.data.dataset import collate
from headway.data.feature_stats import FeatureMoments, generated_mask
from headway.data.features import OnlineFeatures
from headway.features import FeatureSpec, feature_keys

FORMAT = "headway-feature-cache"
# 2: tensors named by headway.features.feature_key (version 1 used "layer.{i}"); older caches are refused.
# 3: adds the row maps of caches kept while generating; version 2 caches read as before.
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)
MANIFEST = "manifest.json"
SPLIT_COLUMN = "feature_split"  # added to each split's rows so one collate serves train and validation
STATS_PREFIX = "stats."


class StaleCacheError(ValueError):
    """The cache was made for another target, dataset, spec or length: it names both values."""


def _names(spec: FeatureSpec) -> list[str]:
    """The tensor names of `spec`'s features in a shard (a spec asking for logits is refused)."""
    spec_to_json(spec)
    return feature_keys(spec)


def spec_to_json(spec: FeatureSpec) -> dict:
    if spec.logits:
        raise ValueError(
            "the feature cache does not store logits (V floats per token): store final_normed instead"
        )
    return {"layers": sorted(set(spec.layers)), "final_normed": spec.final_normed}


def dataset_fingerprint(rows) -> dict:
    """Rows and a hash of every input id: a cache is tied to exactly this split."""
    h = hashlib.sha256()
    col = rows.data.column("input_ids").combine_chunks() if hasattr(rows, "data") else None
    if col is not None:
        h.update(np.asarray(col.offsets).astype(np.int64).tobytes())
        h.update(np.asarray(col.values).astype(np.int64).tobytes())
    else:
        for r in rows:
            h.update(np.asarray(r["input_ids"], dtype=np.int64).tobytes())
    return {"num_rows": len(rows), "input_ids_sha": h.hexdigest()[:16]}


def atomic_write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------- writing


@dataclass
class CacheReport:
    folder: Path
    rows: int = 0  # rows extracted by this run (resumed shards excluded)
    tokens: int = 0
    forward_s: float = 0.0  # target forwards with hooks
    total_s: float = 0.0  # everything, writing included
    bytes_on_disk: int = 0  # the whole cache
    rows_in_cache: int = 0
    skipped_shards: int = 0
    per_split: dict = field(default_factory=dict)

    @property
    def bytes_per_1000_rows(self) -> float:
        return 1000 * self.bytes_on_disk / max(1, self.rows_in_cache)


def write_cache(
    target,
    datasets: dict,
    spec: FeatureSpec,
    folder: str | Path,
    *,
    max_len: int,
    target_fingerprint: dict,
    pad_id: int,
    batch_size: int = 16,
    shard_rows: int = 256,
    splits: tuple[str, ...] = ("train", "validation"),
    progress: bool = True,
    log=print,
) -> CacheReport:
    """Extract `spec` for every row of `splits` of `datasets` (a DatasetDict); resumes a partial cache."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = _names(spec)
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    splits = tuple(s for s in splits if s in datasets and len(datasets[s]))
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "target": target_fingerprint,
        "spec": spec_to_json(spec),
        "dtype": dtype,
        "max_len": max_len,
        "shard_rows": shard_rows,
        "datasets": {s: dataset_fingerprint(datasets[s]) for s in splits},
    }
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        for key, want in header.items():
            if manifest.get(key) != want:
                raise StaleCacheError(
                    f"{manifest_path}: the cache has {key}={manifest.get(key)!r}, this run wants {key}={want!r}; "
                    "use another feature_cache_dir or --overwrite"
                )
    else:
        manifest = {**header, "splits": {}, "complete": False}
    manifest["complete"] = False
    atomic_write_json(manifest_path, manifest)

    extract = OnlineFeatures(target, spec)
    device = next(target.parameters()).device
    report = CacheReport(folder)
    t_all = time.perf_counter()
    total_rows = sum(len(datasets[s]) for s in splits)
    done_rows = sum(
        sh["rows"][1] - sh["rows"][0]
        for s in splits
        for sh in manifest["splits"].get(s, {}).get("shards", {}).values()
    )
    bar = tqdm(total=total_rows, initial=done_rows, desc="features", unit="row", disable=not progress)
    for split in splits:
        rows = datasets[split]
        n = len(rows)
        entry = manifest["splits"].setdefault(split, {"num_rows": n, "shards": {}})
        (folder / split).mkdir(exist_ok=True)
        for k in range(math.ceil(n / shard_rows)):
            name = f"shard-{k:05d}"
            if name in entry["shards"] and (folder / split / f"{name}.safetensors").is_file():
                report.skipped_shards += 1
                continue
            lo, hi = k * shard_rows, min(n, (k + 1) * shard_rows)
            shard = rows.select(range(lo, hi))
            lengths = [min(len(x), max_len) for x in shard["input_ids"]]
            per_row: list[dict[str, torch.Tensor] | None] = [None] * (hi - lo)
            moments = FeatureMoments()
            order = sorted(range(hi - lo), key=lambda i: -lengths[i])  # by length: little padding
            for b in range(0, len(order), batch_size):
                idx = order[b : b + batch_size]
                batch = collate([shard[i] for i in idx], pad_id=pad_id, max_len=max_len)
                batch = {key: v.to(device) for key, v in batch.items()}
                t0 = time.perf_counter()
                feats = extract(batch)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                report.forward_s += time.perf_counter() - t0
                if split == "train":
                    moments.update(feats, generated_mask(batch))
                flat = feats.as_dict()
                for j, i in enumerate(idx):
                    per_row[i] = {key: flat[key][j, : lengths[i]].to("cpu") for key in names}
                report.tokens += int(batch["attention_mask"].sum())
                bar.update(len(idx))
            tensors = {key: torch.cat([r[key] for r in per_row]).contiguous() for key in names}
            tensors["offsets"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
            if split == "train":
                tensors.update(moments.to_tensors(STATS_PREFIX))
            path = folder / split / f"{name}.safetensors"
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp), metadata={"format": "pt"})
            tmp.replace(path)
            entry["shards"][name] = {
                "rows": [lo, hi],
                "tokens": int(sum(lengths)),
                "bytes": path.stat().st_size,
            }
            atomic_write_json(manifest_path, manifest)
            report.rows += hi - lo
    bar.close()
    manifest["complete"] = True
    atomic_write_json(manifest_path, manifest)
    report.total_s = time.perf_counter() - t_all
    for split in splits:
        shards = manifest["splits"][split]["shards"].values()
        b = sum(s["bytes"] for s in shards)
        report.per_split[split] = {"rows": manifest["splits"][split]["num_rows"], "bytes": b}
        report.bytes_on_disk += b
        report.rows_in_cache += manifest["splits"][split]["num_rows"]
    return report


# ---------------------------------------------------------------- reading


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64}


class ShardFile:
    """A shard read with plain file reads: exactly the rows asked for. A memory map of the shard would count
    every page training touched as the process's resident memory until the end (the whole cache, which
    grows with the dataset); this way reading costs what the batch holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("rb")
        n = int.from_bytes(self.file.read(8), "little")  # safetensors: u64 header size, JSON header, data
        self.tensors = json.loads(self.file.read(n))
        self.tensors.pop("__metadata__", None)
        self.base = 8 + n
        self.offsets = self.read("offsets", 0, self.tensors["offsets"]["shape"][0])

    def read(self, name: str, a: int, b: int) -> torch.Tensor:
        """Rows a..b (first dimension) of tensor `name`."""
        info = self.tensors[name]
        dtype, inner = _DTYPES[info["dtype"]], info["shape"][1:]
        row_bytes = math.prod(inner) * dtype.itemsize
        self.file.seek(self.base + info["data_offsets"][0] + a * row_bytes)
        data = bytearray(self.file.read((b - a) * row_bytes))
        if len(data) != (b - a) * row_bytes:
            raise ValueError(f"feature cache shard {self.path} is cut short: rebuild the cache with --overwrite")
        if not data:
            return torch.empty(0, *inner, dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(b - a, *inner)


class FeatureCache:
    def __init__(self, folder: str | Path, partial: bool = False) -> None:
        """partial: read a cache whose writer has not finished (its own writer, to finish it)."""
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(
                f"no feature cache in {self.folder} (no {MANIFEST}): run `python scripts/cache_features.py --config <recipe>`"
            )
        self.manifest = json.loads(path.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{path}: not a headway feature cache")
        if self.manifest.get("version") not in READABLE_VERSIONS:
            raise StaleCacheError(
                f"{path}: feature cache format version {self.manifest.get('version')!r}, this headway reads "
                f"versions {' and '.join(map(str, READABLE_VERSIONS))}: rebuild it with "
                "`python scripts/cache_features.py --config ... --overwrite`"
            )
        if not (partial or self.manifest.get("complete")):
            raise ValueError(
                f"{path}: the cache is incomplete (a run was cut off): rerun `python scripts/cache_features.py --config <recipe>` to finish it"
            )
        self.shard_rows = int(self.manifest.get("shard_rows") or 0)
        self.max_len = self.manifest["max_len"]  # None: rows were never cut
        self.dtype = getattr(torch, self.manifest["dtype"])
        self._handles: dict[str, ShardFile] = {}

    @property
    def spec(self) -> FeatureSpec:
        s = self.manifest["spec"]
        return FeatureSpec(layers=tuple(s["layers"]), final_normed=bool(s["final_normed"]))

    @property
    def bytes_on_disk(self) -> int:
        if "files" in self.manifest:
            return sum(f["bytes"] for f in self.manifest["files"])
        return sum(sh["bytes"] for s in self.manifest["splits"].values() for sh in s["shards"].values())

    def check(
        self,
        spec: FeatureSpec,
        target_fingerprint: dict | None = None,
        datasets: dict | None = None,
        max_len: int | None = None,
    ) -> None:
        """Refuse a cache that lacks `spec`, was made by another target, for other rows, or cut shorter."""
        where = self.folder / MANIFEST
        have = self.spec
        missing = sorted(set(spec.layers) - set(have.layers))
        if missing or (spec.final_normed and not have.final_normed) or spec.logits:
            raise StaleCacheError(
                f"{where}: the cache holds layers {list(have.layers)} final_normed={have.final_normed}; "
                f"training needs layers {sorted(set(spec.layers))} final_normed={spec.final_normed}"
            )
        if target_fingerprint is not None:
            cached = self.manifest["target"]
            for key in (
                "name",
                "hidden_size",
                "num_hidden_layers",
                "vocab_size",
                "config_sha",
                "embedding_probe",
            ):
                if key in cached and key in target_fingerprint and cached[key] != target_fingerprint[key]:
                    raise StaleCacheError(
                        f"{where}: features were extracted from a target with {key}={cached[key]!r}, "
                        f"this run's target has {key}={target_fingerprint[key]!r}"
                    )
        if datasets is not None:
            for split, fp in self.manifest["datasets"].items():
                if split in datasets:
                    ours = dataset_fingerprint(datasets[split])
                    if ours != fp:
                        raise StaleCacheError(
                            f"{where}: the {split} split was cached as {fp}, the dataset now is {ours}"
                        )
        if max_len is not None and self.max_len is not None and max_len > self.max_len:
            raise StaleCacheError(
                f"{where}: features were cut at max_len={self.max_len}, training wants max_len={max_len}"
            )

    def _file(self, relative: str) -> ShardFile:
        if relative not in self._handles:
            path = self.folder / relative
            if not path.is_file():
                raise FileNotFoundError(f"feature cache shard {path} is missing")
            self._handles[relative] = ShardFile(path)
        return self._handles[relative]

    def _locate(self, split: str, index: int) -> tuple[ShardFile, int]:
        """The file holding row `index` of `split`, and the row's place in it."""
        entry = self.manifest["splits"][split]
        if "rows" in entry:  # kept while generating: a row map
            f, local = entry["rows"]["file"][index], entry["rows"]["local"][index]
            return self._file(self.manifest["files"][f]["path"]), local
        return self._file(f"{split}/shard-{index // self.shard_rows:05d}.safetensors"), index % self.shard_rows

    def row(self, split: str, index: int, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """The cached features of row `index` of `split`: name -> [length, h]."""
        if split not in self.manifest["splits"]:
            raise KeyError(
                f"the feature cache has no split {split!r} (has {sorted(self.manifest['splits'])})"
            )
        n = self.manifest["splits"][split]["num_rows"]
        if not 0 <= index < n:
            raise IndexError(f"row {index} outside the cached {split} split of {n} rows")
        shard, local = self._locate(split, index)
        a, b = int(shard.offsets[local]), int(shard.offsets[local + 1])
        return {name: shard.read(name, a, b) for name in (names or _names(self.spec))}

    def moments(self) -> FeatureMoments:
        """Feature moments over the train split's generated tokens (merged from every shard)."""
        from safetensors import safe_open

        total = FeatureMoments()
        shards = self.manifest["splits"].get("train", {}).get("shards", {})
        paths = [self.folder / "train" / f"{name}.safetensors" for name in sorted(shards)]
        if "stats_file" in self.manifest:
            paths = [self.folder / self.manifest["stats_file"]]
        for path in paths:
            with safe_open(str(path), framework="pt") as f:
                keys = [k for k in f.keys() if k.startswith(STATS_PREFIX)]
                total.merge(FeatureMoments.from_tensors({k: f.get_tensor(k) for k in keys}, STATS_PREFIX))
        return total

    def collate_fn(self, spec: FeatureSpec, pad_id: int, max_len: int):
        """rows (with row_index, and feature_split unless train) -> the loop's batch + cached features."""
        names = _names(spec)

        def fn(rows: list[dict]) -> dict[str, torch.Tensor]:
            batch = collate(rows, pad_id=pad_id, max_len=max_len)
            batch["row_index"] = torch.tensor([r["row_index"] for r in rows], dtype=torch.long)
            B, T = batch["input_ids"].shape
            out = {}
            for j, r in enumerate(rows):
                feats = self.row(r.get(SPLIT_COLUMN, "train"), int(r["row_index"]), names)
                n = min(T, int(batch["attention_mask"][j].sum()))
                for name, t in feats.items():
                    if t.shape[0] < n:
                        raise ValueError(
                            f"cached row {r['row_index']} has {t.shape[0]} positions, the batch row {n}"
                        )
                    if name not in out:
                        out[name] = torch.zeros(B, T, t.shape[-1], dtype=t.dtype)
                    out[name][j, :n] = t[:n]
            batch.update(out)
            return batch

        return fn


def with_split_column(rows, split: str):
    """The rows with a `feature_split` column, so one collate function finds train and validation features."""
    if SPLIT_COLUMN in rows.column_names:
        return rows
    return rows.add_column(SPLIT_COLUMN, [split] * len(rows))
