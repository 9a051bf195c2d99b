"""Shared helpers: left padding, cutting at EOS, the greedy baseline, timing and A/B tables, and the KV-cache operations in headway.kv."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import DynamicCache

from headway import kv
from headway.bench import ArmTotals, ab_table, interleaved, timed
from headway.data.chat import first_turn_ids
from headway.target import plain_greedy, stop_token_ids
from headway.tokens import cut_at_eos, left_pad


def test_left_pad_right_aligns_rows_and_marks_them_valid():
    ids, valid = left_pad([[5, 6, 7], [9], (3, 4)], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9], [0, 3, 4]]
    assert valid.tolist() == [[True] * 3, [False, False, True], [False, True, True]]
    assert ids.dtype == torch.long and valid.dtype == torch.bool
    with pytest.raises(ValueError, match="no rows"):
        left_pad([], pad_id=0)


def test_cut_at_eos_keeps_the_first_eos_and_nothing_after():
    assert cut_at_eos([4, 2, 5, 2], {2}) == [4, 2]
    assert cut_at_eos([4, 5], {2}) == [4, 5]
    assert cut_at_eos([7, 4, 3], [3, 7]) == [7]
    assert cut_at_eos([], {2}) == []


def test_timed_measures_the_block():
    with timed(torch.device("cpu")) as m:
        time.sleep(0.02)
    assert 0.02 <= m.seconds < 1.0


def _cache(batch: int = 2, length: int = 6, layers: int = 2) -> DynamicCache:
    """A cache whose key at [b, h, s, 0] is 100 * b + s (values: the negative), per layer."""
    cache = DynamicCache()
    s = torch.arange(length, dtype=torch.float32)
    k = (100 * torch.arange(batch, dtype=torch.float32)[:, None] + s)[:, None, :, None].expand(batch, 2, length, 3)
    for i in range(layers):
        cache.update(k.clone() + 1000 * i, -k.clone(), i)
    return cache


def _slot_ids(t: torch.Tensor) -> list[list[int]]:
    return t[:, 0, :, 0].long().tolist()


def test_crop_keeps_the_first_slots_of_every_layer():
    cache = _cache()
    kv.crop(cache, 8)  # longer than the cache: nothing happens
    assert cache.get_seq_length() == 6
    kv.crop(cache, 4)
    for i, layer in enumerate(cache.layers):
        assert _slot_ids(layer.keys - 1000 * i) == [[0, 1, 2, 3], [100, 101, 102, 103]]
        assert layer.values.shape[2] == 4


def test_keep_path_moves_each_rows_path_behind_the_start_and_drops_the_rest():
    cache = _cache()
    kv.keep_path(cache, 2, torch.tensor([[0, 2, 3], [0, 1, 0]]))  # row 1: only 2 slots meant, 1 padding
    for i, layer in enumerate(cache.layers):
        assert _slot_ids(layer.keys - 1000 * i) == [[0, 1, 2, 4, 5], [100, 101, 102, 103, 102]]
        assert _slot_ids(-layer.values) == [[0, 1, 2, 4, 5], [100, 101, 102, 103, 102]]


def test_select_rows_keeps_the_chosen_batch_rows():
    cache = _cache(batch=3)
    kv.select_rows(cache, torch.tensor([2, 0]))
    assert [row[0] for row in _slot_ids(cache.layers[1].keys - 1000)] == [200, 0]


def test_interleaved_rotates_the_arms_and_sums_per_arm():
    calls = []

    def run(arm, payload):
        calls.append(arm)
        return [payload] * (1 + "abc".index(arm))

    totals = interleaved(["a", "b", "c"], [("q1", 7), ("q2", 8), ("q3", 9), ("q4", 1)], run, progress=False)
    assert calls == list("abc" "bca" "cab" "abc")  # each item through every arm, order rotated by one
    assert [totals[a].tokens for a in "abc"] == [4, 8, 12]
    assert totals["c"].answers == {"q1": [7] * 3, "q2": [8] * 3, "q3": [9] * 3, "q4": [1] * 3}
    assert all(t.seconds > 0 and t.tokens_per_s > 0 for t in totals.values())


def test_ab_table_compares_the_last_arm_with_the_first():
    totals = {
        ("old", "plain"): ArmTotals(100, 10.0, {"q": [1, 2]}),
        ("old", "spec"): ArmTotals(100, 5.0, {"q": [1, 2]}),
        ("new", "plain"): ArmTotals(100, 10.0, {"q": [1, 2]}),
        ("new", "spec"): ArmTotals(100, 4.0, {"q": [1, 3]}),
    }
    lines = ab_table(totals, ["old", "new"], ["plain", "spec"], "weights")
    assert lines[0].startswith("| weights | method |") and len(lines) == 2 + 4 + 2
    assert lines[3] == "| old | spec | 100 | 5.0 | 20.0 | 2.000x |"
    assert lines[-1] == "spec: new / old tokens/s 1.250x; answers identical 0/1"
    assert lines[-2] == "plain: new / old tokens/s 1.000x; answers identical 1/1"


def test_plain_greedy_is_cut_after_the_first_stop_token(smol_fp32, smol_tok):
    stops = stop_token_ids(smol_fp32, smol_tok)
    answer = plain_greedy(smol_fp32, smol_tok, first_turn_ids(smol_tok, "Say hello."), 64)
    assert 0 < len(answer) < 64 and answer[-1] in stops
    assert not stops & set(answer[:-1])
