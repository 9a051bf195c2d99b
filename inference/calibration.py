"""What a trained drafter costs and accepts on a few generic prompts, before an auto budget is chosen.

    cal = calibrate(setup, tokenizer)   # runs setup's engine (the drafter alone) on PROMPTS
    retune_budget(setup, curve, cal.draft_cost, acceptance_scale=cal.acceptance_scale)

The head-accuracy profile is measured on the training mix's validation split; the text a user serves
differs, and the profile's deeper depths overstate what is accepted there, which makes an auto budget
grow trees that cost more than they return (docs/results/2026-12-07-smollm2/xeon/, section 11). The
prompts below are generic requests of the kinds a chat model serves (written for headway, not taken
from any evaluation set), short enough that calibrating takes a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from headway.data.chat import first_turn_ids
from headway.inference.build import EngineSetup
from headway.inference.cost import fit_acceptance
from headway.inference.trees import build_tree, expected_tau

PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short, friendly email to a colleague asking to move our Tuesday meeting to Friday morning.",
    "Translate into English: \"Der Zug hatte heute zwanzig Minuten Verspätung, weil in der Nacht viel Schnee gefallen war.\"",
    "Summarize in two sentences: The town library will close for renovation from March to June. During "
    "that time, books can be borrowed from the school hall on Main Street, which opens on weekdays from "
    "nine to five. Returns can be left in the box outside the library, which is emptied every morning.",
    "A shop sells pencils at 3 for 1 dollar. How much do 12 pencils cost? Explain your steps.",
)


@dataclass
class Calibration:
    draft_cost: float  # the drafter's seconds per verification step
    steps: int  # verification steps measured
    observed_tau: float  # tokens per step, the bonus token included
    expected_tau: float  # what the profile expects of the tree that ran
    acceptance_scale: float  # cost.fit_acceptance's per-depth factor
    prompts: int

    def describe(self) -> dict:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self).items()}


def calibrate(
    setup: EngineSetup, tokenizer, prompts: tuple[str, ...] = PROMPTS, max_new_tokens: int = 64
) -> Calibration:
    """Run `setup`'s engine (a trained drafter alone: a fused engine's tau is lookup's too) on
    `prompts` with the recipe's sampling (greedy by default), then fit the profile to what it accepted.
    Accepted counts are recorded before an answer is cut at max_new_tokens or EOS, so every step counts."""
    if setup.mode != "drafter":
        raise ValueError(f"calibrate needs the trained drafter alone, not the {setup.mode!r} engine")
    if not prompts or max_new_tokens < 1:
        raise ValueError(f"calibrate needs prompts and max_new_tokens >= 1, got {len(prompts)} and {max_new_tokens}")
    spec, draft_time, accepted = setup.engine.spec, 0.0, []
    for text in prompts:
        out = setup.engine.generate([first_turn_ids(tokenizer, text)], max_new_tokens, seed=0)
        draft_time += out.timings.get("draft", 0.0)
        accepted += out.accepted[0]
    tree = spec.tree if spec.kind == "static" else build_tree(setup.accuracies, spec.budget, max_depth=spec.depth)
    observed = 1.0 + sum(accepted) / len(accepted)
    _, scale = fit_acceptance(setup.accuracies, tree, observed)
    steps = len(accepted)
    return Calibration(draft_time / steps, steps, observed, expected_tau(tree, setup.accuracies), scale, len(prompts))
