"""Per-dimension statistics of target features on target-generated tokens (for feature normalisation).

    moments = FeatureMoments()
    moments.update(feats, mask)                # TargetFeatures + bool [B, T] (loss_mask & attention_mask)
    std = moments.std(feature_key("layer", 29))  # float32 [h]
    tensors = moments.to_tensors(); FeatureMoments.from_tensors(tensors)   # what a cache shard stores

Sums are kept in float64 (count, sum, sum of squares per dimension), so shards of a dataset can be
accumulated separately and merged exactly (the offline cache stores them per shard, so a resumed run's
statistics equal an uninterrupted one's).
"""

from __future__ import annotations

import torch

from headway.features import TargetFeatures, feature_key


class FeatureMoments:
    def __init__(self) -> None:
        self.count: dict[str, torch.Tensor] = {}
        self.sum: dict[str, torch.Tensor] = {}
        self.sumsq: dict[str, torch.Tensor] = {}

    def keys(self) -> list[str]:
        return sorted(self.count)

    def add(self, key: str, x: torch.Tensor) -> None:
        """x [N, d]: N selected positions of one feature."""
        x = x.detach().to("cpu", torch.float64)
        if key not in self.count:
            d = x.shape[-1]
            self.count[key] = torch.zeros((), dtype=torch.float64)
            self.sum[key] = torch.zeros(d, dtype=torch.float64)
            self.sumsq[key] = torch.zeros(d, dtype=torch.float64)
        self.count[key] += x.shape[0]
        self.sum[key] += x.sum(0)
        self.sumsq[key] += (x * x).sum(0)

    def update(self, feats: TargetFeatures, mask: torch.Tensor) -> None:
        mask = mask.bool()
        for i, t in feats.layers.items():
            self.add(feature_key("layer", i), t[mask])
        if feats.final_normed is not None:
            self.add(feature_key("final_normed"), feats.final_normed[mask])

    def merge(self, other: FeatureMoments) -> None:
        for k in other.keys():
            if k not in self.count:
                self.count[k] = other.count[k].clone()
                self.sum[k] = other.sum[k].clone()
                self.sumsq[k] = other.sumsq[k].clone()
            else:
                self.count[k] += other.count[k]
                self.sum[k] += other.sum[k]
                self.sumsq[k] += other.sumsq[k]

    def mean(self, key: str) -> torch.Tensor:
        self._need(key)
        return (self.sum[key] / self.count[key]).float()

    def std(self, key: str) -> torch.Tensor:
        self._need(key)
        n = self.count[key]
        var = (self.sumsq[key] - self.sum[key] ** 2 / n) / (n - 1).clamp_min(1)
        return var.clamp_min(0).sqrt().float()

    def _need(self, key: str) -> None:
        if key not in self.count or float(self.count[key]) < 2:
            have = {k: int(self.count[k]) for k in self.keys()}
            raise ValueError(f"no statistics for {key!r} (positions counted per feature: {have})")

    def to_tensors(self, prefix: str = "") -> dict[str, torch.Tensor]:
        out = {}
        for k in self.keys():
            out[f"{prefix}count.{k}"] = self.count[k].reshape(1)
            out[f"{prefix}sum.{k}"] = self.sum[k]
            out[f"{prefix}sumsq.{k}"] = self.sumsq[k]
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> FeatureMoments:
        m = cls()
        for name, t in tensors.items():
            if not name.startswith(prefix + "count."):
                continue
            k = name[len(prefix + "count.") :]
            m.count[k] = t.reshape(()).to(torch.float64)
            m.sum[k] = tensors[f"{prefix}sum.{k}"].to(torch.float64)
            m.sumsq[k] = tensors[f"{prefix}sumsq.{k}"].to(torch.float64)
        return m


def generated_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The positions statistics are taken over: target-generated, real tokens."""
    return batch["loss_mask"].bool() & batch["attention_mask"].bool()
