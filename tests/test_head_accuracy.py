"""scripts/head_accuracy.py on an EAGLE-3 drafter (tiny target, synthetic rows): the unrolled per-depth
profile agrees with the training objective's own per-step accuracy, and tree_budget: auto reads it."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from lossless_common import one_thread  # noqa: F401 (fixture: one thread)
from train_helpers import write_dataset, write_tiny_target

from headway.config import TargetConfig, load_config
from headway.data.dataset import default_collate, load_distilled, select_rows
from headway.data.features import OnlineFeatures
from headway.heads.eagle import Eagle3Drafter
from headway.heads.eagle_objective import Eagle3Objective, EagleLossConfig
from headway.heads.vocab import DraftVocab
from headway.inference import head_accuracy
from headway.inference.build import build_engine
from headway.target import load_target

STEPS = 30


@pytest.fixture
def eagle_run(tmp_path, smol_path):
    target_dir = write_tiny_target(tmp_path / "target", smol_path)
    data_dir = write_dataset(tmp_path / "data", n_train=4, n_val=6, vocab=400)
    cfg = {
        "target": {"name": str(target_dir), "dtype": "float32", "device": "cpu"},
        "data": {"output_dir": str(data_dir)},
        "eagle": {"version": 3, "feature_layers": [1, 1, 2], "draft_vocab_size": 300, "unroll_steps": 3},
        "train": {"max_seq_len": 64},
        "inference": {"depth": 3, "tree_budget": "auto", "max_budget": 16},
    }
    recipe = tmp_path / "eagle3.yaml"
    recipe.write_text(yaml.safe_dump(cfg))
    target, _ = load_target(TargetConfig(name=str(target_dir), dtype="float32", device="cpu"))
    torch.manual_seed(0)
    drafter = Eagle3Drafter.from_target(target, [1, 1, 2], vocab=DraftVocab(torch.arange(300), 49152))
    # a few steps on the rows it is scored on: an accurate drafter, so the comparison below is not 0 == 0
    objective = Eagle3Objective(drafter, EagleLossConfig(unroll_steps=3))
    batch = default_collate(2, 64)(select_rows(load_distilled(data_dir)["validation"], list(range(6))))
    with torch.no_grad():
        feats = OnlineFeatures(target, objective.feature_spec())(batch)
    opt = torch.optim.Adam(drafter.parameters(), lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad()
        objective.training_loss(batch, feats).loss.backward()
        opt.step()
    ckpt = drafter.eval().save_pretrained(tmp_path / "eagle3")
    return recipe, ckpt, target, drafter, data_dir


def test_eagle_profile_matches_the_objectives_step_accuracy(eagle_run):
    recipe, ckpt, target, drafter, data_dir = eagle_run
    assert head_accuracy.main(["--checkpoint", str(ckpt), "--config", str(recipe), "--topk", "4", "--batch-size", "8"]) == 0
    report = json.loads((ckpt / "head_accuracy.json").read_text())
    assert report["head"] == "eagle3" and report["depths"] == 3 and report["rows"] == 6
    assert len(report["accuracy"]) == 3 and all(len(a) == 4 and a == sorted(a) for a in report["accuracy"])
    assert report["positions"][0] > report["positions"][1] > report["positions"][2] > 0

    # the same rows through the training objective (eval mode: no noise): same pairs, same top-1
    rows = load_distilled(data_dir)["validation"]
    batch = default_collate(2, 64)(select_rows(rows, list(range(len(rows)))))
    objective = Eagle3Objective(drafter, EagleLossConfig(unroll_steps=3)).eval()
    with torch.no_grad():
        feats = OnlineFeatures(target, objective.feature_spec())(batch)
        metrics = objective.training_loss(batch, feats).metrics
    for i in range(3):
        assert report["positions"][i] == int(metrics[f"pairs_step{i + 1}"])
        assert report["accuracy"][i][0] == pytest.approx(float(metrics[f"acc_step{i + 1}"]), abs=1e-4)

    cfg = load_config(recipe)
    setup = build_engine(cfg, str(ckpt), target, _tok(target), curve={1: 1.0, 128: 1.5})
    assert setup.info["accuracies"] == str(ckpt / "head_accuracy.json")
    assert "head_accuracy.json" in setup.info["budget_source"]


def _tok(target):
    from headway.target import load_tokenizer

    return load_tokenizer(TargetConfig(name=target.config._name_or_path))
