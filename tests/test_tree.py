"""Trees: path lists, the optimal-tree builder, and tree attention equal to chain attention.

The tree-mask test runs the real SmolLM2 in fp32: every node's logits from one tree-masked
forward on the engine's cache (left padding, ragged rows after real steps) must equal the logits
of a plain forward over that node's own chain, within 1e-4.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import transformers
from tiny_models import tiny_llama

from headway.inference.drafter import DraftTree
from headway.inference.drafters import ModelDrafter, layer_skip
from headway.inference.engine import SpecEngine
from headway.inference.layout import TreeLayout, ancestor_matrix, path_table
from headway.inference.trees import (
    DEFAULT_ACCURACIES,
    Tree,
    TreeSpec,
    build_tree,
    chain,
    default_tree,
    expected_tau,
    load_accuracies,
    per_rank,
)
from headway.kv import cache_kwarg, crop

# ---------------------------------------------------------------- static trees


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small ops on 2 threads stall badly when other processes share the cores; 1 thread is steady."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_tree_from_paths():
    t = Tree([[1], [0], [0, 0], [0, 1], [0, 0, 0]])
    assert t.paths == [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]
    assert t.parents == [0, 0, 1, 1, 3]
    assert t.depths == [0, 1, 1, 2, 2, 3]
    lay = t.layout(torch.device("cpu"), torch.float32)
    assert lay.anc[0, 5].tolist() == [True, True, False, True, False, True]
    assert lay.path_of[0, 5].tolist() == [0, 1, 3, 5]
    assert lay.mask[0, 0, 5, 2] == torch.finfo(torch.float32).min and lay.mask[0, 0, 5, 3] == 0



def test_static_tables_are_built_once_and_match_the_general_layout():
    t = Tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    cpu = torch.device("cpu")
    lay = t.layout(cpu, torch.float32)
    assert t.layout(cpu, torch.float32) is lay and t.draft_tables(cpu) is t.draft_tables(cpu)
    dyn = TreeLayout.of(torch.tensor([t.parents, t.parents]), torch.float32)  # a tree per row
    for name in ("parents", "depth", "anc", "mask", "path_of", "kids"):
        assert torch.equal(getattr(dyn, name)[1], getattr(lay, name)[0]), name
    assert lay.kids[0, 1].tolist() == [3, 4] and lay.kids[0, 6].tolist() == [-1, -1]
    assert lay.inner.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="parent must come before"):
        TreeLayout.of(torch.tensor([0, 2]), torch.float32)


def test_draft_tables_number_expanded_nodes_in_feeding_order():
    # Node 1 (rank 0) is a leaf, so node 2 is the first node fed after the root: expanded id 1.
    t = Tree([[0], [1], [1, 0], [1, 1], [1, 0, 0]])
    tab = t.draft_tables(torch.device("cpu"))
    assert tab.parents.tolist() == [0, 0, 2, 2, 3]
    assert tab.head.tolist() == [0, 0, 1, 1, 2] and tab.rank.tolist() == [0, 1, 0, 1, 0]
    fed = [(lv.expand_nodes.tolist(), lv.expand_parents.tolist()) for lv in tab.levels]
    assert fed == [([0], [-1]), ([2], [0]), ([3], [1])]
    lv = tab.levels[1]
    assert lv.child_nodes.tolist() == [3, 4] and lv.child_from.tolist() == [0, 0]
    assert lv.child_rank.tolist() == [0, 1] and lv.max_rank == 2

def test_tree_errors_name_the_path():
    with pytest.raises(ValueError, match=r"\[0, 1\] has no parent path \[0\]"):
        Tree([[1], [0, 1]])
    with pytest.raises(ValueError, match="ranks >= 0"):
        Tree([[-1]])
    with pytest.raises(ValueError, match="at least one"):
        chain(0)


def test_ancestors_and_paths_for_per_row_trees():
    parents = torch.tensor([[0, 1, 2, 0], [0, 0, 1, 3]])
    anc = ancestor_matrix(parents)
    depth = anc.sum(-1) - 1
    assert depth.tolist() == [[0, 1, 2, 3, 1], [0, 1, 1, 2, 3]]
    paths = path_table(anc, depth)
    assert paths[0, 3].tolist() == [0, 1, 2, 3]
    assert paths[1, 4].tolist() == [0, 1, 3, 4]


def _brute_best_tau(acc, budget, depth, ranks):
    """Best expected tau over all ancestor-closed trees of `budget` nodes (tiny spaces only)."""
    nodes = [p for d in range(1, depth + 1) for p in itertools.product(range(ranks), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(nodes, budget):
        s = set(subset)
        if all(len(p) == 1 or p[:-1] in s for p in subset):
            best = max(best, expected_tau(Tree(list(subset)), acc))
    return best


def test_build_tree_is_optimal_on_small_spaces():
    acc = [[0.5, 0.7, 0.8], [0.4, 0.55, 0.6], [0.3, 0.4, 0.45]]
    for budget in (1, 2, 4, 6):
        tree = build_tree(acc, budget)
        assert tree.num_nodes == budget
        assert expected_tau(tree, acc) == pytest.approx(_brute_best_tau(acc, budget, 3, 3))


def test_build_tree_shapes():
    assert build_tree([[0.9, 0.95]] * 4, 4).paths == chain(4).paths  # confident heads: a chain
    wide = build_tree([[0.2, 0.4, 0.55, 0.65]] * 3, 4)
    assert all(len(p) == 1 for p in wide.paths)  # unsure first head: go wide
    for budget in (8, 16, 32, 64):
        t = default_tree(budget, depth=5)
        assert t.num_nodes == budget and t.max_depth <= 5
        assert expected_tau(t, DEFAULT_ACCURACIES) > expected_tau(
            default_tree(budget // 2), DEFAULT_ACCURACIES
        )


def test_accuracy_file(tmp_path):
    f = tmp_path / "acc.json"
    f.write_text(
        json.dumps({"accuracy": [[0.6, 0.7, 0.75], {"topk": [0.3, 0.4, 0.45]}], "positions": [10, 9]})
    )
    acc = load_accuracies(f)
    assert per_rank(acc)[0] == pytest.approx([0.6, 0.1, 0.05])
    f.write_text(json.dumps({"heads": [[0.6, 0.5]]}))
    with pytest.raises(ValueError, match=r"heads\[0\] must be non-decreasing"):
        load_accuracies(f)
    f.write_text(json.dumps({"accuracy": [[0.6, 0.7], [0.5, 0.4]]}))
    with pytest.raises(ValueError, match=r"accuracy\[1\] must be non-decreasing"):
        load_accuracies(f)
    f.write_text(json.dumps({"per_head": []}))
    with pytest.raises(ValueError, match="'accuracy'"):
        load_accuracies(f)
    with pytest.raises(FileNotFoundError, match="nothere"):
        load_accuracies(tmp_path / "nothere.json")


def test_tree_spec_checks():
    with pytest.raises(ValueError, match="static TreeSpec needs a tree"):
        TreeSpec("static")
    with pytest.raises(ValueError, match="dynamic tree needs"):
        TreeSpec("dynamic", depth=0)


# ---------------------------------------------------------------- tree attention == chain attention


def _run_steps(engine, prompts, steps):
    """Prefill and `steps` real engine steps; returns each row's full sequence and the pending root."""
    root = engine.prefill(prompts)
    seqs = [list(p) for p in prompts]
    for _ in range(steps):
        acc, n_acc, bonus = engine.step(root)
        for r, n in enumerate(n_acc.tolist()):
            seqs[r] += acc[r, :n].tolist()
        root = bonus
    return seqs, root


def _check_tree_logits(model, engine, seqs, root, dt, atol):
    S = engine.kv_bias.shape[-1]
    ver = engine.verify(root, dt)
    crop(engine.cache, S)  # verify appended the tree's KV; the next check starts clean
    logits = ver.logits
    path_of = ver.layout.path_of.expand(len(seqs), -1, -1)
    depth = ver.layout.depth.expand(len(seqs), -1)
    ids = torch.cat([root[:, None], dt.tokens], 1)
    worst = 0.0
    for b, seq in enumerate(seqs):
        for node in range(ids.shape[1]):
            path = path_of[b, node, : int(depth[b, node]) + 1]
            chain_ids = torch.tensor([seq + ids[b, path].tolist()])
            with torch.no_grad():
                ref = model(chain_ids).logits[0, -1]
            worst = max(worst, float((logits[b, node] - ref).abs().max()))
    assert worst < atol, f"tree logits differ from chain logits by {worst:.2e}"
    return worst


@pytest.mark.real_target
def test_tree_mask_logits_equal_chain_logits_smollm2(smol_fp32, smol_tok):
    model = smol_fp32
    prompts = [
        smol_tok("The capital of France is")["input_ids"],
        smol_tok("1, 2, 3, 4, 5, 6, 7,")["input_ids"],
    ]
    assert len(prompts[0]) != len(prompts[1])  # left padding is exercised
    engine = SpecEngine(
        model, ModelDrafter(layer_skip(model, 6)), TreeSpec("static", default_tree(8, 3)), eos_ids=set()
    )
    seqs, root = _run_steps(engine, prompts, steps=2)  # ragged rows: cache holes, per-row positions
    tree = default_tree(12, depth=4)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (2, tree.num_nodes), generator=g)
    static = DraftTree(tokens, torch.tensor(tree.parents), static=tree)
    _check_tree_logits(model, engine, seqs, root, static, atol=1e-4)
    # Per-row shapes (dynamic trees) go through the general mask path.
    parents = torch.tensor([[0, 1, 1, 0, 3, 5], [0, 0, 2, 3, 1, 4]])
    dyn = DraftTree(tokens[:, :6], parents)
    _check_tree_logits(model, engine, seqs, root, dyn, atol=1e-4)


def test_tree_mask_logits_equal_chain_logits_tiny():
    model = tiny_llama(vocab_size=97, hidden_size=64, num_layers=2, seed=3)
    engine = SpecEngine(
        model, ModelDrafter(tiny_llama(97, 32, 1, seed=4)), TreeSpec("static", chain(3)), eos_ids=set()
    )
    seqs, root = _run_steps(engine, [[5, 6, 7], [9, 8, 7, 6, 5, 4, 3]], steps=3)
    tree = default_tree(12, depth=3)
    tokens = torch.randint(0, 97, (2, tree.num_nodes), generator=torch.Generator().manual_seed(1))
    _check_tree_logits(
        model, engine, seqs, root, DraftTree(tokens, torch.tensor(tree.parents), static=tree), 1e-5
    )


def test_compacted_cache_equals_plain_cache():
    """After ragged steps, every row's valid cache slots hold exactly a plain forward's keys and values."""
    model = tiny_llama(vocab_size=97, hidden_size=64, num_layers=2, seed=3)
    drafter = ModelDrafter(layer_skip(model, 1))
    engine = SpecEngine(model, drafter, TreeSpec("dynamic", depth=3, top_k=3, budget=8), eos_ids=set())
    seqs, _ = _run_steps(engine, [[5, 6, 7], [9, 8, 7, 6, 5, 4, 3], [11, 12]], steps=4)
    valid = engine.kv_bias[:, 0, 0] == 0
    assert len({len(s) for s in seqs}) > 1, "rows should have accepted different lengths"
    for b, seq in enumerate(seqs):
        ref = transformers.DynamicCache(config=model.config)  # filled in place: no output attribute, whose name changed in 5.x
        model(torch.tensor([seq]), use_cache=True, **cache_kwarg(model, ref))
        for layer, ref_layer in zip(engine.cache.layers, ref.layers, strict=True):
            keys = layer.keys[b][:, valid[b]]
            assert keys.shape == ref_layer.keys[0].shape
            assert torch.allclose(keys, ref_layer.keys[0], atol=1e-5)
            assert torch.allclose(layer.values[b][:, valid[b]], ref_layer.values[0], atol=1e-5)
