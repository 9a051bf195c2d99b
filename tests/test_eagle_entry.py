"""train/eagle.py and scripts/cache_features.py end to end on a tiny target: offline equals online, loadable output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from train_helpers import reset_accelerate, write_dataset, write_tiny_target

from headway.config import TargetConfig
from headway.heads.eagle import Eagle3Drafter, load_drafter
from headway.target import load_target

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_accelerate")


@pytest.fixture
def recipe(tmp_path, smol_path):
    target_dir = write_tiny_target(tmp_path / "target", smol_path, num_layers=4)
    data_dir = write_dataset(tmp_path / "data", n_train=12, n_val=4, vocab=400)

    def make(out: str, **eagle) -> Path:
        cfg = {
            "target": {"name": str(target_dir), "dtype": "float32", "device": "cpu"},
            "data": {"output_dir": str(data_dir)},
            "eagle": {
                "version": 3,
                "feature_layers": [1, 2, 3],
                "draft_vocab_size": 300,
                "unroll_steps": 3,
                "feature_norm": "per_dim",
                "norm_stats_rows": 100,
                "feature_cache_dir": str(tmp_path / "features"),
                **eagle,
            },
            "train": {
                "output_dir": str(tmp_path / out),
                "batch_size": 3,
                "max_steps": 3,
                "eval_every": 0,
                "save_every": 0,
                "max_seq_len": 64,
                "log_every": 1,
                "report_to": "none",
                "lr": 2e-3,
                "seed": 1,
            },
        }
        path = tmp_path / f"{out}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    return make


def test_offline_training_equals_online_and_loads(recipe, tmp_path):
    from headway.train import cache_features
    from headway.train.eagle import main

    assert main(["--config", str(recipe("online"))]) == 0
    reset_accelerate()
    assert cache_features.main(["--config", str(recipe("x")), "--batch-size", "5", "--shard-rows", "8"]) == 0
    manifest = json.loads((tmp_path / "features" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["spec"] == {"layers": [0, 1, 2], "final_normed": True}
    assert main(["--config", str(recipe("offline", hidden_states="offline"))]) == 0

    a = load_file(tmp_path / "online" / "model.safetensors")
    b = load_file(tmp_path / "offline" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:  # same batches; only summation order differs between the two extractions
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    assert (tmp_path / "online" / "feature_stats.safetensors").is_file()

    target, _ = load_target(TargetConfig(name=str(tmp_path / "target"), dtype="float32", device="cpu"))
    drafter = load_drafter(tmp_path / "offline", target)
    assert isinstance(drafter, Eagle3Drafter) and drafter.lm_head.out_features == 300
    assert 2 in drafter.token_map.tolist()  # EOS is always proposable
    assert not torch.equal(drafter.feature_scale, torch.ones_like(drafter.feature_scale))
    metrics = [json.loads(x) for x in (tmp_path / "offline" / "metrics.jsonl").read_text().splitlines()]
    val = [m for m in metrics if m["kind"] == "validation"][-1]
    assert {f"val/acc_step{i}" for i in (1, 2, 3)} <= set(val)
    assert all(m["train/tokens_per_s"] > 0 for m in metrics if m["kind"] == "train")

    # The run saved its measured accuracy profile, and tree_budget: auto builds from it.
    profile = json.loads((tmp_path / "offline" / "head_accuracy.json").read_text())
    assert profile["depths"] >= 3 and profile["rows"] == 4 and len(profile["accuracy"]) == profile["depths"]
    assert all(0 <= a <= 1 for accs in profile["accuracy"] for a in accs)
    assert all(accs == sorted(accs) for accs in profile["accuracy"])  # top-j never falls as j grows
    # scored online (head_accuracy) where training scored from the cache: the same pairs, top-1 within a flip or two
    assert profile["accuracy"][0][0] == pytest.approx(val["val/acc_step1"], abs=0.02)


def test_offline_refuses_a_cache_for_other_layers(recipe, tmp_path):
    from headway.train import cache_features
    from headway.train.eagle import main

    assert cache_features.main(["--config", str(recipe("first", hidden_states="offline"))]) == 0
    reset_accelerate()
    from headway.data.feature_cache import StaleCacheError

    with pytest.raises(StaleCacheError, match=r"holds layers \[0, 1, 2\].*needs layers \[0, 1, 3\]"):
        main(["--config", str(recipe("second", hidden_states="offline", feature_layers=[1, 2, 4]))])
