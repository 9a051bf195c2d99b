"""Prompt lookup (index, longest match first, candidates, trie merge, padding), the node planner's
split between sources, fused trees on a tiny target, and the lookup/fused settings from a recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lossless_common import one_thread  # noqa: F401 (fixture: one thread)
from tiny_models import tiny_llama

from headway.config import ConfigError, load_config
from headway.features import TargetFeatures
from headway.inference.allocation import (
    BY_NGRAM,
    LOOKUP,
    TRAINED,
    DepthStats,
    NodePlanner,
    conditional_alphas,
)
from headway.inference.drafter import Accepted
from headway.inference.drafters import FusedDrafter, LookupDrafter, ModelDrafter
from headway.inference.drafters.lookup import NgramIndex
from headway.inference.drafters.trie import TokenTrie, stack_rows
from headway.inference.engine import SpecEngine
from headway.inference.trees import DRAFTER_DEFAULT_ACCURACIES, TreeSpec
from headway.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the index and its candidates


def test_index_is_incremental_and_keys_every_ngram_length():
    ix = NgramIndex(min_ngram=1, max_ngram=3)
    ix.extend([7, 8, 9])
    ix.extend([7, 8])  # a later observation extends the same index
    assert ix.tokens == [7, 8, 9, 7, 8]
    assert ix.starts[(7, 8)] == [2, 5] and ix.starts[(8, 9, 7)] == [4] and ix.starts[(7,)] == [1, 4]
    assert (7, 8, 9, 7) not in ix.starts  # longer than max_ngram


def test_longest_match_first_then_most_recent():
    ix = NgramIndex(1, 3)
    # "5 1 2" continues with 3 (twice, the later at 10); "9 1 2" with 6; any "2" also with 4 (at 14).
    ix.extend([5, 1, 2, 3, 0, 9, 1, 2, 6, 5, 1, 2, 3, 2, 4, 5, 1])
    cands = ix.candidates(root=2, length=2, count=3)
    assert cands[0] == (3, [3, 2])  # 3-gram (5, 1, 2): the most recent occurrence first
    assert [c for _, c in cands] == [[3, 2], [3, 0], [6, 5]]  # then its older one, then 2-gram (1, 2) only
    assert [n for n, _ in cands] == [3, 3, 2]
    one = ix.candidates(root=2, length=2, count=1)
    assert one == [(3, [3, 2])]


def test_a_short_match_drafts_a_short_candidate():
    ix = NgramIndex(1, 3)
    ix.extend([5, 1, 2, 3, 4, 5, 6, 7, 9, 2, 8, 8, 8, 8, 8, 5, 1])
    # (5, 1, 2) matched: 3 x 2 = 6 tokens; the 1-gram (2,) at 10: 2 tokens only (not the cap of 8)
    assert ix.candidates(root=2, length=8, count=3, per_ngram=2) == [(3, [3, 4, 5, 6, 7, 9]), (1, [8, 8])]
    assert ix.candidates(root=2, length=8, count=3) == [(3, [3, 4, 5, 6, 7, 9, 2, 8]), (1, [8, 8, 8, 8, 8, 5, 1, 2])]
    with pytest.raises(ValueError, match="tokens_per_ngram"):
        LookupDrafter(tokens_per_ngram=0)


def test_candidates_run_past_the_present_periodically_and_skip_prefixes():
    ix = NgramIndex(1, 4)
    ix.extend([6, 6, 6])
    assert ix.candidates(root=6, length=5, count=3) == [(3, [6, 6, 6, 6, 6])]  # not [6], [6, 6], ...
    ix = NgramIndex(1, 2)
    ix.extend([1, 2, 3, 1])
    # (1, 2)'s continuation reaches the history's end: root 2 then itself again (period 3)
    assert ix.candidates(root=2, length=6, count=1) == [(2, [3, 1, 2, 3, 1, 2])]


def test_no_match_and_no_scan_of_the_history():
    ix = NgramIndex(2, 3)
    ix.extend([1, 2, 3])
    assert ix.candidates(root=9, length=4, count=2) == []
    ix = NgramIndex(1, 1)
    ix.extend([4, 5] * 500)  # 500 occurrences of 4, all continued by 5
    assert ix.candidates(root=4, length=1, count=3) == [(1, [5])]  # looked at a few, not all 500


# ---------------------------------------------------------------- tries and padding


def test_trie_merges_shared_prefixes_and_respects_the_limit():
    trie = TokenTrie.of([5, 6, 7], [0, 1, 0], origin=TRAINED)  # 5 -> 6, and 7 under the root
    assert trie.insert([5, 6, 8], origin=LOOKUP) == [1, 2, 4]  # shares 5, 6; adds 8
    assert trie.parents == [0, 1, 0, 2] and trie.depth == [0, 1, 2, 1, 3]
    assert trie.insert([7, 1, 2, 3], limit=5) == [3, 5]  # stops at 5 nodes
    assert len(trie) == 5 and trie.walk([5, 6, 8, 9]) == [1, 2, 4] and trie.walk([9]) == []
    assert trie.origin == [-1, TRAINED, TRAINED, TRAINED, LOOKUP, 0]


def test_stack_rows_pads_short_rows_under_the_root():
    a, b, c = TokenTrie(), TokenTrie(), TokenTrie()
    a.insert([3, 4, 5])
    b.insert([9])
    dt = stack_rows([a, b, c], fill=[1, 2, 8], device="cpu")
    assert dt.tokens.tolist() == [[3, 4, 5], [9, 2, 2], [8, 8, 8]]
    assert dt.parents.tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0]] and dt.q is None
    assert stack_rows([c], [1], "cpu").tokens.shape == (1, 0)


def _acc(rows: list[list[int]]) -> Accepted:
    T = max(map(len, rows))
    toks = torch.tensor([[0] * (T - len(r)) + r for r in rows])
    valid = torch.tensor([[False] * (T - len(r)) + [True] * len(r) for r in rows])
    return Accepted(toks, valid, valid.long().cumsum(-1) - 1, TargetFeatures())


def test_lookup_drafter_draft_per_row_tries_and_padding():
    d = LookupDrafter(max_ngram=2, min_ngram=1, max_tokens=3, num_candidates=2)
    d.observe(_acc([[1, 2, 3, 4, 1, 2, 5], [7, 7, 8]]))  # left-padded second row: padding never indexed
    dt = d.draft(torch.tensor([1, 9]), TreeSpec("dynamic", budget=10), SamplingParams(), None)
    # row 0: "(5) 1" matches nothing at n=2; "1" -> [2, 5, 1] (recent) and [2, 3, 4]: one trie, "2" shared
    assert dt.tokens[0].tolist() == [2, 5, 1, 3, 4]
    assert dt.parents[0].tolist() == [0, 1, 2, 1, 4]
    assert dt.tokens[1].tolist() == [9] * 5 and dt.parents[1].tolist() == [0] * 5  # no match: padding
    assert d.rows[1].tokens == [7, 7, 8]
    d.select_rows(torch.tensor([1]))
    assert len(d.rows) == 1 and d.rows[0].tokens == [7, 7, 8]
    capped = LookupDrafter(2, 1, 3, 2)
    capped.observe(_acc([[1, 2, 3, 4, 1, 2, 5]]))
    assert capped.draft(torch.tensor([1]), TreeSpec("dynamic", budget=2), SamplingParams(), None).tokens.tolist() == [[2, 5]]


def _plain(model, prompt, n):
    x = torch.tensor([prompt])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    toks = out[0, len(prompt) :].tolist()
    return toks[: toks.index(2) + 1] if 2 in toks else toks


PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 3], [10, 11, 12, 13, 10, 11], [4, 4, 5, 4, 4, 5, 4]]


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, seed=1)


class _CountEmpty(LookupDrafter):
    empty = 0

    def draft(self, root, spec, sampling, generator):
        dt = super().draft(root, spec, sampling, generator)
        self.empty += dt.tokens.shape[1] == 0
        return dt


def test_lookup_alone_and_empty_trees_are_lossless(tiny):
    """Steps where no row matches draft an empty tree, i.e. a plain decoding step."""
    refs = [_plain(tiny, p, 24) for p in PROMPTS]
    drafter = _CountEmpty(min_ngram=2)
    engine = SpecEngine(tiny, drafter, TreeSpec("dynamic", depth=10, top_k=3, budget=30), eos_ids={2})
    out = engine.generate([[20, 21, 22]], 4)  # the first step's 2-gram (22, 22) is new to the history
    assert out.tokens == [_plain(tiny, [20, 21, 22], 4)] and drafter.empty > 0
    for batch in (1, 4):
        accepted = 0
        for i in range(0, len(PROMPTS), batch):
            out = engine.generate(PROMPTS[i : i + batch], 24)
            assert out.tokens == refs[i : i + batch]
            accepted += sum(map(sum, out.accepted))
        assert accepted > 20  # the tiny model repeats itself: lookup is right often
    sampled = SpecEngine(tiny, drafter, TreeSpec("dynamic", budget=30), SamplingParams(temperature=1.0), eos_ids={2})
    drafter.empty = 0
    assert len(sampled.generate([[20, 21, 22]], 4).tokens[0]) == 4 and drafter.empty > 0  # sampling: same


def test_fused_tree_merges_and_credits_both_sources(tiny):
    draft_model = tiny_llama(vocab_size=64, hidden_size=32, num_layers=1, seed=2)
    spec = TreeSpec("dynamic", depth=3, top_k=2, budget=4)
    planner = NodePlanner(DRAFTER_DEFAULT_ACCURACIES, 4, 3, lookup_depth=5)
    fused = FusedDrafter(ModelDrafter(draft_model), LookupDrafter(max_tokens=5), planner, DRAFTER_DEFAULT_ACCURACIES)
    engine = SpecEngine(tiny, fused, spec, eos_ids={2})
    refs = [_plain(tiny, p, 24) for p in PROMPTS]
    out = engine.generate(PROMPTS, 24)
    assert out.tokens == refs
    t = fused.totals
    assert t["lookup_nodes"] > 0 and t["lookup_tokens"] > 0 and t["trained_nodes"] > 0, t
    # the repeating target rewards lookup: its online alpha rose above the prior
    assert all(st[LOOKUP].alpha(0) > 0.5 for st in fused.stats)
    # and every verified candidate's first token taught its match length's acceptance
    assert all(sum(st[BY_NGRAM].reached) > 0 for st in fused.stats)


# ---------------------------------------------------------------- the planner


def test_depth_stats_forget_and_move_from_the_prior():
    st = DepthStats([0.5, 0.5], weight=2.0, decay=0.5)
    assert st.alpha(0) == 0.5 and st.alpha(7) == 0.5  # past the last depth: the last one
    st.update(reached=2, accepted=2)
    assert st.alpha(0) == pytest.approx(2 / 3) and st.alpha(1) == pytest.approx(2 / 3)
    st.update(reached=1, accepted=0)  # rejected at depth 1; depth 2 not reached
    assert st.reached == [1.5, 0.5] and st.accepted == [0.5, 0.5]
    st.update(reached=0, accepted=0)  # the source proposed nothing: no evidence either way
    assert st.reached == [1.5, 0.5]


def test_conditional_alphas_of_a_tree():
    # two depth-1 nodes (0.5 + 0.2 reach depth 1), one depth-2 node worth 0.35
    assert conditional_alphas([0.5, 0.35, 0.2], [1, 2, 1], 2) == pytest.approx([0.7, 0.5])


def _lookup_trie(*conts):
    t = TokenTrie()
    for rank, c in enumerate(conts):
        t.insert(c, origin=rank)
    return t.depth, t.origin


def test_planner_gives_lookup_nodes_when_it_has_been_right():
    planner = NodePlanner(DRAFTER_DEFAULT_ACCURACIES, budget=8, max_depth=4, lookup_depth=6)
    good, bad = planner.new_stats(), planner.new_stats()
    for _ in range(20):
        good[LOOKUP].update(6, 6)  # lookup's chains accepted in full
        bad[LOOKUP].update(1, 0)  # rejected at once
    trie = _lookup_trie([1, 2, 3, 4, 5, 6], [1, 2, 9])
    plan = planner.plan([good, bad], [trie, trie])
    assert plan.lookup[0] == [1, 2, 3, 4, 5, 6]  # the whole first candidate (parents first)
    assert plan.lookup[1] in ([], [1])  # a source that keeps failing: at most its first guess (~9%)
    assert plan.trained == 8 - len(plan.lookup[1])  # the batch shares one count: the second row's
    alone = planner.plan([good], [trie])
    assert alone.trained == 2 and len(alone.lookup[0]) == 6  # within the budget of 8
    none = planner.plan([good], [([0], [-1])])  # no lookup match: everything to the drafter
    assert none.trained == 8 and none.lookup == [[]]


def test_planner_prices_lookup_nodes_by_their_match_length():
    """Uncapped candidates: a match length whose first tokens keep failing loses its nodes, the
    other keeps its whole tail (what lookup's tokens_per_ngram cap does blindly)."""
    planner = NodePlanner(DRAFTER_DEFAULT_ACCURACIES, budget=8, max_depth=4, lookup_depth=6)
    depth, origin = _lookup_trie([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])  # ranks 0 and 1
    ngrams = [4, 1]  # rank 0 matched 4 tokens, rank 1 one token
    short_bad, long_bad = planner.new_stats(), planner.new_stats()
    for st, good_n, bad_n in ((short_bad, 4, 1), (long_bad, 1, 4)):
        for _ in range(20):
            st[LOOKUP].update(6, 6)
            st[BY_NGRAM].add(good_n - 1, True)
            st[BY_NGRAM].add(bad_n - 1, False)
    plan = planner.plan([short_bad, long_bad], [(depth, origin, ngrams)] * 2)
    assert plan.lookup[0] == [1, 2, 3, 4, 5, 6]  # the 4-token match, whole
    assert set(plan.lookup[1]) >= {7, 8, 9} and not set(plan.lookup[1]) & {4, 5, 6}
    # without match lengths the planner falls back to rank order: the first candidate first
    assert planner.plan([long_bad], [(depth, origin)]).lookup[0][:6] == [1, 2, 3, 4, 5, 6]


def test_planner_grows_the_tree_only_where_nodes_pay_for_their_verification():
    flat = {1: 1.0, 128: 1.0}  # verification costs the same at any size: take every useful node
    planner = NodePlanner(DRAFTER_DEFAULT_ACCURACIES, budget=4, max_depth=4, lookup_depth=6, curve=flat, max_budget=40)
    st = planner.new_stats()
    for _ in range(20):
        st[LOOKUP].update(6, 6)
    plan = planner.plan([st], [_lookup_trie([1, 2, 3, 4, 5, 6])])
    assert plan.lookup == [[1, 2, 3, 4, 5, 6]] and plan.trained == 34  # 40 nodes in all
    steep = {1: 1.0, 128: 128.0}  # every node costs a full forward: no more than the budget
    planner.set_cost(steep)
    plan = planner.plan([st], [_lookup_trie([1, 2, 3, 4, 5, 6])])
    assert len(plan.lookup[0]) + plan.trained == 4


# ---------------------------------------------------------------- settings


def test_lookup_settings_are_typed_and_checked_at_load():
    cfg = load_config(ROOT / "configs/smollm2-135m/eagle3.yaml", ["inference.drafter=fused", "inference.lookup.max_tokens=6"])
    assert cfg.inference.drafter == "fused" and cfg.inference.lookup.max_tokens == 6
    with pytest.raises(ConfigError, match=r"inference\.lookup: need 1 <= min_ngram <= max_ngram"):
        load_config(ROOT / "configs/smollm2-135m/eagle3.yaml", ["inference.lookup.min_ngram=5"])
    with pytest.raises(ConfigError, match=r"inference\.drafter"):
        load_config(ROOT / "configs/smollm2-135m/eagle3.yaml", ["inference.drafter=both"])
    with pytest.raises(ValueError, match="max_tokens and num_candidates"):
        LookupDrafter(max_tokens=0)


def test_planner_skips_the_drafter_only_when_lookup_alone_pays_more():
    curve = {1: 1.0, 128: 2.0}
    planner = NodePlanner(DRAFTER_DEFAULT_ACCURACIES, budget=8, max_depth=4, lookup_depth=6, curve=curve, max_budget=16)
    sure, unsure = planner.new_stats(), planner.new_stats()
    for _ in range(20):
        sure[LOOKUP].update(6, 6)
        unsure[LOOKUP].update(1, 0)
    chain = _lookup_trie([1, 2, 3, 4, 5, 6])
    assert planner.plan([sure], [chain]).trained > 0  # drafting costs nothing measured: always draft
    planner.set_cost(curve, draft_cost=1.0)  # a drafter forward pass costs as much as verifying
    skip = planner.plan([sure], [chain])
    assert skip.trained == 0 and skip.lookup == [[1, 2, 3, 4, 5, 6]]
    assert planner.plan([unsure], [chain]).trained > 0  # lookup is not reliable enough here
    assert planner.plan([sure, unsure], [chain, chain]).trained > 0  # one row still wants the drafter
    assert planner.plan([sure], [([0], [-1])]).trained > 0  # no lookup match: draft as usual


def test_a_skipped_drafter_drafts_from_both_observations(tiny):
    """ModelDrafter observing twice (a fused step drafted by lookup alone) equals observing once."""
    draft_model = tiny_llama(vocab_size=64, hidden_size=32, num_layers=1, seed=2)
    spec = TreeSpec("dynamic", depth=3, top_k=2, budget=4)
    once, twice = ModelDrafter(draft_model), ModelDrafter(draft_model)
    rows = [[3, 4, 5, 6, 7], [9, 8, 7]]
    once.observe(_acc(rows))
    twice.observe(_acc([r[:2] for r in rows]))
    twice.observe(_acc([r[2:] for r in rows]))
    root = torch.tensor([1, 2])
    a, b = (d.draft(root, spec, SamplingParams(), None) for d in (once, twice))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)


def test_fused_eagle_skipped_on_some_steps_stays_lossless(tiny):
    """A measured drafting cost makes the planner leave some steps to lookup alone: the EAGLE drafter
    then catches up on two observations at once, and the output is still plain greedy's."""
    from headway.heads.eagle import Eagle1Drafter
    from headway.inference.drafters import EagleTreeDrafter

    spec = TreeSpec("dynamic", depth=3, top_k=2, budget=4)
    planner = NodePlanner(DRAFTER_DEFAULT_ACCURACIES, 4, 3, lookup_depth=6, curve={1: 1.0, 64: 2.0}, draft_cost=0.5)
    eagle = EagleTreeDrafter(Eagle1Drafter.from_target(tiny).eval())
    fused = FusedDrafter(eagle, LookupDrafter(max_tokens=6), planner, DRAFTER_DEFAULT_ACCURACIES)
    engine = SpecEngine(tiny, fused, spec, eos_ids={2})
    for batch in (1, 4):
        for i in range(0, len(PROMPTS), batch):
            out = engine.generate(PROMPTS[i : i + batch], 24)
            assert out.tokens == [_plain(tiny, p, 24) for p in PROMPTS[i : i + batch]]
    assert fused.skipped > 0 and fused.totals["trained_nodes"] > 0
