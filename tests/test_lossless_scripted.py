"""fp32 greedy losslessness on the real SmolLM2 with a drafter that is often right (it knows plain
greedy's answer and proposes it with errors), so long accepted paths, rejections at every depth,
ragged batches and cache compaction are all exercised on the real model, static and dynamic trees;
and the same drafter's trees with prompt-lookup candidates fused in (batch 1 and 4)."""

from __future__ import annotations

import pytest
from lossless_common import (  # noqa: F401 (fixture)
    ScriptedDrafter,
    check_fused,
    check_lossless,
    fused,
    one_thread,
)

from headway.inference.trees import TreeSpec, default_tree

pytestmark = pytest.mark.real_target

SPECS = {
    "static": TreeSpec("static", default_tree(12, depth=5)),
    "dynamic": TreeSpec("dynamic", depth=5, top_k=3, budget=12),
}


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("tree", list(SPECS))
def test_scripted_drafter_greedy_is_lossless(smol_fp32, lossless_case, tree, batch):
    ids, refs = lossless_case
    drafter = ScriptedDrafter([p + r for p, r in zip(ids, refs, strict=True)], smol_fp32.config.vocab_size)
    # min_accepted: the drafter should be right often enough to exercise long accepted paths
    check_lossless(smol_fp32, drafter, SPECS[tree], ids, refs, batch, min_accepted=121)


@pytest.mark.parametrize(("tree", "batch"), [("static", 1), ("dynamic", 4)])
def test_fused_scripted_and_lookup_greedy_is_lossless(smol_fp32, lossless_case, tree, batch):
    ids, refs = lossless_case
    scripted = ScriptedDrafter([p + r for p, r in zip(ids, refs, strict=True)], smol_fp32.config.vocab_size)
    drafter = fused(scripted, SPECS[tree])
    check_lossless(smol_fp32, drafter, SPECS[tree], ids, refs, batch, min_accepted=121)
    check_fused(drafter)
