"""The engine on tiny models: greedy equals plain decoding for every drafter, tree shape and batch size;
stopping; the features handed to drafters; EAGLE drafting through the tree equals step-by-step drafting."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

from headway.features import FeatureSpec, TargetFeatures
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter
from headway.heads.medusa import MedusaHeads
from headway.inference.drafter import DraftTree
from headway.inference.drafters import EagleTreeDrafter, MedusaDrafter, ModelDrafter, layer_skip
from headway.inference.engine import SpecEngine
from headway.inference.trees import Tree, TreeSpec, chain, default_tree
from headway.sampling import SamplingParams


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small ops on 2 threads stall badly when other processes share the cores; 1 thread is steady."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


V = 64
SPECS = {
    "chain": TreeSpec("static", chain(4)),
    "static": TreeSpec("static", default_tree(20, 4)),
    "dynamic": TreeSpec("dynamic", depth=4, top_k=4, budget=16),
}


def _untied(num_layers=6, seed=0):
    m = tiny_llama(vocab_size=V, hidden_size=64, num_layers=num_layers, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    # Tied embeddings make a random model repeat its input; an untied head gives varied text.
    m.lm_head.weight = torch.nn.Parameter(
        torch.randn(m.lm_head.weight.shape, generator=g) * 0.3, requires_grad=False
    )
    return m


@pytest.fixture(scope="module")
def target():
    return _untied()


PROMPTS = [
    [5, 17, 33, 9, 41],
    [12, 7, 7, 60, 3, 22, 19, 8, 30],
    [44, 45, 46],
    [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
]


def plain(model, prompts, n, eos):
    out = []
    for p in prompts:
        toks = model.generate(
            torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )[0, len(p) :].tolist()
        out.append(toks[: toks.index(eos) + 1] if eos in toks else toks)
    return out


DRAFTERS = {
    "layer_skip": lambda t: ModelDrafter(layer_skip(t, 3)),
    "other_model": lambda t: ModelDrafter(_untied(2, seed=1)),
    "medusa": lambda t: MedusaDrafter(MedusaHeads.from_target(t, 4)),
    "eagle1": lambda t: EagleTreeDrafter(Eagle1Drafter.from_target(t)),
    "eagle3": lambda t: EagleTreeDrafter(Eagle3Drafter.from_target(t)),
}


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", list(SPECS))
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_equals_plain(target, name, tree, batch):
    ref = plain(target, PROMPTS, 30, eos=2)
    engine = SpecEngine(target, DRAFTERS[name](target), SPECS[tree], eos_ids={2})
    got = []
    for i in range(0, len(PROMPTS), batch):
        out = engine.generate(PROMPTS[i : i + batch], 30)
        got += out.tokens
        assert all(len(a) == f for a, f in zip(out.accepted, out.verify_forwards, strict=True))
    assert got == ref


def test_layer_skip_accepts_and_stops_at_eos(target):
    """A frequent token as EOS: rows stop mid-acceptance, at different steps, exactly where plain decoding does."""
    ref_free = plain(target, PROMPTS, 30, eos=2)
    eos = max(set(ref_free[0]), key=ref_free[0].count)
    ref = plain(target, PROMPTS, 30, eos=eos)
    engine = SpecEngine(target, ModelDrafter(layer_skip(target, 4)), SPECS["static"], eos_ids={eos})
    out = engine.generate(PROMPTS, 30)
    assert out.tokens == ref
    assert any(t[-1] == eos and len(t) < 30 for t in out.tokens)
    assert sum(map(sum, out.accepted)) > 10


def test_max_new_tokens_is_exact(target):
    engine = SpecEngine(target, ModelDrafter(layer_skip(target, 5)), SPECS["chain"], eos_ids=set())
    for n in (1, 2, 7):
        out = engine.generate(PROMPTS, n)
        assert [len(t) for t in out.tokens] == [n] * len(PROMPTS)
        assert out.tokens == [r[:n] for r in plain(target, PROMPTS, n, eos=-1)]


def test_bad_input_errors(target):
    engine = SpecEngine(target, ModelDrafter(layer_skip(target, 2)), SPECS["chain"], eos_ids=set())
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[1, 2], []], 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1, 2]], 0)
    with pytest.raises(ValueError, match="exceeds the 2 Medusa heads"):
        SpecEngine(target, MedusaDrafter(MedusaHeads.from_target(target, 2)), SPECS["chain"]).generate(
            [[1, 2]], 5
        )

    class Deep:
        def feature_spec(self):
            return FeatureSpec(layers=(6,))

    with pytest.raises(ValueError, match="layer 6, the target has layers 0..5"):
        SpecEngine(target, Deep(), SPECS["chain"])


def test_parents_must_precede_children(target):
    engine = SpecEngine(target, ModelDrafter(layer_skip(target, 2)), SPECS["chain"], eos_ids=set())
    root = engine.prefill([[1, 2, 3]])
    with pytest.raises(ValueError, match="parent must come before"):
        engine.verify(root, DraftTree(torch.tensor([[4, 5]]), torch.tensor([[2, 0]])))


def test_typical_acceptance_is_greedy_at_temperature_zero_and_sampled_accepts_only_typical_drafts(target):
    ref = plain(target, PROMPTS[:2], 20, eos=2)
    engine = SpecEngine(
        target, ModelDrafter(layer_skip(target, 3)), SPECS["static"], acceptance="typical", eos_ids={2}
    )
    assert engine.generate(PROMPTS[:2], 20).tokens == ref
    engine.sampling = SamplingParams(temperature=0.7)
    out = engine.generate(PROMPTS[:2], 20, seed=1)
    assert out.tokens != ref, "sampled at temperature 0.7, the text should leave the greedy one"
    # Every accepted draft token passes the rule against a plain forward: p(x) > min(threshold, alpha * e^-H)
    # (measured: 28 drafts accepted here).
    threshold, alpha = engine.typical
    checked = 0
    for prompt, toks, accepted in zip(PROMPTS[:2], out.tokens, out.accepted, strict=True):
        with torch.no_grad():
            probs = torch.softmax(target(torch.tensor([prompt + toks])).logits[0] / 0.7, -1)
        i = 1  # toks: the prefill's token, then per verification its accepted drafts and a bonus token
        for n in accepted:
            for j in range(i, min(i + n, len(toks))):
                p = probs[len(prompt) + j - 1]
                limit = min(threshold, alpha * float(torch.exp((p * p.clamp_min(1e-20).log()).sum())))
                assert float(p[toks[j]]) > limit * (1 - 1e-4), f"token {j}: p={float(p[toks[j]]):.4f} <= {limit:.4f}"
                checked += 1
            i += n + 1
    assert checked >= 15, f"only {checked} drafts accepted: the rule was hardly exercised"


class Recorder:
    """Wraps a drafter and keeps every Accepted it is shown."""

    def __init__(self, inner, spec):
        self.inner, self.spec, self.seen = inner, spec, []

    def feature_spec(self):
        return self.spec

    def reset(self):
        self.seen, self.rows = [], None
        self.inner.reset()

    def observe(self, acc):
        if self.rows is None:
            self.rows = list(range(acc.tokens.shape[0]))
        self.seen.append((acc, list(self.rows)))  # with the prompt index of each batch row
        self.inner.observe(acc)

    def draft(self, *a):
        return self.inner.draft(*a)

    def select_rows(self, keep):
        self.rows = [self.rows[i] for i in keep.tolist()]
        self.inner.select_rows(keep)


def test_drafter_sees_the_targets_features_of_accepted_tokens(target):
    """Every observed token comes with exactly the features a plain forward gives at its position."""
    spec = FeatureSpec(layers=(1, 5), final_normed=True)
    rec = Recorder(ModelDrafter(layer_skip(target, 3)), spec)
    engine = SpecEngine(target, rec, SPECS["dynamic"], eos_ids=set())
    out = engine.generate(PROMPTS[:3], 12)
    for b, prompt in enumerate(PROMPTS[:3]):
        seq = prompt + out.tokens[b]
        with torch.no_grad():
            hs = target(torch.tensor([seq]), output_hidden_states=True).hidden_states
        toks, feats = [], {1: [], 5: [], "final": []}
        for acc, rows in rec.seen:
            if b not in rows:
                continue
            r = rows.index(b)
            v = acc.valid[r]
            toks += acc.tokens[r][v].tolist()
            assert acc.positions[r][v].tolist() == list(range(len(toks) - int(v.sum()), len(toks)))
            feats[1].append(acc.feats.layers[1][r][v])
            feats[5].append(acc.feats.layers[5][r][v])
            feats["final"].append(acc.feats.final_normed[r][v])
        n = min(len(toks), len(seq))  # the last step may accept past max_new_tokens
        assert toks[:n] == seq[:n] and n >= len(seq) - 5
        got = {k: torch.cat(v)[:n] for k, v in feats.items()}
        assert torch.allclose(got[1], hs[2][0, :n], atol=1e-5)  # output of layer 1 = hidden_states[2]
        assert torch.allclose(got["final"], hs[-1][0, :n], atol=1e-5)  # after the final norm
        assert torch.allclose(target.model.norm(got[5]), hs[-1][0, :n], atol=1e-5)  # last layer, pre-norm


@pytest.mark.parametrize("version", [1, 3])
def test_eagle_tree_drafting_equals_step_by_step(target, version):
    """The adapter's chain proposal (tree masks, cache reuse, ragged rows) equals drafting from scratch."""
    torch.manual_seed(0)
    d = Eagle1Drafter.from_target(target) if version == 1 else Eagle3Drafter.from_target(target)
    for p in d.parameters():  # an untrained drafter is near-degenerate: randomise so predictions vary
        if p.requires_grad:
            p.data.normal_(0, 0.2)
    adapter = EagleTreeDrafter(d)
    engine = SpecEngine(target, adapter, SPECS["dynamic"], eos_ids=set())
    prompts = PROMPTS[:3]
    root = engine.prefill(prompts)
    seqs = [list(p) for p in prompts]
    for _ in range(3):
        acc, n_acc, bonus = engine.step(root)
        for r, n in enumerate(n_acc.tolist()):
            seqs[r] += acc[r, :n].tolist()
        root = bonus
    k = 4
    proposal = adapter.draft(root, TreeSpec("static", chain(k)), SamplingParams(), None).tokens
    for b, seq in enumerate(seqs):
        z = d.features_from_target(
            TargetFeatures(layers=_layer_outputs(target, seq, d.feature_spec().layers))
        )
        ids = seq[1:] + [int(root[b])]
        feats = z[0]
        want = []
        for _ in range(k):
            with torch.no_grad():
                st = d.step(torch.tensor([ids]), feats[None], torch.arange(len(ids))[None])
            tok = (
                int(d.to_target_ids(st.logits[0, -1].argmax()[None])[0])
                if version == 3
                else int(st.logits[0, -1].argmax())
            )
            want.append(tok)
            ids = ids + [tok]
            feats = torch.cat([feats, st.feature[0, -1:]], 0)
        assert proposal[b].tolist() == want


def _layer_outputs(target, seq, layers):
    """Decoder-layer outputs (before any final norm) of a plain forward over seq, by hooks."""
    out = {}
    hooks = [
        target.model.layers[i].register_forward_hook(
            lambda m, a, o, i=i: out.__setitem__(i, o[0] if isinstance(o, tuple) else o)
        )
        for i in layers
    ]
    with torch.no_grad():
        target(torch.tensor([seq]))
    for h in hooks:
        h.remove()
    return out


def test_static_tree_paths_validated_against_drafter_depth(target):
    drafter = MedusaDrafter(MedusaHeads.from_target(target, 3))
    deep = Tree([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)])
    with pytest.raises(ValueError, match="tree depth 4 exceeds the 3 Medusa heads"):
        SpecEngine(target, drafter, TreeSpec("static", deep), eos_ids=set()).generate([[1, 2, 3]], 5)
    fits = Tree([(0,), (0, 0), (0, 0, 0)])
    engine = SpecEngine(target, drafter, TreeSpec("static", fits), eos_ids=set())
    assert engine.generate([[1, 2, 3]], 5).tokens == plain(target, [[1, 2, 3]], 5, eos=-1)


def test_accepted_dataclass_shapes(target):
    rec = Recorder(MedusaDrafter(MedusaHeads.from_target(target, 4)), FeatureSpec(final_normed=True))
    SpecEngine(target, rec, SPECS["static"], eos_ids=set()).generate(PROMPTS[:2], 6)
    first = rec.seen[0][0]  # the prefill: the prompts, left padded
    assert first.tokens.shape == first.valid.shape == first.positions.shape
    assert first.valid[0].tolist() == [False] * 4 + [True] * 5
    for r, prompt in enumerate(PROMPTS[:2]):
        v = first.valid[r]
        assert first.tokens[r][v].tolist() == prompt
        assert first.positions[r][v].tolist() == list(range(len(prompt)))
    assert first.feats.final_normed.shape[:2] == first.tokens.shape
