"""fp32 greedy losslessness on the real SmolLM2 with an EAGLE-1 drafter (untrained, its layer made a
pass-through by `echo_drafter` so that some drafts are accepted): static and dynamic trees, batch 1
and batch 4, 20 prompts over all six domains."""

from __future__ import annotations

import pytest
from lossless_common import SPECS, check_lossless, echo_drafter, one_thread  # noqa: F401 (fixture)

from headway.heads.eagle import Eagle1Drafter
from headway.inference.drafters import EagleTreeDrafter

pytestmark = pytest.mark.real_target

# Draft tokens accepted over the 20 prompts, measured (batch 4): static 28, dynamic 19.
MIN_ACCEPTED = {"static": 18, "dynamic": 12}


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("tree", list(SPECS))
def test_eagle1_greedy_is_lossless(smol_fp32, lossless_case, tree, batch):
    ids, refs = lossless_case
    drafter = EagleTreeDrafter(echo_drafter(Eagle1Drafter.from_target(smol_fp32)))
    check_lossless(smol_fp32, drafter, SPECS[tree], ids, refs, batch, min_accepted=MIN_ACCEPTED[tree])
