"""scripts/gpu_check.sh in its CPU mode (tiny models), on an interpreter that lacks the optional packages
(datasets, gguf, deepspeed, wandb: absent as on a bare GPU machine) and without headway installed, so
the script cannot rot and the GPU path imports nothing it may not find there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MISSING = ("datasets", "gguf", "deepspeed", "wandb")


def bare_site(folder: Path) -> Path:
    """This environment's site-packages without the optional packages, headway or any .pth hook."""
    folder.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower().replace("-", "_")
        if entry.suffix == ".pth" or name.startswith(("headway", "__editable__")):
            continue
        if any(name == m or name.startswith((f"{m}.", f"{m}_")) for m in MISSING):
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def test_gpu_check_tiny_cpu_run_passes_without_optional_packages(tmp_path):
    site = bare_site(tmp_path / "site")
    env = {
        **os.environ,
        "PYTHON": f"{sys.executable} -S",  # no site-packages but the bare copy on PYTHONPATH
        "PYTHONPATH": str(site),
        "OMP_NUM_THREADS": "1",
        "GPU_CHECK_TIMEOUT": "300",
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_check.sh"), "--tiny", "--device", "cpu", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "headway from this checkout" in proc.stdout and "PASSED" in proc.stdout
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["passed"] and not report["errors"] and report["info"]["optional_packages"] == dict.fromkeys(MISSING, False)
    assert all(v["identical"] == v["prompts"] for v in report["greedy_fp32"].values())
    assert sum(v["accepted"] for v in report["greedy_fp32"].values()) > 100  # drafts were accepted: not vacuous
    assert report["sampling"]["negative control: residual from p"]["p"] < 0.01
    assert set(report["training"]) == {"medusa", "eagle1", "eagle3"} and report["verify_cost_s"]
    assert {k.split(" batch")[0] for k in report["engine"]} == {"medusa", "eagle1", "eagle3", "lookup", "eagle3+lookup"}


def test_gpu_pipeline_runs_every_stage_on_cpu(tmp_path, smol_path):
    """scripts/gpu_pipeline.sh (the quickstart's stages on a random target, run on GPU machines) on CPU:
    every stage finishes, the Medusa run resumes from its step-2 checkpoint, the report covers every method.
    (Identical outputs are not asserted: the pipeline runs in bf16; the fp32 lossless tests cover them.)"""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_pipeline.sh"), str(smol_path), str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert f"resumed from {out}/medusa/checkpoints/step-0000002 at step 2" in log
    assert (out / "medusa" / "head_accuracy.json").is_file() and (out / "eagle3" / "head_accuracy.json").is_file()
    report = json.loads((out / "eval" / "report.json").read_text())
    assert {"plain", "eagle3", "lookup", "eagle3+lookup", "hf-prompt-lookup"} <= set(report["methods"])
    assert report["per_domain"] == 1 and len(report["domains"]) == 6  # one question in each Spec-Bench domain
