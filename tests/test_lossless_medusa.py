"""fp32 greedy losslessness on the real SmolLM2 with Medusa heads (untrained: they draft like the
target's lm_head one token early) over a reduced 4,096-token draft vocabulary as in the recipe:
static and dynamic trees, batch 1 and batch 4, 20 prompts."""

from __future__ import annotations

import pytest
from lossless_common import SPECS, check_lossless, one_thread, recipe_vocab  # noqa: F401 (fixture)

from headway.heads.medusa import MedusaHeads
from headway.inference.drafters import MedusaDrafter
from headway.int8 import quantize_linears

pytestmark = pytest.mark.real_target

# Draft tokens accepted over the 20 prompts, measured: static 28, dynamic 22 (batch 1 and 4; 31 and 24 over 8,192 ids).
MIN_ACCEPTED = {"static": 20, "dynamic": 15}


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("tree", list(SPECS))
def test_medusa_greedy_is_lossless(smol_fp32, lossless_case, tree, batch):
    ids, refs = lossless_case
    drafter = MedusaDrafter(MedusaHeads.from_target(smol_fp32, num_heads=4, vocab=recipe_vocab(4096)))
    check_lossless(smol_fp32, drafter, SPECS[tree], ids, refs, batch, min_accepted=MIN_ACCEPTED[tree])


def test_medusa_int8_heads_greedy_is_lossless(smol_fp32, lossless_case):
    """int8 head weights (inference.draft_quantization) change what is drafted, never the output."""
    ids, refs = lossless_case
    heads = MedusaHeads.from_target(smol_fp32, num_heads=4, vocab=recipe_vocab(4096))
    assert quantize_linears(heads) == 8  # 4 blocks, 4 lm_heads
    check_lossless(smol_fp32, MedusaDrafter(heads), SPECS["static"], ids, refs, 4, min_accepted=MIN_ACCEPTED["static"])
