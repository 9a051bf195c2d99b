"""The llama.cpp report from hand-made records: accepted-length histogram from per-position counts, tau,
acceptance per depth, speedups, identical answers and where others part, and the ceiling arithmetic."""

from __future__ import annotations

import json

import pytest

from headway.inference.llamacpp_ceiling import ceiling, expected_tau, mean_verify_cost, parse_bench, reached
from headway.inference.llamacpp_eval import DraftSettings, LlamaConfig, TurnRecord, configs_for
from headway.inference.llamacpp_report import (
    accepted_per_step,
    divergences,
    llamacpp_markdown,
    llamacpp_report,
    summarize_config,
)
from headway.inference.report import markdown

CURVE = {1: 0.010, 2: 0.015, 4: 0.026, 8: 0.043, 16: 0.079}  # phase 1's relative costs 1.5 / 2.6 / 4.3 / 7.9


def _rec(config, qid=1, domain="qa", tokens=None, ms=1000.0, turn=0, **spec):
    tokens = tokens if tokens is not None else list(range(30))
    return TurnRecord(config, qid, domain, turn, 50, tokens, prompt_ms=500.0, predicted_ms=ms, **spec)


def test_steps_and_tau_from_counters():
    # 30 tokens: 1 from the prefill, 29 from 20 forwards with 9 accepted; 10 steps drafted (2 tokens each),
    # 6 accepted position 0, 3 of those also position 1
    r = _rec("eagle3-f16", drafted=20, accepted=9, draft_steps=10, per_position=[6, 3])
    steps = accepted_per_step(r)
    assert len(steps) == 20 and sum(steps) == 9
    assert sorted(steps) == [0] * 14 + [1] * 3 + [2] * 3  # 10 undrafted + 4 drafted-but-rejected
    s = summarize_config([r], None)
    assert s["tau"] == pytest.approx(1 + 9 / 20) and s["alpha"] == [0.6, 0.5]
    assert s["tokens_per_s"] == 30.0 and s["end_to_end_tokens_per_s"] == 20.0 and s["acceptance"] == 0.45
    with pytest.raises(ValueError, match="longer than n-max"):
        accepted_per_step(_rec("x", accepted=5, draft_steps=2, per_position=[2, 1]))


def test_divergences_name_question_turn_and_token():
    ref = [
        _rec("plain", 1, tokens=[1, 2, 3]),
        _rec("plain", 2, tokens=[4, 5, 6]),
        _rec("plain", 2, tokens=[7], turn=1),
    ]
    mine = [
        _rec("x", 1, tokens=[1, 2, 3]),
        _rec("x", 2, tokens=[4, 5, 6]),
        _rec("x", 2, tokens=[7, 8], turn=1),
    ]
    assert divergences(mine, ref) == (2, [{"question_id": 2, "domain": "qa", "turn": 1, "index": 1}])


def test_report_rows_speedups_and_ceiling():
    configs = [
        LlamaConfig("plain-f16", "f16"),
        LlamaConfig("plain-q4_1", "q4_1"),
        LlamaConfig("eagle3-f16", "f16", "draft-eagle3", ("-md", "d.gguf")),
        LlamaConfig("ngram-simple", "f16", "ngram-simple"),
        LlamaConfig("ngram-mod", "f16", "ngram-mod"),
    ]
    records = []
    for qid, domain in ((1, "qa"), (2, "rag")):
        records += [
            _rec("plain-f16", qid, domain, ms=1000.0),  # 30 tok/s
            _rec("plain-q4_1", qid, domain, tokens=list(range(1, 31)), ms=600.0),  # 50 tok/s, other tokens
            _rec(
                "eagle3-f16", qid, domain, ms=800.0, drafted=20, accepted=9, draft_steps=20, per_position=[9]
            ),
            _rec(
                "ngram-simple", qid, domain, ms=900.0, drafted=8, accepted=4, draft_steps=2, per_position=[2]
            ),
            _rec("ngram-mod", qid, domain, tokens=[0, 1, 9], ms=100.0),  # 30 tok/s, differs at token 2
        ]
    meta = {"method": "eagle3 in llama.cpp", "tree": {"kind": "chain", "depth": 1}}
    report = llamacpp_report(records, configs, meta, CURVE, "f16", 1)
    o = report["overall"]
    assert o["ar_tokens_per_s"] == 30.0 and o["spec_tokens_per_s"] == 37.5 and o["speedup"] == 1.25
    assert o["tau"] == pytest.approx(1 + 18 / 40) and o["alpha"] == [0.45] and o["identical_to_ar"] == 2
    assert o["pld_speedup"] == round((60 / 1.8) / 30, 4)  # ngram-simple: the faster n-gram type
    ll = report["llamacpp"]
    assert ll["fastest_plain"] == "plain-q4_1" and ll["best_ngram"] == "ngram-simple"
    drafter = ll["configs"]["eagle3-f16"]["overall"]
    assert (
        drafter["speedup"] == 1.25
        and drafter["speedup_vs_fastest_plain"] == 0.75
        and drafter["identical"] == 2
    )
    mod = ll["configs"]["ngram-mod"]
    assert mod["overall"]["identical"] == 0 and mod["domains"]["rag"]["divergences"][0]["index"] == 2
    assert ll["configs"]["plain-q4_1"]["overall"].get("identical") is None  # plain: it is a reference
    # alpha 0.45 with a 2-token forward costing 1.5x: at most 1.45 / 1.5; 1.25x reached 86% of it
    assert ll["ceiling"]["measured"]["speedup"] == pytest.approx(1.45 / 1.5, abs=1e-4)
    assert ll["reached_of_ceiling"] == pytest.approx(1.25 / round(1.45 / 1.5, 4), abs=1e-3)
    text = markdown(report) + llamacpp_markdown(report)
    assert "| eagle3-f16 | f16 | 37.5 |" in text and "question 2 (rag), turn 1, from token 2" in text
    assert "a one-token chain pays only with acceptance above 0.50" in text
    json.dumps(report)  # report.json-ready


def test_ceiling_arithmetic():
    assert expected_tau([0.6, 0.5], 2) == pytest.approx(1 + 0.6 + 0.3)
    c = ceiling(CURVE, [0.6, 0.5], n_max=1, tau=1.5)
    assert c["per_chain"][0] == {"n": 1, "tau": 1.6, "cost": 1.5, "speedup": round(1.6 / 1.5, 4)}
    assert c["per_chain"][1]["cost"] == pytest.approx(2.05)  # 3 tokens: between 2 (1.5x) and 4 (2.6x)
    assert c["best"]["n"] == 1 and c["alpha1_needed"] == 0.5 and c["measured"]["speedup"] == 1.0
    assert reached(0.9, c["measured"]) == 0.9 and reached(None, c["measured"]) is None
    bench = (
        '[{"n_prompt": 2, "n_gen": 0, "avg_ns": 15000000}, {"n_prompt": 1, "n_gen": 0, "avg_ns": 10000000}]'
    )
    assert parse_bench(bench) == {1: 0.01, 2: 0.015}


def test_ceiling_counts_the_steps_a_p_min_left_without_draft():
    # 20 steps, 10 carried one draft token (1.5x), 10 verified alone (1x): 1.25 one-token forwards per step
    assert mean_verify_cost(CURVE, 20, 10, 10) == pytest.approx(1.25)
    assert mean_verify_cost(CURVE, 20, 10, 20) == pytest.approx((10 + 10 * 2.05) / 20)  # 2-token drafts
    assert mean_verify_cost(CURVE, 20, 0, 0) == 1.0
    c = ceiling(CURVE, [0.7], n_max=1, tau=1.35, steps=(20, 10, 10))
    assert c["measured"] == {"tau": 1.35, "cost": 1.25, "speedup": round(1.35 / 1.25, 4)}
    assert ceiling(CURVE, [0.7], n_max=1, tau=1.35)["measured"]["cost"] == 1.5  # as if every step drafted
    with pytest.raises(ValueError, match="11 steps with a draft out of 10"):
        mean_verify_cost(CURVE, 10, 11, 11)


def test_draft_settings_and_variant_configurations(tmp_path):
    assert DraftSettings.parse("2:0.6") == DraftSettings(2, 0.6) and DraftSettings.parse(" 1 ") == DraftSettings(1)
    assert DraftSettings(2, 0.6).label == "n2-p0.6" and DraftSettings(1).label == "n1"
    assert DraftSettings(1, 0.4).args() == ("--spec-draft-n-max", "1", "--spec-draft-p-min", "0.4")
    assert DraftSettings(3).args() == ("--spec-draft-n-max", "3")
    for bad in ("two", "1:x", "0", "1:1.0", "1:-0.1"):
        with pytest.raises(ValueError, match="draft settings"):
            DraftSettings.parse(bad)
    manifest = {"draft": "draft-q8_0.gguf", "targets": {"f16": "t.gguf", "q4_1": "q.gguf"}, "n_max": 1}
    (tmp_path / "headway_llamacpp.json").write_text(json.dumps(manifest))  # written before p_min existed
    variants = (DraftSettings(1), DraftSettings(2, 0.6))  # n1 is the drafter's own: not run twice
    configs = {c.name: c for c in configs_for(tmp_path, ngram=(), combos=(), variants=variants)}
    assert list(configs) == ["plain-f16", "plain-q4_1", "eagle3-f16", "eagle3-q4_1", "eagle3-f16-n2-p0.6"]
    assert configs["eagle3-f16"].args[2:] == ("--spec-draft-n-max", "1")
    assert configs["eagle3-f16-n2-p0.6"].kind == "drafter" and configs["eagle3-f16-n2-p0.6"].target == "f16"
    assert configs["eagle3-f16-n2-p0.6"].args[2:] == ("--spec-draft-n-max", "2", "--spec-draft-p-min", "0.6")
    (tmp_path / "headway_llamacpp.json").write_text(json.dumps({**manifest, "p_min": 0.4}))
    own = configs_for(tmp_path, ngram=(), combos=("ngram-mod",))
    assert all(c.args[2:] == ("--spec-draft-n-max", "1", "--spec-draft-p-min", "0.4") for c in own if c.args)
    assert configs_for(tmp_path, ngram=(), combos=(), p_min=0.0)[2].args[2:] == ("--spec-draft-n-max", "1")
    # the export's flash attention setting reaches every server, plain ones included; one given overrides it
    (tmp_path / "headway_llamacpp.json").write_text(json.dumps({**manifest, "flash_attn": "off"}))
    configs = configs_for(tmp_path, ngram=("ngram-mod",), combos=("ngram-mod",), variants=(DraftSettings(2),))
    assert len(configs) == 7 and all(c.args[-2:] == ("-fa", "off") for c in configs)
    assert configs[0].server_args() == ["-fa", "off"] and configs[2].args[2:] == ("--spec-draft-n-max", "1", "-fa", "off")
    assert all(c.args[-2:] == ("-fa", "on") for c in configs_for(tmp_path, ngram=(), combos=(), flash_attn="on"))
    with pytest.raises(ValueError, match="flash attention 'yes'"):
        configs_for(tmp_path, flash_attn="yes")
