"""What changed between two nested settings dicts, key by key: the refusals of data generation and resume.

diff({"train": {"lr": 3e-3}}, {"train": {"lr": 1e-5}})   # [Change("train.lr", 0.003, 1e-05)]
str(change)                                               # "train.lr: was 0.003, now 1e-05"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Change:
    key: str  # dotted: section.key
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: was {self.old!r}, now {self.new!r}"


def diff(old: Any, new: Any, prefix: str = "") -> list[Change]:
    """Every leaf that differs (a key on one side only counts, as None on the other), in key order."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [Change(prefix.rstrip("."), old, new)]
