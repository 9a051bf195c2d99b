"""End to end: a briefly trained EAGLE-3 drafter for SmolLM2, exported with `--to llamacpp`, runs in llama.cpp.

A drafter is trained for 40 steps on the target's own greedy answers to five short Spec-Bench prompts
(the prompts decoded below: it learns these answers, so its drafts are often accepted and acceptance is
measured on many steps; about 40 s), exported through export/llamacpp.py and served by llama-server at
one thread (two stall when another process holds a core). Checked:
- llama.cpp's greedy output with `--spec-type draft-eagle3` (the export's own serve command, 3 draft
  tokens per step) equals its plain greedy output, and both equal headway's fp32 greedy answers. The
  target GGUF is f32: with f16 a batched verify forward can round differently from a one-token forward
  (phase 1 saw one of 12 prompts part at token 62), which would be llama.cpp's rounding, not the draft's.
- accepted draft tokens per verification step are above zero and within 20% of what headway's own
  engine measures for the same drafter with a chain of 3 on the same prompts. Both run the same drafter
  over the same token sequences, so the counts differ only where a near tie of the draft's top two
  logits resolves differently: the draft GGUF is q8_0 (the export's default) and llama.cpp's kernels
  round otherwise than torch's fp32; and in how each cuts its last step at the token limit. Measured
  here: 0.71 (llama.cpp, 77 accepted over 108 steps) against 0.73 (headway, 80 over 109).
The first run builds llama.cpp (about 650 CPU-seconds) and converts the target (seconds); both are cached.
"""

from __future__ import annotations

import shlex

import pytest
import torch
from lossless_common import EOS, one_thread, prompts, recipe_vocab  # noqa: F401 (one_thread: autouse fixture)

from headway.data.features import OnlineFeatures
from headway.export.llamacpp import export_llamacpp
from headway.heads.eagle import Eagle3Drafter, load_drafter
from headway.heads.eagle_objective import EagleLossConfig, build_objective
from headway.inference.drafters import EagleTreeDrafter
from headway.inference.engine import SpecEngine
from headway.inference.trees import TreeSpec, chain
from headway.llamacpp import ensure_llamacpp
from headway.llamacpp_server import LlamaServer

pytestmark = [pytest.mark.slow, pytest.mark.real_target]

NEW = 48  # tokens per answer
K = 3  # draft tokens per step (llama.cpp --spec-draft-n-max, headway's chain)
STEPS, LR = 40, 3e-3


@pytest.fixture(scope="module")
def llama():
    return ensure_llamacpp(log=lambda m: print(m, flush=True))


@pytest.fixture(scope="module")
def short_prompts(smol_tok):
    """Five short first turns (39-57 tokens), over several domains."""
    return [p for p in prompts(smol_tok) if len(p) <= 100][:5]


@pytest.fixture(scope="module")
def answers(smol_fp32, short_prompts):
    """headway's fp32 greedy answers (transformers generate), EOS included when reached."""
    out = []
    with torch.inference_mode():
        for ids in short_prompts:
            x = torch.tensor([ids])
            gen = smol_fp32.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False, pad_token_id=EOS
            )
            toks = gen[0, len(ids) :].tolist()
            out.append(toks[: toks.index(EOS) + 1] if EOS in toks else toks)
    return out


@pytest.fixture(scope="module")
def drafter_folder(smol_fp32, short_prompts, answers, tmp_path_factory):
    """An EAGLE-3 drafter (SmolLM2's recipe: layers 2/15/27, 8,192-token draft vocabulary) trained on the answers."""
    rows = [p + a for p, a in zip(short_prompts, answers, strict=True)]
    T = max(map(len, rows))
    ids = torch.full((len(rows), T), EOS)
    loss_mask, attn = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(short_prompts, rows, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        loss_mask[i, len(p) : len(r)] = 1  # the target-generated tokens
        attn[i, : len(r)] = 1
    batch = {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": attn}
    torch.manual_seed(0)
    drafter = Eagle3Drafter.from_target(smol_fp32, vocab=recipe_vocab(), target_name="smollm2-135m-instruct")
    objective = build_objective(drafter, EagleLossConfig(unroll_steps=K), pad_id=EOS)
    with torch.no_grad():
        feats = OnlineFeatures(smol_fp32, objective.feature_spec())(batch)  # the frozen target: once
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=LR)
    for _ in range(STEPS):
        out = objective.training_loss(batch, feats)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.metrics["acc_step1"] > 0.3, out.metrics  # it learned something: drafts will be accepted
    return drafter.eval().save_pretrained(tmp_path_factory.mktemp("eagle3") / "drafter")


def test_draft_eagle3_output_equals_plain_and_acceptance_matches_headway(
    llama, smol_fp32, short_prompts, answers, drafter_folder, tmp_path
):
    # p_min 0: every step carries a full chain, as headway's chain below does
    result = export_llamacpp(
        drafter_folder, tmp_path / "gguf", target_ggufs=("f32",), n_max=K, p_min=0.0, llama=llama
    )
    serve = shlex.split(result.serve["f32"])
    assert serve[1:3] == ["-m", str((tmp_path / "gguf" / "target-f32.gguf").resolve())]
    fa = serve[serve.index("-fa") :][:2]
    assert fa == ["-fa", "off"]  # the export's default: plain runs with the same attention kernels
    with LlamaServer(llama, tmp_path / "gguf" / "target-f32.gguf", threads=1, extra_args=fa) as srv:
        plain = [srv.complete(ids, NEW, ignore_eos=False).tokens for ids in short_prompts]
    speculative, counters = [], []
    with LlamaServer(llama, serve[2], threads=1, extra_args=[*serve[3:], "--metrics"]) as srv:
        for ids in short_prompts:
            before = srv.spec_counters()
            speculative.append(srv.complete(ids, NEW, ignore_eos=False).tokens)
            counters.append(srv.spec_counters() - before)
    # drafts cut at a draft probability under 0.5 (the export's default, DEFAULT_P_MIN)
    with LlamaServer(llama, serve[2], threads=1, extra_args=[*serve[3:], "--spec-draft-p-min", "0.5"]) as srv:
        cut = [srv.complete(ids, NEW, ignore_eos=False).tokens for ids in short_prompts]
    for i, (a, b, c, ref) in enumerate(zip(plain, speculative, cut, answers, strict=True)):
        assert b == a, f"prompt {i}: draft-eagle3 {b} != plain {a}"
        assert c == a, f"prompt {i}: draft-eagle3 with p-min 0.5 {c} != plain {a}"
        assert a == ref, f"prompt {i}: llama.cpp f32 {a} != headway fp32 {ref}"

    engine = SpecEngine(
        smol_fp32,
        EagleTreeDrafter(load_drafter(drafter_folder, smol_fp32)),
        TreeSpec("static", chain(K)),
        eos_ids={EOS},
    )
    accepted = []
    for ids, ref in zip(short_prompts, answers, strict=True):
        out = engine.generate([ids], NEW)
        assert out.tokens[0] == ref
        accepted += out.accepted[0]
    ours = sum(accepted) / len(accepted)
    theirs = sum(c.accepted for c in counters) / sum(c.steps for c in counters)
    assert all(c.steps > 0 for c in counters)
    assert sum(sum(c.per_position) for c in counters) == sum(c.accepted for c in counters)
    print(
        f"accepted per step: llama.cpp {theirs:.3f} ({sum(c.accepted for c in counters)} over "
        f"{sum(c.steps for c in counters)} steps), headway {ours:.3f} ({sum(accepted)} over {len(accepted)})"
    )
    assert theirs > 0, counters
    assert abs(theirs - ours) <= 0.2 * ours, f"llama.cpp {theirs:.3f} vs headway {ours:.3f} accepted per step"
