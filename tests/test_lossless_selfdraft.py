"""fp32 greedy losslessness on the real SmolLM2 with a drafter that is often right (the target's
first 12 layers), so long accepted paths, ragged batches and cache compaction are exercised."""

from __future__ import annotations

import pytest
from lossless_common import check_lossless, one_thread, plain_greedy, prompts  # noqa: F401 (fixture)

from inference.drafters import ModelDrafter, layer_skip
from inference.trees import TreeSpec, default_tree

pytestmark = pytest.mark.real_target

SPECS = {
    "static": TreeSpec("static", default_tree(12, depth=4)),
    "dynamic": TreeSpec("dynamic", depth=5, top_k=3, budget=12),
}


@pytest.fixture(scope="module")
def case(smol_fp32, smol_tok):
    ids = prompts(smol_tok)
    return ids, plain_greedy(smol_fp32, ids)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("tree", list(SPECS))
def test_layer_skip_greedy_is_lossless(smol_fp32, case, tree, batch):
    ids, refs = case
    accepted = check_lossless(
        smol_fp32, ModelDrafter(layer_skip(smol_fp32, 12)), SPECS[tree], ids, refs, batch
    )
    assert accepted > 100, "the drafter should be right often enough to exercise long accepted paths"
