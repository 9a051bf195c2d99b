"""Lossless speculative sampling: the engine's output distribution equals the target's, exactly.

On a tiny-vocabulary target with a different tiny drafter, 20,000 samples of the first four
generated tokens are compared with the target's exact joint distribution by a chi-square test;
deliberately wrong samplers (correction from p instead of the residual; a q other than the one
the draft tokens were drawn from) must be rejected by the same test, so the test can fail.
"""

from __future__ import annotations

import functools

import pytest
import torch
from tiny_models import tiny_llama

import headway.inference.engine as engine_mod
from headway.inference import exactness
from headway.inference.acceptance import accept_sampling, residual
from headway.inference.allocation import NodePlanner
from headway.inference.drafters import FusedDrafter, LookupDrafter, ModelDrafter
from headway.inference.engine import SpecEngine
from headway.inference.exactness import chi_square_p
from headway.inference.trees import DRAFTER_DEFAULT_ACCURACIES, Tree, TreeSpec, chain
from headway.sampling import SamplingParams, warp


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small ops on 2 threads stall badly when other processes share the cores; 1 thread is steady."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


V = 5  # vocabulary: 5^4 = 625 four-token outcomes
N_TOKENS = 4
SAMPLES = 20_000
PROMPT = [3, 1, 4, 1, 0, 2]


def _model(seed: int, scale: float):
    m = tiny_llama(vocab_size=V, hidden_size=16, num_layers=1, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    # An untied random output layer, scaled so distributions are far from uniform and from each other.
    m.lm_head.weight = torch.nn.Parameter(
        torch.randn(m.lm_head.weight.shape, generator=g) * scale, requires_grad=False
    )
    return m


@pytest.fixture(scope="module")
def target():
    return _model(0, 0.2)


@pytest.fixture(scope="module")
def draft_model():
    return _model(1, 0.2)


def exact_joint(target, s: SamplingParams) -> torch.Tensor:
    return exactness.exact_joint(target, PROMPT, N_TOKENS, s)


def sample_counts(engine: SpecEngine, seed: int = 0) -> torch.Tensor:
    return exactness.sample_counts(engine, PROMPT, N_TOKENS, SAMPLES, seed)


BRANCHING = Tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
CASES = {
    "chain-sampled": (TreeSpec("static", chain(3)), "sample", SamplingParams(temperature=1.0)),
    "tree-sampled": (TreeSpec("static", BRANCHING), "sample", SamplingParams(temperature=1.0)),
    "tree-topk-warped": (
        TreeSpec("static", BRANCHING),
        "topk",
        SamplingParams(temperature=0.8, top_p=0.9, top_k=4),
    ),
    "dynamic": (TreeSpec("dynamic", depth=3, top_k=2, budget=5), "topk", SamplingParams(temperature=1.0)),
    # Prompt-lookup candidates merged into the trained tree: one-hot q rows beside sampled ones ...
    "fused-tree-sampled": (TreeSpec("static", BRANCHING), "sample", SamplingParams(temperature=1.0)),
    # ... and beside deterministic (top-k) picks, q None throughout.
    "fused-dynamic": (TreeSpec("dynamic", depth=3, top_k=2, budget=5), "topk", SamplingParams(temperature=0.8)),
}


def fused(drafter: ModelDrafter, spec: TreeSpec) -> FusedDrafter:
    """The drafter's tree with lookup candidates (up to 4 tokens, 2 candidates) merged in."""
    planner = NodePlanner(DRAFTER_DEFAULT_ACCURACIES, spec.num_nodes, spec.max_depth, lookup_depth=4, resize_trained=False)
    return FusedDrafter(drafter, LookupDrafter(max_ngram=3, max_tokens=4, num_candidates=2), planner, DRAFTER_DEFAULT_ACCURACIES)


def _engine(target, draft_model, case):
    spec, children, s = CASES[case]
    drafter = ModelDrafter(draft_model, children=children)
    if case.startswith("fused"):
        drafter = fused(drafter, spec)
    return SpecEngine(target, drafter, spec, s, eos_ids=set()), s


def test_models_differ_enough(target, draft_model):
    """The negative controls only have power if p and q differ: check the setup, not the sampler."""
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        p = torch.softmax(target(ids).logits[0, -1], -1)
        q = torch.softmax(draft_model(ids).logits[0, -1], -1)
    assert 0.5 * (p - q).abs().sum() > 0.2


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_target(target, draft_model, case):
    engine, s = _engine(target, draft_model, case)
    counts = sample_counts(engine)
    pval = chi_square_p(counts, exact_joint(target, s))
    assert pval > 0.01, f"{case}: chi-square rejects the sampler (p = {pval:.2e})"
    assert sum(engine.timings.values()) > 0
    if case.startswith("fused"):  # lookup nodes were verified beside the drafter's, and some accepted
        t = engine.drafter.totals
        assert t["lookup_nodes"] > SAMPLES and t["lookup_tokens"] > SAMPLES // 10, t


def _wrong_correction(p, q):
    return p  # draws the correction token from p instead of the residual norm(max(p - q, 0))


class _SharpenedQDrafter(ModelDrafter):
    """Samples from q but reports q^2 renormalised (say, a temperature applied to one side only)."""

    def draft(self, *args, **kwargs):
        dt = super().draft(*args, **kwargs)
        dt.q = dt.q**2 / (dt.q**2).sum(-1, keepdim=True)
        return dt


class _NoRenormDrafter(ModelDrafter):
    """Draws siblings without replacement but reports the original q for every sibling."""

    def draft(self, root, spec, sampling, generator):
        dt = super().draft(root, spec, sampling, generator)
        first = dt.q[:, :3].clone()  # the root's three children: restore q_1 for all of them
        dt.q[:, 1:3] = first[:, :1]
        return dt


@pytest.mark.parametrize("case", ["chain-sampled", "tree-sampled", "fused-dynamic"])
def test_negative_control_residual_from_p_is_rejected(target, draft_model, case, monkeypatch):
    monkeypatch.setattr(
        engine_mod, "accept_sampling", functools.partial(accept_sampling, correction=_wrong_correction)
    )
    engine, s = _engine(target, draft_model, case)
    pval = chi_square_p(sample_counts(engine), exact_joint(target, s))
    assert pval < 0.01, f"{case}: the test failed to reject a sampler that corrects from p (p = {pval:.3f})"


@pytest.mark.parametrize("wrong", [_SharpenedQDrafter, _NoRenormDrafter])
def test_negative_control_wrong_q_is_rejected(target, draft_model, wrong):
    spec, _, s = CASES["tree-sampled"]
    engine = SpecEngine(target, wrong(draft_model, children="sample"), spec, s, eos_ids=set())
    pval = chi_square_p(sample_counts(engine), exact_joint(target, s))
    assert pval < 0.01, f"{wrong.__name__}: the test failed to reject a wrong q (p = {pval:.3f})"


def test_residual_rule():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.6, 0.2]])
    assert torch.allclose(residual(p, q), torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.allclose(residual(p, p), p)  # p == q: never rejected, any fallback is fine


def test_warp_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert torch.allclose(warp(logits, SamplingParams(1.0, top_k=2)), torch.tensor([2 / 3, 1 / 3, 0, 0]))
    assert torch.allclose(warp(logits, SamplingParams(1.0, top_p=0.7)), torch.tensor([2 / 3, 1 / 3, 0, 0]))
    assert torch.equal(warp(logits, SamplingParams(0.0)), torch.tensor([1.0, 0, 0, 0]))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(1.0, top_p=0)


def _nucleus_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The rule as first written: sort every token, keep the prefix whose mass before it is below top_p."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("spread", ["narrow", "wide", "mixed"])
def test_nucleus_equals_the_full_sort(spread):
    from headway.sampling import NUCLEUS_SEARCH, nucleus

    g = torch.Generator().manual_seed(0)
    V = 8 * NUCLEUS_SEARCH
    narrow = torch.randn(6, V, generator=g) * 6  # a peaked distribution: the nucleus is a few tokens
    wide = torch.randn(6, V, generator=g) * 0.5  # nearly flat: the nucleus spans most of the vocabulary
    logits = {"narrow": narrow, "wide": wide, "mixed": torch.cat([narrow, wide])}[spread]
    probs = torch.softmax(logits, dim=-1)
    width = (_nucleus_by_full_sort(probs, 0.9) > 0).sum(-1)
    assert (width < NUCLEUS_SEARCH).all() if spread == "narrow" else (width > NUCLEUS_SEARCH).any()
    assert torch.equal(nucleus(probs, 0.9), _nucleus_by_full_sort(probs, 0.9))


def test_sample_rows_draws_each_rows_distribution_from_its_own_generator():
    from headway.sampling import sample_rows

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.1, 0.1, 0.0, 0.8]])
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    draws = torch.tensor([sample_rows(probs, gens) for _ in range(20_000)])  # [n, 2]
    for r in range(2):
        counts = torch.bincount(draws[:, r], minlength=5).float()
        assert counts[probs[r] == 0].sum() == 0, "a zero-probability token is never drawn"
        assert chi_square_p(counts[probs[r] > 0], probs[r][probs[r] > 0]) > 0.001
    # Row 0's draws depend on its generator alone: the same seed alone or beside another row draws the same.
    alone = [sample_rows(probs[:1], [g])[0] for g in [torch.Generator().manual_seed(1)] for _ in range(50)]
    assert alone == draws[:50, 0].tolist()
    wrong = torch.bincount(draws[:, 0], minlength=5).float()  # negative control: row 0's counts against row 1
    assert chi_square_p(wrong[probs[1] > 0] + 1, probs[1][probs[1] > 0]) < 0.001
