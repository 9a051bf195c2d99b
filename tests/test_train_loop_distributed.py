"""train/medusa.py end to end: one process in-process, and 2 CPU processes (gloo) that really split the data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from train_helpers import reset_accelerate, write_dataset, write_tiny_target

from headway.heads.medusa import MedusaHeads

ROOT = Path(__file__).resolve().parents[1]
N_TRAIN = 16


pytestmark = pytest.mark.usefixtures("fresh_accelerate")


@pytest.fixture
def recipe(tmp_path, smol_path):
    target_dir = write_tiny_target(tmp_path / "target", smol_path)
    data_dir = write_dataset(tmp_path / "data", n_train=N_TRAIN, n_val=4, vocab=400)

    def make(out: str, **train) -> Path:
        cfg = {
            "target": {"name": str(target_dir), "dtype": "float32", "device": "cpu"},
            "data": {"output_dir": str(data_dir)},
            "medusa": {"num_heads": 2, "num_layers": 1, "draft_vocab_size": 300},
            "train": {
                "output_dir": str(tmp_path / out), "batch_size": 2, "max_steps": 4, "eval_every": 0,
                "save_every": 2, "max_seq_len": 64, "log_every": 1, "log_row_ids": True, "report_to": "none",
                **train,
            },
        }
        path = tmp_path / f"{out}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    return make


def _rows_seen(out: Path, rank: int) -> list[list[int]]:
    return [json.loads(line)["rows"] for line in (out / f"rows_rank{rank}.jsonl").read_text().splitlines()]


def test_single_process_entry_script_trains_and_saves(recipe, tmp_path):
    from headway.train.medusa import main

    assert main(["--config", str(recipe("single")), "train.lr=2e-3"]) == 0
    out = tmp_path / "single"
    heads = MedusaHeads.from_pretrained(out)
    assert heads.config.draft_vocab_size == 300 and heads.token_map.shape == (300,)
    assert 2 in heads.token_map.tolist()  # EOS is always proposable
    seen = _rows_seen(out, 0)
    assert len(seen) == 4 and all(len(b) == 2 for b in seen)
    assert json.loads((out / "run_config.json").read_text())["train"]["lr"] == 2e-3

    # scripts/head_accuracy.py reads the run's own config, scores the validation split, writes JSON
    from headway.inference import head_accuracy

    assert head_accuracy.main(["--checkpoint", str(out), "--topk", "5"]) == 0
    report = json.loads((out / "head_accuracy.json").read_text())
    assert report["rows"] == 4 and report["num_heads"] == 2 and len(report["accuracy"]) == 2
    for accs, n in zip(report["accuracy"], report["positions"], strict=True):
        assert len(accs) == 5 and n > 0 and all(0 <= a <= 1 for a in accs)
        assert accs == sorted(accs)  # top-j accuracy never falls as j grows
    assert set(report["per_domain"]) == {"chat"} and report["per_domain"]["chat"]["accuracy"] == report["accuracy"]


def test_medusa2_entry_saves_heads_and_adapter(recipe, tmp_path):
    from headway.train.medusa import main

    cfg = recipe("m2", max_steps=3)
    assert main(["--config", str(cfg), "medusa.lora=true", "medusa.lora_r=4", "medusa.heads_only_steps=1"]) == 0
    out = tmp_path / "m2"
    assert (out / "model.safetensors").is_file() and (out / "lora" / "adapter_model.safetensors").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert [r["train/lr_group1"] == 0 for r in rows] == [True, False, False]  # adapters join after stage 1
    from headway.inference import head_accuracy  # reads the heads through the adapted target

    assert head_accuracy.main(["--checkpoint", str(out), "--topk", "3"]) == 0
    assert len(json.loads((out / "head_accuracy.json").read_text())["accuracy"]) == 2


@pytest.mark.slow
def test_two_cpu_processes_split_the_data(recipe, tmp_path):
    # 16 rows, 2 per rank per step, 2 ranks: 4 steps are exactly one epoch.
    cfg = recipe("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/cpu.yaml"),
        "--num_processes", "2", str(ROOT / "train/medusa.py"), "--config", str(cfg),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "ddp"
    r0, r1 = _rows_seen(out, 0), _rows_seen(out, 1)
    assert len(r0) == len(r1) == 4
    seen0, seen1 = {i for b in r0 for i in b}, {i for b in r1 for i in b}
    assert not seen0 & seen1, "both ranks trained on the same rows"
    assert seen0 | seen1 == set(range(N_TRAIN))
    assert (out / "model.safetensors").is_file() and not (out / "rows_rank2.jsonl").exists()
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["step"] == 4
    # The checkpoints hold the trained weights (DDP's "module." names once left them empty), so resume works.
    from safetensors.torch import load_file

    final, ckpt = load_file(out / "model.safetensors"), load_file(out / "checkpoints" / "step-0000004" / "model.safetensors")
    del final["token_map"]  # a buffer, not trained: checkpoints keep trained weights only
    assert ckpt.keys() == {f"objective.heads.{k}" for k in final}, (ckpt.keys(), final.keys())
    for name, value in final.items():
        torch.testing.assert_close(ckpt[f"objective.heads.{name}"], value, rtol=0, atol=0, msg=name)


def test_offline_feature_cache_trains_like_online(recipe, tmp_path):
    from safetensors.torch import load_file

    from headway.train import cache_features
    from headway.train.medusa import main

    assert main(["--config", str(recipe("online"))]) == 0
    reset_accelerate()
    cache = tmp_path / "cache"
    offline = ["--config", str(recipe("offline")), "medusa.hidden_states=offline", f"medusa.feature_cache_dir={cache}"]
    assert cache_features.main(offline) == 0  # the one cache command serves Medusa recipes too
    assert (cache / "manifest.json").is_file() and not (tmp_path / "offline" / "model.safetensors").exists()
    reset_accelerate()
    assert main(offline) == 0
    a, b = load_file(tmp_path / "online" / "model.safetensors"), load_file(tmp_path / "offline" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    with pytest.raises(SystemExit):  # Medusa-2 trains the target: cached states would be stale
        main([*offline, "medusa.lora=true"])
