"""Sampling parameters and the one warp (temperature, top-k, top-p) applied to target and drafter alike.

Lossless speculative sampling needs the drafter's q and the target's p to come from the same
transform of their logits; both go through `warp`. The self-distillation generator
(`data/generate.py`) samples through `warp` too (a torch.Generator per conversation turn), so its
answers follow the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUCLEUS_SEARCH = 1024  # top-p looks for its nucleus among this many most likely tokens before sorting all


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: torch.Tensor, s: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (fp32). Greedy gives the one-hot argmax."""
    if s.greedy:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(
            -1, logits.argmax(-1, keepdim=True), 1.0
        )
    logits = logits.float() / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = logits.topk(s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        probs = nucleus(probs, s.top_p)
    return probs


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [..., V] cut to the smallest prefix (most likely first) whose mass reaches top_p, renormalised
    (the first token always stays).

    The nucleus is looked for among the NUCLEUS_SEARCH most likely tokens first (topk: about 8x cheaper
    than sorting 49k probabilities per row on CPU); only when some row's nucleus is wider are all rows
    sorted. Either way the prefix, its cumulative sums and so the cut are those of a full sort.
    """
    k = min(NUCLEUS_SEARCH, probs.shape[-1])
    top, order = probs.topk(k, dim=-1)  # sorted, descending
    mass = top.cumsum(-1)
    if k < probs.shape[-1] and bool((mass[..., -1] < top_p).any()):
        top, order = probs.sort(dim=-1, descending=True)  # a wider nucleus: sort them all
        mass = top.cumsum(-1)
    kept = top.masked_fill(mass - top >= top_p, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, kept)
    return out / out.sum(-1, keepdim=True)


def sample_rows(probs: torch.Tensor, generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of probs [R, V], row r drawn with generators[r] (one uniform each, inverse CDF).

    The same distribution as torch.multinomial per row, at one batched cumsum and search instead of R
    multinomial calls over the whole vocabulary (about 2 ms each for 49k tokens on CPU). A row's draw
    depends on its generator alone, not on the other rows. A zero-probability token is never drawn.
    """
    cdf = probs.float().cumsum(-1)
    u = torch.cat([torch.rand(1, generator=g, device=probs.device) for g in generators])
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    return picked.clamp_(max=probs.shape[-1] - 1).tolist()


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs [..., V] -> ids [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def pick(logits: torch.Tensor, s: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token from logits [..., V]: argmax when greedy, else a sample of warp(logits)."""
    if s.greedy:
        return logits.argmax(-1)
    return sample(warp(logits, s), generator)
