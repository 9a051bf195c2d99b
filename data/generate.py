"""A batched, left-padded, EOS-aware decode loop for self-distillation.

Rows that hit EOS leave the batch (their KV rows are dropped from the cache), so a batch costs
what its live rows cost; `model.generate` keeps finished rows padding along to the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from headway.kv import select_rows
from headway.sampling import SamplingParams, pick
from headway.tokens import left_pad


@dataclass
class Answer:
    tokens: list[int]  # generated ids, the stopping EOS included when one was produced
    finished: bool  # False: stopped at max_new_tokens


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
    input_ids, valid = left_pad(prompts, pad_id)
    input_ids, attn = input_ids.to(device), valid.long().to(device)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    sampling = SamplingParams(temperature=temperature, top_p=top_p)  # greedy at temperature 0
    gen = None
    if not sampling.greedy:
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
        tok = pick(logits, sampling, gen)
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
            select_rows(cache, keep)
            rows, tok, attn, next_pos = rows[keep], tok[keep], attn[keep], next_pos[keep]
        attn = torch.cat([attn, attn.new_ones((attn.shape[0], 1))], dim=1)
        logits = model(
            input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None], cache=cache
        ).logits[:, -1]
        next_pos = next_pos + 1
    return [Answer(out[i], finished[i]) for i in range(B)]
