"""A batched, left-padded, EOS-aware decode loop for self-distillation.

Rows that hit EOS leave the batch (their KV rows are dropped from the cache), so a batch costs
what its live rows cost; `model.generate` keeps finished rows padding along to the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class Answer:
    tokens: list[int]  # generated ids, the stopping EOS included when one was produced
    finished: bool  # False: stopped at max_new_tokens


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> torch.Tensor:
    """Greedy at temperature 0, else temperature + nucleus sampling. logits [B, V] -> ids [B]."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.inference_mode()
def generate_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> list[Answer]:
    device = model.device
    B = len(prompts)
    L = max(len(p) for p in prompts)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, L - len(p) :] = torch.tensor(p)
        attn[i, L - len(p) :] = 1
    input_ids, attn = input_ids.to(device), attn.to(device)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed or 0)
    eos = torch.tensor(sorted(eos_ids), device=device)

    cache = DynamicCache()
    logits = model(
        input_ids=input_ids, attention_mask=attn, position_ids=position_ids, cache=cache, logits_to_keep=1
    ).logits[:, -1]
    rows = torch.arange(B, device=device)  # original row index of each live batch row
    next_pos = position_ids[:, -1] + 1
    out: list[list[int]] = [[] for _ in range(B)]
    finished = [False] * B
    for step in range(max_new_tokens):
        tok = sample_next(logits, temperature, top_p, gen)
        for r, t in zip(rows.tolist(), tok.tolist(), strict=True):
            out[r].append(t)
        done = torch.isin(tok, eos)
        if step == max_new_tokens - 1:
            for r in rows[done].tolist():
                finished[r] = True
            break
        if done.any():
            for r in rows[done].tolist():
                finished[r] = True
            keep = (~done).nonzero().squeeze(-1)
            if keep.numel() == 0:
                break
            cache.batch_select_indices(keep)
            rows, tok, attn, next_pos = rows[keep], tok[keep], attn[keep], next_pos[keep]
        attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
        logits = model(
            input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None], cache=cache
        ).logits[:, -1]
        next_pos = next_pos + 1
    return [Answer(out[i], finished[i]) for i in range(B)]
