"""Questions, the report's definitions, engine building from a recipe, and evaluate.py end to end (tiny target)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headway.config import load_config
from headway.inference.build import build_engine, retune_budget
from headway.inference.questions import MT_BENCH, MULTI_TURN, load_questions
from headway.inference.report import (
    PLAIN,
    MethodRun,
    PromptResult,
    build_report,
    markdown,
    phase_table,
    summarize,
    table,
    write_report,
)

ROOT = Path(__file__).resolve().parents[1]
SPEC_BENCH = ROOT / "data/prompts/spec_bench/question.jsonl"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------- questions


def test_spec_bench_domains_and_even_mt_bench():
    qs = load_questions(SPEC_BENCH, per_domain=8)
    domains = {}
    for q in qs:
        domains.setdefault(q.domain, []).append(q)
    assert set(domains) == {MULTI_TURN, "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert all(len(v) == 8 for v in domains.values())
    assert sorted(q.category for q in domains[MULTI_TURN]) == sorted(MT_BENCH)  # one per sub-category
    assert all(len(q.turns) == 2 for q in domains[MULTI_TURN])
    assert len(load_questions(SPEC_BENCH)) == 480


def test_question_errors(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"question_id": 1, "turns": ["hi"]}\n')
    with pytest.raises(ValueError, match=r"q\.jsonl:1: missing key 'category'"):
        load_questions(f)
    f.write_text('{"question_id": 1, "category": "x", "turns": []}\n')
    with pytest.raises(ValueError, match="non-empty list"):
        load_questions(f)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_questions(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------- report definitions


def test_summary_definitions(tmp_path):
    pld = "hf-prompt-lookup"
    a = PromptResult(1, "qa", "qa", 1)
    a.runs = {
        PLAIN: MethodRun(10, 1.0),
        "medusa": MethodRun(10, 0.5, accepted=[0, 2, 3], identical=True, timings={"draft": 0.03, "verify": 0.1}),
        pld: MethodRun(10, 0.8, forwards=6, identical=True),
        "lookup": MethodRun(9, 0.9, accepted=[1, 1, 1, 1], identical=False),
    }
    b = PromptResult(2, "rag", "rag", 1)
    b.runs = {
        PLAIN: MethodRun(30, 3.0),
        "medusa": MethodRun(28, 1.0, accepted=[1, 3], identical=False, timings={"draft": 0.02, "verify": 0.1}),
        pld: MethodRun(30, 3.0, forwards=21, identical=True),
    }
    s = summarize([a, b], 3, [PLAIN, "medusa", pld, "lookup"], headline="medusa", pld=pld)
    assert s["tau"] == pytest.approx(1 + 9 / 5)
    # depth 1: reached 5, accepted 4; depth 2: reached 4, accepted 3; depth 3: reached 3, accepted 2
    assert s["alpha"] == pytest.approx([4 / 5, 3 / 4, 2 / 3], abs=1e-4)
    assert s["accept_hist"] == [1, 1, 1, 2]
    assert s["speedup"] == pytest.approx((38 / 1.5) / (40 / 4.0), abs=1e-3)  # summed tokens / summed times
    assert s["pld_speedup"] == pytest.approx((40 / 3.8) / (40 / 4.0), abs=1e-3)
    assert s["pld_tau"] == pytest.approx((40 - 2) / (27 - 2), abs=1e-3)
    assert s["identical_to_ar"] == 1
    assert s["ms_per_step"] == {"draft": 10.0, "verify": 40.0}  # per verification: 0.05 s and 0.2 s over 5
    lk = s["methods"]["lookup"]  # a method only one prompt ran: its own sums, plain's rate as the base
    assert lk["tau"] == 2.0 and lk["alpha"] == [1.0, 0.0, None] and lk["identical_to_plain"] == 0
    assert lk["speedup"] == pytest.approx(10 / (40 / 4.0), abs=1e-3)
    assert s["methods"][PLAIN]["tokens_per_s"] == 10.0 and s["methods"][pld]["identical_to_plain"] == 2
    rep = build_report(
        [a, b], 3, {"method": "medusa", "verify_cost": {"1": 0.01, "16": 0.016}, "budget": 15}, headline="medusa", pld=pld
    )
    assert rep["methods"] == [PLAIN, "medusa", pld, "lookup"] and rep["headline"] == "medusa"
    assert set(rep["domains"]) == {"qa", "rag"} and rep["overall"]["n_prompts"] == 2
    md = table(rep)
    assert "| **overall** | medusa | 2 |" in md and "| **overall** | lookup | 1 | 2.00 |" in md
    assert "| qa | lookup | 1 | 2.00 |" in md and "| rag | lookup |" not in md  # rag ran no lookup
    assert "| medusa | 10.0 | 40.0 |" in phase_table(rep)
    untimed = json.loads(json.dumps(rep))  # a llama.cpp report: no engine phases to show
    for m in untimed["overall"]["methods"].values():
        m.pop("ms_per_step", None)
    assert phase_table(untimed) == "" and "Engine time" not in markdown(untimed)
    assert "Engine time per verification step" in markdown(rep)
    out = write_report(rep, tmp_path / "r")
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.png"}


# ---------------------------------------------------------------- building engines from recipes


@pytest.fixture(scope="module")
def tiny_target():
    from tiny_models import tiny_llama

    return tiny_llama(vocab_size=49152, hidden_size=64, num_layers=4, seed=0)


FLAT = {1: 1.0, 8: 1.0, 32: 1.0, 128: 1.0}
STEEP = {1: 1.0, 8: 8.0, 32: 32.0, 128: 128.0}


def test_build_medusa_auto(tiny_target, smol_tok):
    cfg = load_config(ROOT / "configs/smollm2-135m/medusa.yaml", ["inference.max_budget=64"])
    wide = build_engine(cfg, None, tiny_target, smol_tok, curve=FLAT, log=lambda *a: None)
    assert wide.method == "medusa" and wide.engine.spec.kind == "static"
    assert wide.info["budget"] == 64  # free verification: the biggest tree allowed
    narrow = build_engine(cfg, None, tiny_target, smol_tok, curve=STEEP, log=lambda *a: None)
    assert narrow.info["budget"] < 8  # every token costs a forward: a small tree
    assert narrow.engine.spec.tree.max_depth <= 4  # never deeper than the heads
    retune_budget(narrow, STEEP, draft_cost=1000.0, max_budget=64)  # drafting dwarfs verifying
    assert narrow.info["budget"] == 64 and narrow.engine.spec.tree.num_nodes == 64
    assert "a measured draft cost" in narrow.info["budget_source"]
    retune_budget(narrow, STEEP, draft_cost=1000.0, max_budget=64, cost_source="runs/a/report.json")  # --costs-from
    assert "runs/a/report.json's draft cost" in narrow.info["budget_source"] and "measured" not in narrow.info["budget_source"]


def test_build_eagle_dynamic_chain_and_paths(tiny_target, smol_tok, tmp_path):
    cfg = load_config(
        ROOT / "configs/smollm2-135m/eagle3.yaml",
        ["eagle.feature_layers=[1,2,3]", "inference.tree_budget=20"],
    )
    s = build_engine(cfg, None, tiny_target, smol_tok)
    assert s.method == "eagle3" and s.engine.spec.kind == "dynamic" and s.engine.spec.budget == 20
    assert s.engine.spec.depth == cfg.inference.depth
    auto = build_engine(load_config(ROOT / "configs/smollm2-135m/eagle3.yaml", ["eagle.feature_layers=[1,2,3]"]), None, tiny_target, smol_tok, curve=FLAT)
    assert auto.engine.spec.depth == 6  # before the drafter's cost is known: the recipe's depth
    retune_budget(auto, FLAT, draft_cost=6.0, max_budget=64)  # each of its 6 levels costs a verification
    assert auto.engine.spec.depth < 6 and "per tree level: depth" in auto.info["budget_source"]
    retune_budget(auto, FLAT, draft_cost=0.0, max_budget=64)  # free drafting: the deepest, widest tree
    assert auto.engine.spec.depth == 6 and auto.engine.spec.budget == 64
    cfg = load_config(ROOT / "configs/smollm2-135m/eagle.yaml", ["inference.tree=chain", "inference.depth=3"])
    s = build_engine(cfg, None, tiny_target, smol_tok)
    assert s.engine.spec.tree.paths == [(0,), (0, 0), (0, 0, 0)]
    paths = tmp_path / "tree.json"
    paths.write_text(json.dumps([[0], [1], [0, 0]]))
    cfg = load_config(ROOT / "configs/smollm2-135m/medusa.yaml", [f"inference.tree_paths={paths}"])
    s = build_engine(cfg, None, tiny_target, smol_tok)
    assert s.engine.spec.tree.num_nodes == 3 and s.info["budget"] == 3
    out = s.engine.generate([[1, 2, 3]], 5)
    assert len(out.tokens[0]) == 5


def test_build_reads_head_accuracy_from_checkpoint(tiny_target, smol_tok, tmp_path):
    from headway.heads.medusa import MedusaHeads

    ckpt = tmp_path / "medusa"
    MedusaHeads.from_target(tiny_target, 4).save_pretrained(ckpt)
    (ckpt / "head_accuracy.json").write_text(json.dumps({"accuracy": [[0.95, 0.97]] * 4}))
    cfg = load_config(ROOT / "configs/smollm2-135m/medusa.yaml", ["inference.max_budget=4"])
    s = build_engine(cfg, str(ckpt), tiny_target, smol_tok, curve=FLAT)
    assert s.info["accuracies"].endswith("head_accuracy.json")
    assert s.engine.spec.tree.paths == [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]  # confident heads: a chain


def test_build_without_heads_section_errors(tiny_target, smol_tok):
    cfg = load_config(ROOT / "configs/smollm2-135m/data.yaml")
    with pytest.raises(ValueError, match="neither a medusa: nor an eagle: section"):
        build_engine(cfg, None, tiny_target, smol_tok)


# ---------------------------------------------------------------- evaluate.py end to end


def _tiny_medusa_recipe(tiny_target, smol_tok, tmp_path) -> Path:
    """The SmolLM2 Medusa recipe on the tiny target (saved under tmp_path), fp32 on CPU."""
    model_dir = tmp_path / "tiny"
    tiny_target.save_pretrained(model_dir)
    smol_tok.save_pretrained(model_dir)
    recipe = tmp_path / "medusa.yaml"
    recipe.write_text(
        f"base: {ROOT / 'configs/smollm2-135m/medusa.yaml'}\n"
        f"target: {{name: {model_dir}, dtype: float32, device: cpu, hidden_size: 64, num_hidden_layers: 4}}\n"
    )
    return recipe


def test_evaluate_script_end_to_end(tiny_target, smol_tok, tmp_path):
    recipe = _tiny_medusa_recipe(tiny_target, smol_tok, tmp_path)
    from headway.inference import evaluate

    out = tmp_path / "eval"
    rc = evaluate.main(
        [
            "--config",
            str(recipe),
            "--per-domain",
            "1",
            "--max-new-tokens",
            "6",
            "--out",
            str(out),
            "inference.tree_budget=8",
        ]
    )
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["domains"]) == {MULTI_TURN, "translation", "summarization", "qa", "math_reasoning", "rag"}
    for key in (
        "n_prompts",
        "tau",
        "alpha",
        "accept_hist",
        "ar_tokens_per_s",
        "spec_tokens_per_s",
        "speedup",
        "pld_speedup",
        "identical_to_ar",
    ):
        assert key in rep["overall"], key
    assert rep["overall"]["n_prompts"] == 6
    assert rep["overall"]["identical_to_ar"] == 6  # fp32, greedy: every prompt, both turns, token for token
    # every drafting mode and HF prompt lookup in the same run, each on every prompt
    assert rep["methods"] == ["plain", "medusa", "lookup", "medusa+lookup", "hf-prompt-lookup"]
    assert rep["headline"] == "medusa" and set(rep["engines"]) == {"medusa", "lookup", "medusa+lookup"}
    for name in ("medusa", "lookup", "medusa+lookup"):
        m = rep["overall"]["methods"][name]
        assert m["n_prompts"] == 6 and m["identical_to_plain"] == 6 and m["tau"] >= 1 and m["ms_per_step"]["verify"] > 0
    assert rep["overall"]["methods"]["hf-prompt-lookup"]["tau"] >= 1
    assert "medusa+lookup" in (out / "report.md").read_text() and "(draft + accept) / verify" in (out / "report.md").read_text()
    assert rep["dtype"] == "float32" and rep["budget"] == 8 and rep["verify_cost"]
    assert "threads" in rep["hardware"] and rep["hardware"] in (out / "report.md").read_text()  # the machine, named
    assert (out / "report.md").read_text().count("|") > 20 and (out / "report.png").stat().st_size > 1000


def test_costs_from_reads_an_earlier_reports_curve_and_names_what_is_missing(tmp_path):
    from headway.inference.evaluate import read_costs

    rep = tmp_path / "report.json"
    rep.write_text(json.dumps({"verify_cost": {"4": 0.02, "1": 0.01}, "draft_cost_s": 0.003}))
    assert read_costs(str(rep)) == ({1: 0.01, 4: 0.02}, 0.003, None)
    rep.write_text(json.dumps({"verify_cost": {"1": 0.01}, "draft_cost_s": None, "acceptance_scale": 0.9}))
    assert read_costs(str(rep)) == ({1: 0.01}, None, 0.9)
    for body, message in (
        ({"verify_cost": {"1": 0.01}, "acceptance_scale": -1}, "'acceptance_scale' must be a positive number"),
        ({"verify_cost": {"1": 0.01}, "acceptance_scale": True}, "'acceptance_scale' must be a positive number"),
        ({"verify_cost": {"1": 0.01}, "draft_cost_s": "fast"}, "'draft_cost_s' must be a positive number"),
        ({"tau": 2.0}, "no 'verify_cost' curve"),
        ({"verify_cost": {"one": 0.01}}, "must map token counts"),
        ({"verify_cost": {"0": 0.01}}, "token counts >= 1"),
    ):
        rep.write_text(json.dumps(body))
        with pytest.raises(ValueError, match=message):
            read_costs(str(rep))
    with pytest.raises(ValueError, match="nope.json: no such file"):
        read_costs(str(tmp_path / "nope.json"))


def test_evaluate_sizes_trees_from_costs_from_without_measuring(tiny_target, smol_tok, tmp_path, monkeypatch):
    recipe = _tiny_medusa_recipe(tiny_target, smol_tok, tmp_path)
    earlier = tmp_path / "earlier.json"
    curve = {"1": 0.01, "8": 0.011, "32": 0.05, "128": 0.4}
    earlier.write_text(json.dumps({"verify_cost": curve, "draft_cost_s": 0.002}))
    from headway.inference import evaluate

    def must_not_measure(*a, **k):
        raise AssertionError("--costs-from must replace the measured curve")

    monkeypatch.setattr(evaluate, "measure_verify_cost", must_not_measure)
    out = tmp_path / "eval"
    argv = ["--config", str(recipe), "--per-domain", "1", "--max-new-tokens", "3", "--out", str(out)]
    assert evaluate.main([*argv, "--costs-from", str(earlier)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["verify_cost"] == curve and rep["costs_from"] == str(earlier)
    assert rep["draft_cost_s"] == 0.002  # the auto budget was retuned with the earlier run's draft cost
    assert rep["calibration"] is None and rep["acceptance_scale"] is None  # nor fitted there, nor here
    assert rep["overall"]["methods"]["medusa"]["identical_to_plain"] == rep["overall"]["n_prompts"]


def test_evaluate_calibrates_the_auto_budget_and_costs_from_repeats_it(tiny_target, smol_tok, tmp_path):
    recipe = _tiny_medusa_recipe(tiny_target, smol_tok, tmp_path)
    from headway.inference import evaluate

    argv = ["--config", str(recipe), "--per-domain", "1", "--max-new-tokens", "3", "--modes", "drafter"]
    assert evaluate.main([*argv, "--out", str(tmp_path / "a")]) == 0
    first = json.loads((tmp_path / "a/report.json").read_text())
    cal = first["calibration"]  # the tiny model echoes its last token, and so do its untrained heads: all accepted
    assert cal["steps"] > 0 and cal["observed_tau"] > cal["expected_tau"] and cal["prompts"] == 5
    assert first["acceptance_scale"] == pytest.approx(cal["acceptance_scale"], rel=1e-5) and first["acceptance_scale"] > 1
    assert "acceptance scaled by" in first["budget_source"]
    assert evaluate.main([*argv, "--out", str(tmp_path / "b"), "--costs-from", str(tmp_path / "a/report.json")]) == 0
    again = json.loads((tmp_path / "b/report.json").read_text())
    assert again["calibration"] is None and again["acceptance_scale"] == first["acceptance_scale"]
    assert "acceptance scaled by" in again["budget_source"]  # applied, not only copied into the report
    assert (again["budget"], again["tree"]) == (first["budget"], first["tree"])  # the same tree, not re-measured
