"""fp32 greedy losslessness on the real SmolLM2 with an EAGLE-3 drafter (untrained, its layer made a
pass-through by `echo_drafter` so that some drafts are accepted): static and dynamic trees, batch 1
and batch 4, 20 prompts over all six domains; an 8,192-token draft vocabulary (d2t map) as in the recipe;
its dynamic trees with prompt-lookup candidates fused in."""

from __future__ import annotations

import pytest
from lossless_common import (  # noqa: F401 (fixture)
    SPECS,
    check_fused,
    check_lossless,
    echo_drafter,
    fused,
    one_thread,
    recipe_vocab,
)

from headway.heads.eagle import Eagle3Drafter
from headway.inference.drafters import EagleTreeDrafter
from headway.int8 import Int8Linear, quantize_drafter

pytestmark = pytest.mark.real_target

# Draft tokens accepted over the 20 prompts, measured (batch 4): static 26, dynamic 20.
MIN_ACCEPTED = {"static": 16, "dynamic": 12}


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("tree", list(SPECS))
def test_eagle3_greedy_is_lossless(smol_fp32, lossless_case, tree, batch):
    ids, refs = lossless_case
    drafter = EagleTreeDrafter(echo_drafter(Eagle3Drafter.from_target(smol_fp32, vocab=recipe_vocab())))
    check_lossless(smol_fp32, drafter, SPECS[tree], ids, refs, batch, min_accepted=MIN_ACCEPTED[tree])


def test_eagle3_fused_with_lookup_greedy_is_lossless(smol_fp32, lossless_case):
    ids, refs = lossless_case
    eagle = EagleTreeDrafter(echo_drafter(Eagle3Drafter.from_target(smol_fp32, vocab=recipe_vocab())))
    drafter = fused(eagle, SPECS["dynamic"])
    check_lossless(smol_fp32, drafter, SPECS["dynamic"], ids, refs, 4, min_accepted=MIN_ACCEPTED["dynamic"])
    check_fused(drafter)


def test_eagle3_int8_drafter_greedy_is_lossless(smol_fp32, lossless_case):
    """int8 drafter weights (inference.draft_quantization) change what is drafted, never the output."""
    ids, refs = lossless_case
    d = echo_drafter(Eagle3Drafter.from_target(smol_fp32, vocab=recipe_vocab()))
    assert quantize_drafter(d) == 8  # q/k/v/o, gate/up/down, lm_head (not fc)
    assert not any(isinstance(m, Int8Linear) for m in smol_fp32.modules())
    check_lossless(smol_fp32, EagleTreeDrafter(d), SPECS["dynamic"], ids, refs, 4, min_accepted=MIN_ACCEPTED["dynamic"])
