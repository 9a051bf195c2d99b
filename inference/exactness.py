"""Whether speculative sampling reproduces the target's distribution exactly: a chi-square goodness-of-fit test.

    joint = exact_joint(target, prompt, n_tokens, sampling)       # P(first n generated tokens), every outcome
    counts = sample_counts(engine, prompt, n_tokens, samples)     # the engine's outcomes, in batches
    p_value = chi_square_p(counts, joint)                         # small: the sampler is not the target's

For a target whose vocabulary is small enough to enumerate (V^n outcomes). tests/test_sampling.py runs
it on CPU, the GPU check (inference/gpu_check.py) on the device, both with negative controls that
must fail.
"""

from __future__ import annotations

import itertools

import torch

from headway.sampling import SamplingParams, warp


@torch.no_grad()
def exact_joint(target, prompt: list[int], n_tokens: int, s: SamplingParams) -> torch.Tensor:
    """P(first n_tokens generated tokens) [V ** n_tokens] (fp64, on the CPU), from one forward over every prefix."""
    V = target.get_output_embeddings().weight.shape[0]
    device = next(target.parameters()).device
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=n_tokens - 1)), dtype=torch.long)
    prefixes = prefixes.reshape(-1, n_tokens - 1)
    ids = torch.cat([torch.tensor(prompt).expand(len(prefixes), -1), prefixes], 1).to(device)
    logits = target(ids).logits[:, len(prompt) - 1 :].float().cpu()  # [P, n, V]
    p = warp(logits, s)
    joint = torch.ones(len(prefixes), V)
    rows = torch.arange(len(prefixes))
    for i in range(n_tokens - 1):
        joint = joint * p[rows, i, prefixes[:, i]][:, None]
    return (joint * p[:, -1]).reshape(-1).double()


def sample_counts(engine, prompt: list[int], n_tokens: int, samples: int, seed: int = 0, batch: int = 10_000) -> torch.Tensor:
    """How often the engine generates each n_tokens outcome, over `samples` generations."""
    V = engine.model.get_output_embeddings().weight.shape[0]
    counts = torch.zeros(V**n_tokens, dtype=torch.float64)
    for run in range(-(-samples // batch)):
        size = min(batch, samples - run * batch)
        out = engine.generate([prompt] * size, max_new_tokens=n_tokens, seed=seed * 1000 + run)
        seqs = torch.tensor(out.tokens)
        if seqs.shape != (size, n_tokens):
            raise ValueError(f"expected {n_tokens} tokens per sample (no EOS), got shape {tuple(seqs.shape)}")
        code = (seqs * V ** torch.arange(n_tokens - 1, -1, -1)).sum(-1)
        counts += torch.bincount(code, minlength=V**n_tokens).double()
    return counts


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness-of-fit p-value; outcomes expected fewer than 5 times are pooled into one bin."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))
