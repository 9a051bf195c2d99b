"""The built wheel installs only `headway.*` names, and a recipe runs from another directory with it.

The wheel goes into a fresh venv that borrows the test venv's third-party packages through a `.pth`
line (so nothing is downloaded). Directories listed in a `.pth` file have their own `.pth` files
ignored, so the checkout's editable install stays invisible there: what runs is the wheel.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from train_helpers import write_tiny_target

ROOT = Path(__file__).resolve().parents[1]
COLLIDING = ("data", "train", "heads", "inference", "export")  # the folders installed as headway.*


def _completed(cmd, cwd, timeout=600) -> subprocess.CompletedProcess:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{cmd}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def _run(cmd, cwd, timeout=600) -> str:
    return _completed(cmd, cwd, timeout).stdout


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory):
    """The built wheel and what the build printed."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__"))
    res = _completed([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src], tmp)
    (wheel,) = (tmp / "dist").glob("headway-*.whl")
    return wheel, res.stdout + res.stderr


@pytest.mark.slow
def test_wheel_ships_every_prompt_file_without_setuptools_warnings(wheel_build):
    """Each folder of data/prompts is listed in pyproject.toml as a package with its files as package data:
    an unlisted folder would be missing from the wheel (or, shipped by a glob, warned about by setuptools
    once per folder at every install)."""
    import zipfile

    wheel, log = wheel_build
    shipped = {n.removeprefix("headway/") for n in zipfile.ZipFile(wheel).namelist() if n.startswith("headway/data/prompts/")}
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "data" / "prompts").rglob("*") if p.is_file()}
    assert shipped == on_disk, f"missing from the wheel: {sorted(on_disk - shipped)}; extra: {sorted(shipped - on_disk)}"
    assert "Package would be ignored" not in log, "a data/prompts folder is missing from pyproject's packages"


@pytest.fixture(scope="module")
def wheel_venv(wheel_build, tmp_path_factory):
    wheel, _ = wheel_build
    tmp = tmp_path_factory.mktemp("venv")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel], tmp)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).strip())
    (site / "_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python, site


@pytest.mark.slow
def test_wheel_installs_only_headway_names(wheel_venv, tmp_path):
    python, site = wheel_venv
    top_level = sorted(p.name for p in site.iterdir() if p.suffix != ".pth" and not p.name.endswith(".dist-info"))
    assert top_level == ["headway"], top_level
    probe = (
        "import importlib.util, json, headway.data, headway.train.medusa, headway.inference.engine\n"
        "from importlib.resources import files\n"
        f"print(json.dumps({{'colliding': [n for n in {COLLIDING!r} if importlib.util.find_spec(n)],"
        " 'headway_data': headway.data.__file__,"
        " 'prompts': files('headway.data').joinpath('prompts/gsm8k/train.jsonl').is_file()}))"
    )
    out = json.loads(_run([python, "-c", probe], tmp_path))
    assert out["colliding"] == []
    assert Path(out["headway_data"]).is_relative_to(site)  # the wheel's copy, not the checkout
    assert out["prompts"]


@pytest.mark.slow
def test_recipe_runs_from_another_directory(wheel_venv, tmp_path, smol_path):
    """Self-distil shipped prompts (a relative `data/prompts/...` path read from the wheel), then train Medusa."""
    python, _ = wheel_venv
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = write_tiny_target(tmp_path / "tiny", smol_path)
    data_cfg = tmp_path / "data.yaml"
    data_cfg.write_text(
        f"base: {ROOT / 'configs/smollm2-135m/data.yaml'}\n"
        f"target: {{name: {target}, dtype: float32, device: cpu, hidden_size: 64, num_hidden_layers: 2}}\n"
        "data:\n"
        f"  output_dir: {tmp_path / 'run/data'}\n"
        "  sources: [{path: data/prompts/gsm8k/train.jsonl, domain: math, num_prompts: 6}]\n"
        "  generation: {max_new_tokens: 8, batch_size: 3, shard_size: 3}\n"
        "  features: [medusa]\n"  # kept while generating: the recipe extracts nothing
        "  val_fraction: 0.34\n"
    )
    _run([python, ROOT / "scripts/generate_data.py", "--config", data_cfg], elsewhere)
    medusa_cfg = tmp_path / "medusa.yaml"
    medusa_cfg.write_text(
        f"base: {ROOT / 'configs/smollm2-135m/medusa.yaml'}\n"
        f"target: {{name: {target}, dtype: float32, device: cpu, hidden_size: 64, num_hidden_layers: 2}}\n"
        f"data: {{output_dir: {tmp_path / 'run/data'}}}\n"
        "medusa: {num_heads: 2, draft_vocab_size: 64}\n"
        f"train: {{output_dir: {tmp_path / 'run/medusa'}, max_steps: 2, batch_size: 2, mixed_precision: 'no'}}\n"
    )
    _run([python, "-m", "headway.train.medusa", "--config", medusa_cfg], elsewhere)
    assert (tmp_path / "run/medusa/model.safetensors").is_file()
    assert (tmp_path / "run/data/features/manifest.json").is_file()
    assert not (elsewhere / "runs").exists()  # every output went where the recipe said
