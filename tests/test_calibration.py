"""The auto budget's acceptance calibration: the profile fitted to observed tau, and the tree it then picks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headway.config import load_config
from headway.inference.build import build_engine, retune_budget
from headway.inference.calibration import calibrate
from headway.inference.cost import choose_budget, fit_acceptance, scale_accuracies
from headway.inference.trees import build_tree, expected_tau

ROOT = Path(__file__).resolve().parents[1]
XEON = ROOT / "docs/results/2026-12-07-smollm2/xeon/eagle3"  # section 11: fixed trees measured side by side


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny_target():
    from tiny_models import tiny_llama

    return tiny_llama(vocab_size=49152, hidden_size=64, num_layers=4, seed=0)


def test_fit_acceptance_reproduces_the_observed_tau():
    acc = json.loads((XEON / "head_accuracy.json").read_text())["accuracy"]
    tree = build_tree(acc, 16, max_depth=4)
    assert fit_acceptance(acc, tree, expected_tau(tree, acc))[1] == pytest.approx(1.0, abs=1e-6)  # as profiled: unchanged
    for seen in (1.3, 2.44, 3.5):
        fitted, scale = fit_acceptance(acc, tree, seen)
        assert expected_tau(tree, fitted) == pytest.approx(seen, abs=1e-6)
        assert (scale < 1) == (seen < expected_tau(tree, acc))
        assert fitted == scale_accuracies(acc, scale)
        assert all(a <= 1 and list(row) == sorted(row) for row in fitted for a in row)  # still cumulative accuracies
    assert fit_acceptance(acc, tree, 1.0)[1] == 0.05  # nothing accepted: the smallest scale
    assert fit_acceptance(acc, tree, 99.0)[1] == 2.0  # beyond any tree of 16 nodes: the largest
    with pytest.raises(ValueError, match="at least 1"):
        fit_acceptance(acc, tree, 0.5)


def test_fitted_profile_picks_the_tree_measured_fastest_on_the_xeon():
    """The section-11 run: the profile as measured chose 16 nodes of depth 4 (tau 3.11 expected, 2.44
    seen); fitted to the 2.44 it chooses 8 of depth 3, the fastest of the trees measured there, and
    expects of that tree about the tau seen with it (2.23 on Spec-Bench, 2.31 on section 11's subset)."""
    acc = json.loads((XEON / "head_accuracy.json").read_text())["accuracy"]
    rep = json.loads((XEON / "eval/report.json").read_text())
    curve = {int(k): v for k, v in rep["verify_cost"].items()}
    per_level = rep["draft_cost_s"] / 6  # measured before the retune, with the recipe's depth 6

    def pick(a):
        return max(choose_budget(curve, a, 6, forward_cost=per_level)[1], key=lambda r: r["tokens_per_s"])

    assert (pick(acc)["nodes"], pick(acc)["depth"]) == (16, 4)
    fitted, scale = fit_acceptance(acc, build_tree(acc, 16, max_depth=4), 2.44)
    assert 0.85 < scale < 0.9
    best = pick(fitted)
    assert (best["nodes"], best["depth"]) == (8, 3)
    assert best["tau"] == pytest.approx(2.27, abs=0.06)


def test_retune_budget_with_a_scale_shrinks_the_tree_and_says_so(tiny_target, smol_tok):
    acc = json.loads((XEON / "head_accuracy.json").read_text())["accuracy"]
    rep = json.loads((XEON / "eval/report.json").read_text())
    curve = {int(k): v for k, v in rep["verify_cost"].items()}
    cfg = load_config(ROOT / "configs/smollm2-135m/eagle3.yaml", ["eagle.feature_layers=[1,2,3]", "inference.draft_quantization=none"])
    for scale, tree in ((None, (16, 4)), (0.88, (8, 3))):  # each from the recipe's depth 6, as in evaluate.py
        s = build_engine(cfg, None, tiny_target, smol_tok, curve=curve, log=lambda *a: None)
        s.accuracies = acc
        retune_budget(s, curve, rep["draft_cost_s"], acceptance_scale=scale)
        assert (s.info["budget"], s.engine.spec.depth) == tree and s.info["acceptance_scale"] == scale
        retune_budget(s, curve, rep["draft_cost_s"], acceptance_scale=scale)  # again: the cost's depth is still 6
        assert (s.info["budget"], s.engine.spec.depth) == tree
    assert "1.3 ms per tree level" in s.info["budget_source"] and "acceptance scaled by 0.880**depth" in s.info["budget_source"]


def test_calibrate_measures_what_the_drafter_accepts(tiny_target, smol_tok):
    cfg = load_config(
        ROOT / "configs/smollm2-135m/eagle3.yaml",
        ["eagle.feature_layers=[1,2,3]", "inference.tree=chain", "inference.depth=3"],
    )
    # Drafting with all 4 of the target's layers: every draft is the target's own greedy token. (A chain:
    # the random model's flat distributions would rank a dynamic tree's depth-1 siblings above depth 2.)
    perfect = calibrate(build_engine(cfg, None, tiny_target, smol_tok, layer_skip=4), smol_tok, max_new_tokens=16)
    assert perfect.observed_tau == pytest.approx(4.0)  # depth 3 + the bonus token, every step
    assert perfect.expected_tau < perfect.observed_tau and perfect.acceptance_scale > 1
    assert perfect.steps >= 5 and perfect.draft_cost > 0
    from tiny_models import tiny_llama

    from headway.inference.drafters import ModelDrafter

    wrong = build_engine(cfg, None, tiny_target, smol_tok, layer_skip=4)
    stranger = tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2, seed=1)
    torch.manual_seed(1)  # an untied random lm_head: not the tied model's echo of its last token, as the target's
    stranger.lm_head = torch.nn.Linear(64, 49152, bias=False).requires_grad_(False)
    wrong.engine.drafter = ModelDrafter(stranger)
    weak = calibrate(wrong, smol_tok, max_new_tokens=16)
    assert weak.observed_tau < 1.2 and weak.acceptance_scale < 0.5 and weak.steps > perfect.steps
    assert set(weak.describe()) >= {"draft_cost", "steps", "observed_tau", "expected_tau", "acceptance_scale", "prompts"}
    from headway.inference.build import build_engines

    fused = build_engines(cfg, None, tiny_target, smol_tok, modes=("fused",), layer_skip=4)["fused"]
    with pytest.raises(ValueError, match="drafter alone, not the 'fused' engine"):
        calibrate(fused, smol_tok)


def test_a_fused_engine_retuned_with_a_scale_prices_nodes_from_the_fitted_profile(tiny_target, smol_tok):
    from headway.inference.build import build_engines

    cfg = load_config(ROOT / "configs/smollm2-135m/eagle3.yaml", ["eagle.feature_layers=[1,2,3]"])
    fused = build_engines(cfg, None, tiny_target, smol_tok, modes=("fused",), curve={1: 1.0, 128: 2.0})["fused"]
    raw = fused.accuracies
    retune_budget(fused, {1: 1.0, 128: 2.0}, 0.1, acceptance_scale=0.8)
    drafter = fused.engine.drafter
    assert drafter.planner.accuracies == drafter.accuracies == scale_accuracies(raw, 0.8)
    assert drafter.planner.budget == fused.info["budget"] and fused.info["acceptance_scale"] == 0.8
