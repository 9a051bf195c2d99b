"""The continuous-batching generator: greedy output of `model.generate` alone, rows refilled, next turns
continued in place, sampling seeded per turn, and features equal to a fresh forward."""

from __future__ import annotations

import pytest
import torch
from lossless_common import one_thread  # noqa: F401  (small ops: one thread is steadier on a shared CPU)
from lossless_common import prompts as spec_bench_prompts
from tiny_models import tiny_llama

from headway.data.features import OnlineFeatures
from headway.data.generate import Generator, Turn, _prefill_groups, generate_batch
from headway.features import FeatureSpec
from headway.kv import SLOT_ATTENTION, decode_attention
from headway.sampling import SamplingParams

EOS = {0, 1}
SPEC = FeatureSpec(layers=(0, 2), final_normed=True)


@pytest.fixture(scope="module")
def model():
    """A random 3-layer Llama whose greedy answers vary and reach EOS (ids 0 and 1) at different lengths."""
    return tiny_llama(vocab_size=64, hidden_size=64, num_layers=3, seed=0, initializer_range=0.5)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 64, (n,), generator=g).tolist() for n in (5, 17, 3, 30, 9, 12, 60, 4, 8, 21)]


def reference(model, ids: list[int], max_new: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(EOS), pad_token_id=2
    )
    return out[0, len(ids) :].tolist()


class Conversation:
    """A job of several turns: each next turn is the context so far (answer verbatim) + `extra` tokens."""

    def __init__(self, ids, extra, seed=0):
        self.ids, self.extra, self.seed = list(ids), [list(e) for e in extra], seed
        self.turns, self.features, self.closed = [], None, 0

    def first_turn(self):
        return Turn(self.ids, self.seed)

    def answered(self, answer):
        self.turns.append((list(self.ids), answer.tokens))
        self.ids += answer.tokens
        if not self.extra:
            return None
        self.ids += self.extra.pop(0)
        return Turn(self.ids, self.seed + len(self.turns))

    def done(self, features):
        self.features, self.closed = features, self.closed + 1


@pytest.fixture(scope="module")
def refs(model, prompts):
    return [reference(model, p, 20) for p in prompts]


@pytest.fixture(params=["default", "regrouped", "late_refill"])
def grouping(request, monkeypatch):
    """default: the shipped group size and sorting rule; regrouped: groups of 2 rows, resorted by length at
    every decode step (SlotCache.select on a full batch), so a row's slots move between groups often;
    late_refill: free rows wait (feeding dummy tokens through the decode steps) until the whole batch is free."""
    import headway.data.generate as gen

    if request.param == "late_refill":
        monkeypatch.setattr(gen, "REFILL_FRACTION", 1)
    if request.param == "regrouped":
        monkeypatch.setattr(gen, "GROUP_ROWS", 2)
        monkeypatch.setattr(gen, "SORT_EVERY", 1)
        monkeypatch.setattr(gen, "SORT_GAIN", -1.0)  # any order that is not already sorted is resorted
    return request.param


@pytest.mark.parametrize("batch_size", [1, 3, 10])
def test_greedy_equals_generate_alone_with_refilled_rows(model, prompts, refs, batch_size, grouping):
    assert len({len(r) for r in refs}) > 2, "answers of several lengths: rows finish at different steps"
    got = generate_batch(model, prompts, 20, EOS, batch_size=batch_size)
    for p, r, a in zip(prompts, refs, got, strict=True):
        assert a.tokens == r, f"prompt of {len(p)} tokens"
        assert a.finished == (r[-1] in EOS)


def test_next_turns_continue_in_place_and_features_equal_a_fresh_forward(model, prompts, grouping):
    convs = [Conversation(p, [[7, 8, 9], [10, 11]] if k % 2 else []) for k, p in enumerate(prompts)]
    Generator(model, 4, 12, EOS, capture=SPEC).run(convs)
    fresh = OnlineFeatures(model, SPEC)
    for k, c in enumerate(convs):
        assert c.closed == 1 and len(c.turns) == (3 if k % 2 else 1)
        for ctx, answer in c.turns:  # every turn, its history included, answers as generate would
            assert answer == reference(model, ctx, 12)
        x = torch.tensor([c.ids])
        ref = fresh({"input_ids": x, "attention_mask": torch.ones_like(x)}).as_dict()
        assert set(c.features) == set(ref)
        for key, t in ref.items():  # fp32: prefills, decode steps and the closing step all match
            assert c.features[key].shape == t[0].shape
            scale = max(1.0, float(t.abs().max()))  # this random model's layer outputs reach several hundred
            assert (c.features[key] - t[0]).abs().max() <= 1e-4 * scale, key


@pytest.fixture(scope="module")
def shared_prompts(prompts):
    """The prompts behind one 12-token prefix, as chat prompts share the template's system turn; two also
    share a 20-token one, and two are the prefix plus one token (a row reusing all but its last token)."""
    prefix = list(range(40, 52))
    return [prefix + p for p in prompts] + [prefix + [7] * 8 + p for p in prompts[:2]] + [prefix + [9], prefix + [10]]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_refilled_rows_reuse_a_shared_prefix_and_answer_as_generate(model, shared_prompts, batch_size, grouping):
    gen = Generator(model, batch_size, 12, EOS)
    jobs = [Conversation(p, []) for p in shared_prompts]
    gen.run(jobs)
    for c in jobs:
        ((ctx, answer),) = c.turns
        assert answer == reference(model, ctx, 12), f"prompt of {len(ctx)} tokens"
    refills = len(shared_prompts) - batch_size
    assert gen.reused_tokens >= 12 * refills, "every refilled row skipped the shared prefix"


def test_reused_prefix_features_equal_a_fresh_forward(model, shared_prompts, grouping):
    convs = [Conversation(p, [[7, 8, 9]] if k % 2 else []) for k, p in enumerate(shared_prompts)]
    gen = Generator(model, 3, 10, EOS, capture=SPEC)
    gen.run(convs)
    assert gen.reused_tokens > 0
    fresh = OnlineFeatures(model, SPEC)
    for c in convs:
        for ctx, answer in c.turns:
            assert answer == reference(model, ctx, 10)
        x = torch.tensor([c.ids])
        for key, t in fresh({"input_ids": x, "attention_mask": torch.ones_like(x)}).as_dict().items():
            scale = max(1.0, float(t.abs().max()))
            assert c.features[key].shape == t[0].shape
            assert (c.features[key] - t[0]).abs().max() <= 1e-4 * scale, key


def test_a_row_reuses_only_what_it_shares():
    from headway.data.generate import MIN_REUSE, _Kept, _shared

    assert _shared([1, 2, 3, 4], [1, 2, 9], 10) == 2
    assert _shared([1, 2, 3], [1, 2, 3, 4], 10) == 3
    assert _shared([1, 2, 3], [1, 2, 3], 2) == 2, "the last prompt token is always fed: its logits start the answer"
    gen = Generator(tiny_llama(vocab_size=64, hidden_size=64, num_layers=1, seed=0), 1, 4, EOS)
    kept = _Kept(list(range(20)), {"f": torch.arange(20.0)[:, None]})
    row = gen._start(None, Turn(list(range(15)) + [60, 61]), kept=kept)
    assert row.fed == list(range(15)) and row.pending == [60, 61] and row.feats["f"][0].flatten().tolist() == list(range(15))
    short = gen._start(None, Turn(list(range(MIN_REUSE - 1)) + [60]), kept=kept)
    assert short.fed == [] and len(short.pending) == MIN_REUSE, "too little shared: a plain prefill from slot 0"
    assert gen.reused_tokens == 15


def test_sampling_depends_on_the_turns_seed_not_on_the_batch(model, prompts, grouping):
    def run(batch_size, order, seeds):
        convs = {k: Conversation(prompts[k], [[5, 6]], seed=seeds[k]) for k in order}
        Generator(model, batch_size, 10, EOS, SamplingParams(temperature=1.0, top_p=0.9)).run([convs[k] for k in order])
        return {k: c.turns for k, c in convs.items()}

    seeds = {k: 100 + k for k in range(len(prompts))}
    alone = run(1, list(range(len(prompts))), seeds)
    mixed = run(4, list(reversed(range(len(prompts)))), seeds)
    assert alone == mixed, "a row's samples do not depend on its batch, nor on the order rows come in"
    other = run(4, list(range(len(prompts))), {k: 7 + k for k in range(len(prompts))})
    assert other != alone
    greedy = [t for c in generate_batch(model, prompts, 10, EOS) for t in c.tokens]
    assert [t for v in alone.values() for _, a in v[:1] for t in a] != greedy, "sampling is not greedy"


def test_rows_are_sorted_into_groups_only_when_it_pays():
    from headway.data.generate import _regroup_order
    from headway.kv import decode_reads

    mixed = [900, 40, 900, 40, 900, 40, 900, 40]  # groups of 2: every group as wide as 900
    order = _regroup_order(mixed, 2)
    assert order is not None and [mixed[i] for i in order] == sorted(mixed)
    assert decode_reads([mixed[i] for i in order], 2) < 0.6 * decode_reads(mixed, 2)
    assert _regroup_order(sorted(mixed), 2) is None, "already sorted: no copy"
    assert _regroup_order([100, 120, 90, 110], 2) is None, "similar lengths: within one capacity step, no gain"


def test_prefill_groups_bound_padding():
    lengths = [5, 400, 6, 7, 390, 5000]
    groups = _prefill_groups(list(range(6)), lengths)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        real = sum(lengths[i] for i in g)
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 1.25 * real
    assert [5] in groups, "a prompt longer than a forward's budget goes alone"


def test_decode_attention_is_switched_back(model):
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError), decode_attention(model):
        assert model.config._attn_implementation == SLOT_ATTENTION
        raise RuntimeError
    assert model.config._attn_implementation == before


@pytest.mark.real_target
def test_real_target_fp32_greedy_equals_generate(smol_fp32, smol_tok):
    ids = spec_bench_prompts(smol_tok)[:5]
    refs = []
    for p in ids:
        x = torch.tensor([p])
        out = smol_fp32.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False, eos_token_id=2, pad_token_id=2)
        refs.append(out[0, len(p) :].tolist())
    got = generate_batch(smol_fp32, ids, 16, {2}, batch_size=3)  # 5 prompts over 3 rows: two are refills
    assert [a.tokens for a in got] == refs


@pytest.mark.real_target
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_real_target_features_equal_a_fresh_forward(smol_fp32, smol_tok, dtype):
    """SmolLM2's states reach 2.5e4 (layer 14), so errors are relative: ||captured - fresh|| / ||fresh||.
    Measured: fp32 <= 1.2e-6 (final normed state within 8e-5 absolute with MKL's fp32 matmul on a Xeon,
    1.1e-4 with oneDNN's packed fp32 on an AVX2 EPYC, 6e-5 unpacked there); bf16 <= 0.017 (layer 29 and
    the final normed state), below how far a bf16 forward itself lies from fp32 (0.003-0.032)."""
    from headway.config import TargetConfig
    from headway.data.features import data_feature_spec
    from headway.target import load_target

    model = smol_fp32 if dtype == "float32" else load_target(TargetConfig(device="cpu"), dtype=torch.bfloat16)[0]
    spec = data_feature_spec(["medusa", "eagle", "eagle3"], 30)
    follow = smol_tok("<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    convs = [Conversation(p, [follow]) for p in spec_bench_prompts(smol_tok)[:3]]
    gen = Generator(model, 2, 16, {2}, capture=spec)
    gen.run(convs)
    assert gen.reused_tokens >= 24, "the third conversation's row kept the chat template's system turn"
    fresh = OnlineFeatures(model, spec)
    bound = 1e-5 if dtype == "float32" else 0.03
    for c in convs:
        x = torch.tensor([c.ids])
        for key, t in fresh({"input_ids": x, "attention_mask": torch.ones_like(x)}).as_dict().items():
            got, want = c.features[key].float(), t[0].float()
            assert got.shape == want.shape and (got - want).norm() / want.norm() <= bound, key
            if dtype == "float32" and key == "features.final_normed":
                assert (got - want).abs().max() <= 2e-4


def test_slot_cache_groups_grow_shrink_and_regroup_without_losing_a_slot():
    """SlotCache alone: rows of mixed lengths written by prefills and decode steps, read back (gathered)
    equal to a dense reference after groups grew, shrank and were regrouped by `select`."""
    from headway.kv import CAPACITY_STEP, SlotCache

    g = torch.Generator().manual_seed(0)
    rows, heads, dim = 7, 2, 4
    cache = SlotCache(rows, capacity=0, group_rows=3)  # groups of 3, 3 and 1 rows
    layer = None
    dense = torch.zeros(rows, heads, 512, dim)  # what each row's slots must hold
    lengths = [0] * rows

    def write(row_ids, n):
        nonlocal layer
        starts = torch.tensor([lengths[r] for r in row_ids])
        k = torch.randn(len(row_ids), heads, n, dim, generator=g)
        width = cache.plan(None if row_ids == list(range(rows)) else torch.tensor(row_ids), starts, n)
        keys, _ = cache.update(k, k.clone(), 0)  # layer 0, made on first use
        layer = cache.layers[0]
        for j, r in enumerate(row_ids):
            dense[r, :, lengths[r] : lengths[r] + n] = k[j]
            lengths[r] += n
        return keys, width

    def check(after_decode=True):
        got = layer._gather(layer.keys, range(rows), max(lengths))
        for r in range(rows):
            assert torch.equal(got[r, :, : lengths[r]], dense[r, :, : lengths[r]]), r
        for k, n in enumerate(cache.group_sizes() if after_decode else []):  # each group at most one step wider than its longest row
            longest = max(lengths[k * 3 : k * 3 + n])
            assert layer.keys[k].shape[2] == cache.caps[k] and cache.caps[k] - longest < 2 * CAPACITY_STEP + 1

    keys, width = write([0, 2, 4], 200)  # prefills of new rows: groups 0 and 1 grow
    assert width == 200 and torch.equal(keys, dense[[0, 2, 4], :, :200])  # the forward's own keys, not a gather
    write([1, 3, 5, 6], 10)
    keys, width = write([0, 3], 5)  # a prefill continuing rows: their earlier slots gathered with the new ones
    assert width == 205 and torch.equal(keys[1, :, :15], dense[3, :, :15]) and not keys[1, :, 15:].any()
    assert torch.equal(keys[0], dense[0, :, :205])
    keys, width = write(list(range(rows)), 1)  # a decode step over every row
    assert width == max(cache.caps) and isinstance(keys, torch.Tensor)  # not grouped: one gathered tensor
    check()
    wide = max(cache.caps) + CAPACITY_STEP  # past every group's width: those slots read as 0, never as old memory
    del_me = torch.full((rows, heads, wide, dim), float("nan"))  # freed at once: the gather's buffer may reuse it
    del del_me
    got = layer._gather(layer.keys, range(rows), wide)
    assert not got.isnan().any() and all(not got[r, :, cache.caps[r // 3] :].any() for r in range(rows))
    for _ in range(3):
        write(list(range(rows)), 1)
    order = sorted(range(rows), key=lambda r: lengths[r])  # regroup: long rows together
    cache.select(torch.tensor(order))
    dense, lengths = dense[order].clone(), [lengths[r] for r in order]
    check(after_decode=False)  # groups keep their widths until a decode step names every row's length
    write(list(range(rows)), 1)  # a decode step after regrouping shrinks the short rows' groups
    check()
    assert cache.caps[0] < cache.caps[-1]
    cache.select(torch.tensor([6, 0]))  # rows leave
    dense, lengths = dense[[6, 0]].clone(), [lengths[6], lengths[0]]
    rows = 2
    check(after_decode=False)
