"""Faults and bad input, tried as a new user would (issue 15): each case with a small budget on tiny models.

1. resuming with changed settings   2. over-long evaluation prompts   3. damaged checkpoints, kills during a
save, replayed metrics   4. empty / malformed / missing prompt files   5. string overrides that look like
YAML booleans   6. every entry point answering the same way   + peak memory and the cache reader.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from train_helpers import reset_accelerate, synthetic_rows, write_dataset, write_tiny_target

from headway.config import Config, DataConfig, GenerationConfig, SourceConfig, TrainConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_accelerate")


@pytest.fixture
def medusa_recipe(tmp_path, smol_path):
    """A Medusa recipe on a tiny target: 4 steps of 2 rows, a checkpoint every 2."""
    target_dir = write_tiny_target(tmp_path / "target", smol_path)
    data_dir = write_dataset(tmp_path / "data", n_train=12, n_val=2, vocab=400)
    cfg = {
        "target": {"name": str(target_dir), "dtype": "float32", "device": "cpu"},
        "data": {"output_dir": str(data_dir)},
        "medusa": {"num_heads": 2, "num_layers": 1},
        "train": {
            "output_dir": str(tmp_path / "run"), "batch_size": 2, "max_steps": 4, "eval_every": 0,
            "save_every": 2, "max_seq_len": 48, "log_every": 1, "lr": 3e-3, "report_to": "none",
        },
    }
    path = tmp_path / "medusa.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# ---------------------------------------------------------------- 1. resume with changed settings


def test_resume_with_changed_settings_is_refused_naming_the_key(medusa_recipe, tmp_path, capsys):
    from headway.train.medusa import main

    run = tmp_path / "run"
    assert main(["--config", str(medusa_recipe)]) == 0
    weights = load_file(run / "model.safetensors")
    for change, key in (("train.lr=1e-5", "train.lr: was 0.003, now 1e-05"), ("train.batch_size=3", "train.batch_size")):
        reset_accelerate()
        with pytest.raises(RuntimeError, match=key.replace(".", r"\.")):  # ResumeRefused
            main(["--config", str(medusa_recipe), change])
    assert json.loads((run / "run_config.json").read_text())["train"]["lr"] == 3e-3, "run_config.json = what trained"
    assert load_file(run / "model.safetensors").keys() == weights.keys()

    # Cadence and logging change nothing that trains: applied, and said so; run_config.json follows.
    reset_accelerate()
    capsys.readouterr()
    assert main(["--config", str(medusa_recipe), "train.eval_every=1", "eval.per_domain=3"]) == 0
    out = capsys.readouterr().out
    assert "resuming step-0000004 with changed eval.per_domain: was 10, now 3; train.eval_every: was 0, now 1: applied" in out
    saved = json.loads((run / "run_config.json").read_text())
    assert saved["train"]["eval_every"] == 1 and saved["train"]["lr"] == 3e-3


def test_another_train_split_is_refused(tmp_path):
    from headway.train.resume import ResumeRefused, check_settings, run_settings, write_settings

    folder = tmp_path / "step-0000002"
    folder.mkdir()
    write_settings(folder, run_settings({"train": {"lr": 1.0}}, synthetic_rows(6, 64, seed=0)))
    with pytest.raises(ResumeRefused, match="train split: was"):
        check_settings(folder, run_settings({"train": {"lr": 1.0}}, synthetic_rows(6, 64, seed=1)), tmp_path)


# ---------------------------------------------------------------- 3. damaged checkpoints, kills, metrics


def _loop_run(out, target, rows, on_step_end=None, save_state=None, **kw):
    from headway.data.features import OnlineFeatures
    from headway.features import FeatureSpec
    from headway.heads.medusa import MedusaHeads
    from headway.heads.medusa_loss import MedusaObjective
    from headway.train.loop import make_accelerator, train

    reset_accelerate()
    base = dict(output_dir=str(out), batch_size=3, max_steps=6, lr=5e-3, log_every=1, eval_every=0,
                save_every=2, keep_checkpoints=2, max_seq_len=48, seed=3)
    cfg = TrainConfig(**{**base, **kw})
    accelerator = make_accelerator(cfg)
    if save_state is not None:
        accelerator.save_state = save_state.__get__(accelerator)
    objective = MedusaObjective(MedusaHeads.from_target(target, num_heads=2, num_layers=1))
    return train(objective, rows, None, cfg, accelerator, pad_id=2,
                 feature_source=OnlineFeatures(target, FeatureSpec(final_normed=True)), on_step_end=on_step_end)


class _Killed(Exception):
    pass


def _kill_at(step):
    def hook(s):
        if s == step:
            raise _Killed

    return hook


@pytest.fixture(scope="module")
def loop_case():
    from tiny_models import tiny_llama

    return tiny_llama(vocab_size=128, hidden_size=32), synthetic_rows(10, 128)


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_truncated_checkpoint_falls_back_to_the_previous_one(loop_case, tmp_path, capsys):
    target, rows = loop_case
    _loop_run(tmp_path / "straight", target, rows)
    with pytest.raises(_Killed):
        _loop_run(tmp_path / "cut", target, rows, on_step_end=_kill_at(5))
    damaged = tmp_path / "cut" / "checkpoints" / "step-0000004" / "model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])  # cut short, as a full disk or a killed copy leaves it
    capsys.readouterr()
    result = _loop_run(tmp_path / "cut", target, rows)
    out = capsys.readouterr().out
    assert "checkpoint" in out and "step-0000004: model.safetensors is 100 bytes" in out and "falling back to" in out
    assert result.resumed_from.name == "step-0000002"
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)
    # metrics.jsonl: every train step once, in order, though steps 3..5 ran twice
    rows_logged = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_logged if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_no_whole_checkpoint_says_how_to_start_over(loop_case, tmp_path):
    from headway.train.resume import ResumeRefused, damage

    target, rows = loop_case
    with pytest.raises(_Killed):
        _loop_run(tmp_path, target, rows, on_step_end=_kill_at(3))
    folder = tmp_path / "checkpoints" / "step-0000002"
    optimizer = folder / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:-64])
    assert damage(folder).startswith("optimizer.bin is")
    (folder / "COMPLETE").write_text("ok\n")  # a checkpoint from before sizes were recorded: the format check
    assert damage(folder).startswith("optimizer.bin cannot be read (BadZipFile")
    with pytest.raises(ResumeRefused, match=r"step-0000002: optimizer\.bin .*To start over, delete .*train\.resume=never"):
        _loop_run(tmp_path, target, rows)


def test_kill_during_a_save_leaves_no_step_folder_and_no_temporary_file(loop_case, tmp_path):
    from accelerate import Accelerator

    target, rows = loop_case
    real_save = Accelerator.save_state

    def dies_in_second_save(self, output_dir, **kw):
        if "0000004" in str(output_dir):
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            (Path(output_dir) / ".tmpXq1z2a").write_bytes(b"\0" * 1000)  # safetensors' half-written file
            raise _Killed
        return real_save(self, output_dir, **kw)

    with pytest.raises(_Killed):
        _loop_run(tmp_path, target, rows, save_state=dies_in_second_save)
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-0000002"]
    assert not list(ckpts.glob("step-*/.tmp*"))
    result = _loop_run(tmp_path, target, rows)  # resumes at 2, and cleans what the kill left
    assert result.resumed_from.name == "step-0000002"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000004", "step-0000006"]


# ---------------------------------------------------------------- 4. prompt files


def _data_cfg(tmp_path, src: Path) -> Config:
    gen = GenerationConfig(max_new_tokens=4, batch_size=4, shard_size=4, max_prompt_tokens=64)
    return Config(data=DataConfig(output_dir=str(tmp_path / "out"), sources=[SourceConfig(path=str(src), domain="chat")],
                                  generation=gen, val_fraction=0.3))


GOOD = [{"prompt": "Say hi."}, {"prompt": "Name a fruit."}, {"prompt": "Count to three."}]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.jsonl", "\n", r"empty\.jsonl is empty"),
        ("bad.jsonl", '{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c",\n', r"bad\.jsonl, line 3: not valid JSON"),
        ("list.jsonl", '{"prompt": "a"}\n["b"]\n', r"list\.jsonl, line 2: expected a JSON object"),
        ("bad.json", '[{"prompt": "a"},\n {"prompt": "b"]\n', r"bad\.json, line 2 column 16: not valid JSON"),
        ("empty.json", "", r"empty\.json is empty"),
        ("missing.jsonl", None, r"prompt source not found: .*missing\.jsonl"),
    ],
)
def test_bad_prompt_file_is_named_with_its_line_and_writes_nothing(tmp_path, tiny_smol_vocab, smol_tok, name, text, message):
    from headway.data.distill import distill

    src = tmp_path / name
    if text is not None:
        src.write_text(text)
    cfg = _data_cfg(tmp_path, src)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    assert not (tmp_path / "out").exists(), "nothing written: the corrected rerun is not refused"
    if name == "bad.jsonl":
        src.write_text("".join(json.dumps(r) + "\n" for r in GOOD))
        assert distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)["examples"] == 3


# ---------------------------------------------------------------- 5. string overrides


def test_string_keys_take_the_text_as_written(tmp_path):
    recipe = ROOT / "configs/smollm2-135m/medusa.yaml"
    cfg = load_config(recipe, ["train.mixed_precision=no", "train.wandb_project=2024", "medusa.lora=yes", "train.lr=1e-5"])
    assert (cfg.train.mixed_precision, cfg.train.wandb_project, cfg.medusa.lora, cfg.train.lr) == ("no", "2024", True, 1e-5)
    # The same rule in a file: the declared type decides (str keeps "no"; bool still takes yes/no/on/off).
    path = tmp_path / "r.yaml"
    path.write_text(f"base: {recipe}\ntrain: {{mixed_precision: no, log_row_ids: on}}\nmedusa: {{lora: off}}\n")
    cfg = load_config(path)
    assert (cfg.train.mixed_precision, cfg.train.log_row_ids, cfg.medusa.lora) == ("no", True, False)
    from headway.config import ConfigError

    with pytest.raises(ConfigError, match=r"'train.batch_size' expects int, got 'no'"):
        load_config(recipe, ["train.batch_size=no"])


# ---------------------------------------------------------------- 6. entry points


def _entries(tmp_path, recipe) -> dict:
    """entry file -> (arguments that end in an expected error, what the error line names)."""
    no_data = f"data.output_dir={tmp_path / 'nowhere'}"
    eagle_recipe = tmp_path / "eagle.yaml"
    raw = yaml.safe_load(recipe.read_text())
    raw["eagle"] = {"version": 3, "feature_layers": [1, 1, 2]}
    del raw["medusa"]
    eagle_recipe.write_text(yaml.safe_dump(raw))
    (tmp_path / "bare").mkdir()
    return {
        "train/medusa.py": (["--config", str(recipe), no_data], "no self-distilled dataset"),
        "train/eagle.py": ([no_data, "--config", str(eagle_recipe)], "no self-distilled dataset"),
        "scripts/cache_features.py": (["--config", str(recipe), "medusa.feature_cache_dir=c", no_data], "no self-distilled"),
        "scripts/evaluate.py": (["--config", str(recipe), "--questions", "nope.jsonl"], "questions file not found"),
        "scripts/head_accuracy.py": (["--checkpoint", str(tmp_path / "bare")], "run_config.json not found"),
        "scripts/generate_data.py": (["--config", str(recipe), "data.sources=[{path: nope.jsonl, domain: chat}]"], "nope.jsonl"),
        "scripts/export.py": (["--checkpoint", str(tmp_path / "bare"), "--to", "hf", "--out", "x"], "bare"),
        "scripts/prepare_target.py": (["--config", str(tmp_path / "nope.yaml")], "nope.yaml"),
        "scripts/evaluate_llamacpp.py": (["--export", str(tmp_path / "bare")], "headway_llamacpp.json"),
    }


def _run_entry(path: str, argv: list[str], monkeypatch) -> int:
    """The entry file as `python path argv...` runs it (its __main__ block), in this process."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / path), *argv])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / path), run_name="__main__")
    return exit_info.value.code


def test_every_entry_prints_one_error_line_and_a_traceback_only_when_asked(medusa_recipe, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HEADWAY_DEBUG", raising=False)
    entries = _entries(tmp_path, medusa_recipe)
    for path, (argv, message) in entries.items():
        reset_accelerate()
        assert _run_entry(path, argv, monkeypatch) == 1, path
        err = capsys.readouterr().err  # progress bars may come before it
        lines = err.strip().splitlines()
        assert "Traceback" not in err and lines[-1].startswith("error: ") and message in lines[-1], (path, err)
        assert sum(line.startswith("error") for line in lines) == 1, (path, err)
    from headway.cli import run_main
    from headway.inference.evaluate import main as evaluate

    with pytest.raises(FileNotFoundError):  # the debug switch: the traceback, as it was raised
        run_main(evaluate, ["--debug", "--config", str(medusa_recipe), "--questions", "x"])
    monkeypatch.setenv("HEADWAY_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        run_main(evaluate, ["--config", str(medusa_recipe), "--questions", "x"])


def test_ctrl_c_prints_one_line_and_exits_130(monkeypatch, capsys):
    from headway.cli import run_main

    def stopped(argv):
        raise KeyboardInterrupt

    monkeypatch.delenv("HEADWAY_DEBUG", raising=False)
    assert run_main(stopped, []) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().startswith("interrupted") and len(err.strip().splitlines()) == 1
    with pytest.raises(KeyboardInterrupt):
        run_main(stopped, ["--debug"])


def test_arguments_are_checked_before_the_target_loads(monkeypatch, capsys):
    from headway.inference import evaluate

    def must_not_load(*a, **k):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr(evaluate, "load_target", must_not_load)
    recipe = str(ROOT / "configs/smollm2-135m/medusa.yaml")
    with pytest.raises(SystemExit) as exit_info:  # flags and overrides in any order, too
        evaluate.main(["--config", recipe, "eval.per_domain=1", "--max-new-tokens", "0", "inference.tree_budget=8"])
    assert exit_info.value.code == 2 and "--max-new-tokens (eval.max_new_tokens) must be at least 1, got 0" in capsys.readouterr().err


def test_export_prints_a_model_the_engine_can_load(monkeypatch, tmp_path):
    from headway.export.serve import serve_command

    monkeypatch.setenv("HEADWAY_CACHE", str(tmp_path))  # not prepared here: the Hub id
    command = serve_command("medusa", "vllm", "out", "smollm2-135m-instruct", 4)
    assert command.startswith("vllm serve HuggingFaceTB/SmolLM2-135M-Instruct ")
    folder = tmp_path / "targets" / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    (folder / "headway_target.json").write_text("{}")  # prepared: exactly the weights the heads learnt
    assert f"--model-path {folder} " in serve_command("eagle3", "sglang", "out", "smollm2-135m-instruct")
    assert serve_command("eagle3", "vllm", "out", "org/model").startswith("vllm serve org/model ")


# ---------------------------------------------------------------- 2. over-long evaluation prompts


def test_evaluation_skips_and_counts_prompts_beyond_the_context(tmp_path, smol_tok):
    from tiny_models import tiny_llama

    from headway.inference import evaluate

    model_dir = tmp_path / "tiny"
    model = tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2)
    model.config.max_position_embeddings = 160  # a context a long question exceeds
    model.save_pretrained(model_dir)
    smol_tok.save_pretrained(model_dir)
    questions = tmp_path / "q.jsonl"
    rows = [
        {"question_id": 1, "category": "qa", "turns": ["What is rain?"]},
        {"question_id": 2, "category": "qa", "turns": ["word " * 200]},  # beyond 160 positions
        {"question_id": 3, "category": "writing", "turns": ["Say hi.", "again " * 150]},  # its second turn is
    ]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "medusa.yaml"
    recipe.write_text(
        f"base: {ROOT / 'configs/smollm2-135m/medusa.yaml'}\n"
        f"target: {{name: {model_dir}, dtype: float32, device: cpu, hidden_size: 64, num_hidden_layers: 2}}\n"
    )
    out = tmp_path / "eval"
    argv = ["--config", str(recipe), "--questions", str(questions), "--per-domain", "5", "--max-new-tokens", "4",
            "--out", str(out), "inference.tree_budget=4"]
    assert evaluate.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    qa, multi = report["domains"]["qa"], report["domains"]["multi_turn"]
    assert (qa["n_prompts"], qa["skipped_prompts"], multi["dropped_turns"]) == (1, 1, 1)
    assert report["overall"]["skipped_prompts"] == 1
    assert "qa: 1 prompts" in (out / "report.md").read_text() and "multi_turn: 0 prompts, 1 later turns" in (
        out / "report.md"
    ).read_text()


# ---------------------------------------------------------------- memory


def test_training_summary_reports_peak_memory(loop_case, tmp_path):
    target, rows = loop_case
    result = _loop_run(tmp_path, target, rows, max_steps=2)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert result.peak_memory["rss"] > 0.05 and summary["peak_rss_gb"] == result.peak_memory["rss"]


def test_feature_cache_reads_rows_without_mapping_the_shards(tmp_path):
    from tiny_models import tiny_llama

    from headway.data.feature_cache import FeatureCache, write_cache
    from headway.features import FeatureSpec, feature_key

    target = tiny_llama(vocab_size=128, hidden_size=32)
    ds = {"train": synthetic_rows(9, 128)}
    spec = FeatureSpec(final_normed=True)
    write_cache(target, ds, spec, tmp_path, max_len=48, target_fingerprint={}, pad_id=2, shard_rows=4, progress=False)
    cache = FeatureCache(tmp_path)
    row = cache.row("train", 5)[feature_key("final_normed")]
    with torch.no_grad():
        ids = torch.tensor([ds["train"][5]["input_ids"][:48]])
        want = target(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(row, want, rtol=1e-5, atol=1e-5)
    maps = Path("/proc/self/maps")
    if maps.is_file():  # a mapped shard would count as resident memory, growing with the dataset
        assert str(tmp_path / "train") not in maps.read_text()


@pytest.mark.parametrize("autocast", [False, True])
def test_projected_soft_ce_matches_autograd_without_keeping_logits(autocast):
    from headway.heads.soft_ce import projected_soft_ce

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    probs = torch.softmax(torch.randn(20, 50, generator=g), -1)
    rows = torch.randint(0, 20, (37,), generator=g).masked_fill(torch.arange(37) % 5 == 0, -1)  # -1: no loss
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        z = hidden @ weight.T if not autocast else torch.nn.functional.linear(hidden, weight)
        keep = rows >= 0
        want = torch.nn.functional.cross_entropy(z[keep].float(), probs[rows[keep]], reduction="sum")
        got, pred = projected_soft_ce(hidden, weight, probs, rows, chunk=8)
    want_grads = torch.autograd.grad(want, (hidden, weight))
    got_grads = torch.autograd.grad(3.0 * got, (hidden, weight))  # the upstream gradient is applied
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    assert torch.equal(pred, z.argmax(-1))
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, 3.0 * b, **tol)


def test_ttt_softmax_keeps_one_copy_and_has_softmax_gradients():
    from headway.heads.eagle_attention import _SoftmaxTo

    x = torch.randn(2, 3, 5, 7, requires_grad=True)
    upstream = torch.randn(2, 3, 5, 7)
    got = torch.autograd.grad((_SoftmaxTo.apply(x, torch.float32) * upstream).sum(), x)[0]
    want = torch.autograd.grad((torch.softmax(x, -1) * upstream).sum(), x)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
