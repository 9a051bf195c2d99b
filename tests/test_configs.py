"""Every YAML under configs/ loads and validates; config errors name the key and the file."""

from pathlib import Path

import pytest

from headway.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "configs").glob("*/*.yaml") if p.parent.name != "accelerate")
ACCELERATE = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))


def test_configs_exist():
    names = {f"{p.parent.name}/{p.name}" for p in RECIPES}
    for model in ("smollm2-135m", "llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "vicuna-7b-v1.3"):
        for method in ("data", "medusa", "eagle", "eagle3"):
            assert f"{model}/{method}.yaml" in names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_config_validates(path):
    cfg = load_config(path)
    assert cfg.source_file == str(path)
    method = "medusa" if path.stem == "medusa2" else path.stem  # Medusa-2 is the medusa method with LoRA
    assert cfg.method == method, f"{path}: a {cfg.method} recipe"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and path.relative_to(ROOT).as_posix() in first, "first line must be the command"
    assert cfg.data.sources, "every recipe names its prompt sources"
    for src in cfg.data.sources:
        if src.path and "/" in src.path and src.path.startswith("data/"):
            assert (ROOT / src.path).is_file(), f"{path}: source {src.path} is missing"
    if path.stem.startswith("eagle3"):
        assert cfg.eagle is not None and cfg.eagle.version == 3
        L = cfg.target.num_hidden_layers
        assert cfg.eagle.feature_layers == [2, L // 2, L - 3]
    if cfg.target.chat_template:
        assert (ROOT / cfg.target.chat_template).is_file()


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_config_validates(path):
    from accelerate.commands.config.config_args import load_config_from_file

    assert path.read_text().startswith("# When"), "header comment says when to use it"
    cfg = load_config_from_file(str(path))
    assert cfg.num_processes >= 1


def _write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_unknown_key_names_key_and_file(tmp_path):
    p = _write(tmp_path, "train:\n  lr: 1.0e-3\n  learning_rate: 2\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*unknown key 'train\.learning_rate'"):
        load_config(p)


def test_unknown_section(tmp_path):
    p = _write(tmp_path, "trian:\n  lr: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'trian'"):
        load_config(p)


def test_wrong_type_names_expected_type(tmp_path):
    p = _write(tmp_path, "train:\n  batch_size: eight\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: key 'train\.batch_size' expects int, got 'eight'"):
        load_config(p)


def test_missing_required_key(tmp_path):
    p = _write(tmp_path, "data:\n  sources:\n    - {path: x.jsonl}\n")
    with pytest.raises(ConfigError, match=r"missing required key 'data\.sources\[0\]\.domain'"):
        load_config(p)


def test_literal_choices(tmp_path):
    p = _write(tmp_path, "target:\n  dtype: float64\n")
    with pytest.raises(ConfigError, match="'bfloat16'"):
        load_config(p)


def test_inference_tree_choices_checked_at_load(tmp_path):
    p = _write(tmp_path, "inference:\n  tree: dynamc\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: key 'inference\.tree' expects 'auto' \| 'chain' \| 'static' \| 'dynamic', got 'dynamc'"):
        load_config(p)
    assert load_config(p, ["inference.tree=chain"]).inference.tree == "chain"


def test_overrides_and_base(tmp_path):
    _write(tmp_path, "data:\n  output_dir: a\n  generation:\n    batch_size: 4\n", "base.yaml")
    p = _write(tmp_path, "base: base.yaml\ntrain:\n  lr: 1.0e-3\n")
    cfg = load_config(p, ["train.lr=5e-4", "data.generation.max_new_tokens=64", "train.max_steps=null"])
    assert cfg.train.lr == 5e-4
    assert cfg.data.output_dir == "a" and cfg.data.generation.batch_size == 4
    assert cfg.data.generation.max_new_tokens == 64
    assert cfg.train.max_steps is None
    with pytest.raises(ConfigError, match="train.nope"):
        load_config(p, ["train.nope=1"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(p, ["train.lr"])


def test_missing_file_named(tmp_path):
    with pytest.raises(ConfigError, match="nothere.yaml"):
        load_config(tmp_path / "nothere.yaml")


@pytest.mark.parametrize("model", ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "vicuna-7b-v1.3"])
def test_gpu_eagle1_recipes_train_what_engines_serve(model):
    """vLLM/SGLang feed EAGLE-1 the normed last hidden state, unscaled: export refuses anything else."""
    cfg = load_config(ROOT / "configs" / model / "eagle.yaml")
    assert cfg.eagle.feature_source == "post_norm" and cfg.eagle.feature_norm == "none"
