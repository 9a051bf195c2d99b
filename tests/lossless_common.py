"""Shared setup of the fp32 losslessness tests on the real SmolLM2 (tests/test_lossless_*.py).

20 Spec-Bench prompts over all six domains (first turns), plain greedy answers from HF
`generate` at batch 1 as the reference; the engine must reproduce them token for token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from data.chat import first_turn_ids
from inference.engine import SpecEngine
from inference.questions import load_questions

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW = 24
PER_DOMAIN = {"multi_turn": 4, "translation": 4, "summarization": 3, "qa": 3, "math_reasoning": 3, "rag": 3}
EOS = 2


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small ops on 2 threads stall badly when other processes share the cores; 1 thread is steady.
    Import this fixture into a test module to use it there."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def prompts(tok) -> list[list[int]]:
    qs = load_questions(ROOT / "data/prompts/spec_bench/question.jsonl", per_domain=max(PER_DOMAIN.values()))
    out, seen = [], {}
    for q in qs:
        if seen.get(q.domain, 0) < PER_DOMAIN[q.domain]:
            seen[q.domain] = seen.get(q.domain, 0) + 1
            out.append(first_turn_ids(tok, q.turns[0]))
    assert len(out) == 20 and set(seen) == set(PER_DOMAIN)
    return out


@torch.inference_mode()
def plain_greedy(model, ids_list: list[list[int]]) -> list[list[int]]:
    refs = []
    for ids in ids_list:
        x = torch.tensor([ids])
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
        toks = out[0, len(ids) :].tolist()
        refs.append(toks[: toks.index(EOS) + 1] if EOS in toks else toks)
    return refs


def check_lossless(model, drafter, spec, ids_list, refs, batch: int) -> int:
    """Runs the engine over all prompts in batches; asserts equality; returns draft tokens accepted."""
    engine = SpecEngine(model, drafter, spec, eos_ids={EOS})
    accepted = 0
    for i in range(0, len(ids_list), batch):
        out = engine.generate(ids_list[i : i + batch], MAX_NEW)
        for j, toks in enumerate(out.tokens):
            assert toks == refs[i + j], (
                f"prompt {i + j} (batch {batch}): speculative {toks} != plain {refs[i + j]}"
            )
        accepted += sum(map(sum, out.accepted))
    return accepted
