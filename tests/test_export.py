"""Export to vLLM / SGLang / hf: every key-table entry written with the issue's shapes, broken folders
refused naming the key, identical draft logits after a round trip, refusals, --out safety, model card."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import tiny_llama

from headway.data.features import OnlineFeatures
from headway.export.check import check_folder, weight_header
from headway.export.checkpoint import read_checkpoint
from headway.export.engine_keys import TABLES, ExportError
from headway.export.folders import export, load_exported
from headway.export.rules import engine_weights, to_headway
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter, load_drafter
from headway.heads.medusa import MedusaHeads
from headway.heads.vocab import DraftVocab

V, H, L = 512, 64, 4
HEADS, KV, HEAD_DIM, INTER = 4, 2, 16, 128  # tiny_llama's attention and MLP sizes
K, LAYERS = 3, 2  # Medusa heads and residual layers per head
VOCAB = DraftVocab(torch.tensor(sorted(set(range(0, V, 3)) | {2}), dtype=torch.int64), V)
VP = VOCAB.size
PAIRS = [
    ("vllm", "medusa"),
    ("vllm", "eagle1"),
    ("sglang", "eagle1"),
    ("vllm", "eagle3"),
    ("sglang", "eagle3"),
]
# A reduced-vocabulary Medusa (VOCAB) loads only in vLLM <= 0.11 (test_export_releases.py has the rest).
VERSION = {"medusa": "<=0.11"}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=L, seed=0)


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Non-trivial weights (Medusa blocks start at zero), so equal logits mean equal weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0))


def _heads(target, method: str, scaled: bool = True, layers=(1, 2, 3), **kw):
    torch.manual_seed(1)
    if method == "medusa":
        h = MedusaHeads.from_target(target, K, LAYERS, vocab=VOCAB, target_name="tiny", **kw)
    elif method == "eagle1":
        h = Eagle1Drafter.from_target(target, feature_source="post_norm", target_name="tiny", **kw)
    else:
        norm = "per_dim" if scaled else "none"
        h = Eagle3Drafter.from_target(
            target, feature_layers=None if layers is None else list(layers), vocab=VOCAB, feature_norm=norm, target_name="tiny", **kw
        )
        if scaled:
            with torch.no_grad():  # a non-trivial scale, so the fold into fc is exercised
                h.feature_scale.uniform_(0.5, 2.0)
    _randomize(h, seed=7)
    return h.eval()


def _saved(tmp_path, target, method, name="ckpt", **kw) -> Path:
    folder = tmp_path / name
    _heads(target, method, **kw).save_pretrained(folder)
    return folder


def _ids(seed=0, n=10):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, V, (2, n), generator=g)


def _logits(obj, target, ids) -> list[torch.Tensor]:
    """Draft logits: Medusa on the target's final normed states; EAGLE over a 3-step unroll (fed-back features)."""
    attn = torch.ones_like(ids)
    with torch.no_grad():
        if isinstance(obj, MedusaHeads):
            hidden = target(ids, output_hidden_states=True).hidden_states[-1]
            return [obj(hidden)]
        feats = OnlineFeatures(target, obj.feature_spec())({"input_ids": ids, "attention_mask": attn})
        z = obj.features_from_target(feats)
        return [obj.logits(u.hidden) for u in obj.unroll(ids, z, attn, 3, pad_id=2)]


# The issue's shapes, written out here (not taken from the tables): h=64, heads 4 x 16, kv 2 x 16, I=128.
def _llama_layer(prefix: str, wide: int, input_norm: bool, hidden_norm: bool) -> dict:
    out = {
        f"{prefix}.self_attn.q_proj.weight": (HEADS * HEAD_DIM, wide),
        f"{prefix}.self_attn.k_proj.weight": (KV * HEAD_DIM, wide),
        f"{prefix}.self_attn.v_proj.weight": (KV * HEAD_DIM, wide),
        f"{prefix}.self_attn.o_proj.weight": (H, HEADS * HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": (INTER, H),
        f"{prefix}.mlp.up_proj.weight": (INTER, H),
        f"{prefix}.mlp.down_proj.weight": (H, INTER),
        f"{prefix}.post_attention_layernorm.weight": (H,),
    }
    if input_norm:
        out[f"{prefix}.input_layernorm.weight"] = (H,)
    if hidden_norm:
        out[f"{prefix}.hidden_norm.weight"] = (H,)
    return out


def _issue_shapes(engine: str, method: str) -> dict:
    if method == "medusa":
        out = {f"blocks.{i}.layers.{j}.weight": (H, H) for i in range(K) for j in range(LAYERS)}
        out |= {f"blocks.{i}.layers.{j}.bias": (H,) for i in range(K) for j in range(LAYERS)}
        return out | {f"lm_heads.{i}.weight": (VP, H) for i in range(K)} | {"token_map": (VP,)}
    if method == "eagle1":
        out = {"fc.weight": (H, 2 * H)} | _llama_layer("layers.0", H, input_norm=False, hidden_norm=False)
        return out | ({"fc.bias": (H,)} if engine == "sglang" else {})
    out = {"fc.weight": (H, 3 * H), "norm.weight": (H,), "lm_head.weight": (VP, H), "d2t": (VP,), "t2d": (V,)}
    return out | _llama_layer("midlayer", 2 * H, input_norm=True, hidden_norm=True)


@pytest.mark.parametrize("engine,method", PAIRS)
def test_every_table_entry_written_with_the_issues_shapes(tmp_path, target, engine, method):
    out = tmp_path / "out"
    export(_saved(tmp_path, target, method), engine, out, engine_version=VERSION.get(method))
    have = weight_header(out / "model.safetensors")
    want = _issue_shapes(engine, method)
    assert {k: v[0] for k, v in have.items()} == want
    table = TABLES[(engine, method)]
    dims = check_folder(out, engine, method)
    assert set(table.expected(dims)) == set(want)
    for entry in table.entries:  # each entry instantiated at least once by this export
        assert any(table.entry_of(name) is entry for name in have), entry.name
    dtypes = {k: v[1] for k, v in have.items()}
    assert dtypes.get("d2t", "int64") == "int64" and dtypes.get("t2d", "bool") == "bool"
    assert dtypes.get("token_map", "int64") == "int64"

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == list(table.architectures)
    if method == "medusa":
        assert (
            config["model_type"] == "medusa"
            and config["num_heads"] == K
            and config["num_hidden_layers"] == LAYERS
        )
        assert (
            config["truncated_vocab_size"] == VP
            and config["vocab_size"] == V
            and config["medusa_fc_bias"] is True
        )
    else:
        assert config["model_type"] == "llama" and config["num_hidden_layers"] == 1
        assert config["tie_word_embeddings"] is False
        assert (
            config["rope_theta"] == target.config.rope_parameters["rope_theta"]
        )  # for transformers-4 engines
        assert "headway" not in config  # headway's own loaders must not mistake an engine folder for theirs
    if method == "eagle3":
        assert config["draft_vocab_size"] == VP and config["target_hidden_size"] == H
    if method == "eagle1" and engine == "sglang":
        assert torch.count_nonzero(load_file(str(out / "model.safetensors"))["fc.bias"]) == 0


def test_optional_medusa_entries_absent_when_off(tmp_path, target):
    """No bias without medusa_fc_bias, no token_map with the full vocabulary: either would be an unexpected key."""
    torch.manual_seed(0)
    heads = MedusaHeads.from_target(target, 2, 1, vocab=None, fc_bias=False, target_name="tiny")
    heads.save_pretrained(tmp_path / "ckpt")
    export(tmp_path / "ckpt", "vllm", tmp_path / "out", engine_version="0.32.0")
    names = set(weight_header(tmp_path / "out" / "model.safetensors"))
    assert names == {
        "blocks.0.layers.0.weight",
        "blocks.1.layers.0.weight",
        "lm_heads.0.weight",
        "lm_heads.1.weight",
    }
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["medusa_fc_bias"] is False and config["truncated_vocab_size"] == V


def _rewrite(folder: Path, edit) -> None:
    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))


@pytest.mark.parametrize("engine,method", PAIRS)
def test_broken_folders_refused_naming_the_key(tmp_path, target, engine, method):
    """For every key: renamed -> missing and unexpected named; wrong shape -> key and both shapes named."""
    good = tmp_path / "good"
    export(_saved(tmp_path, target, method), engine, good, engine_version=VERSION.get(method))
    names = sorted(weight_header(good / "model.safetensors"))
    for i, name in enumerate(names):
        bad = tmp_path / f"renamed{i}"
        shutil.copytree(good, bad)
        _rewrite(bad, lambda s, n=name: s.__setitem__(n + "_renamed", s.pop(n)))
        with pytest.raises(ExportError) as e:
            check_folder(bad, engine)
        assert f"missing key {name!r}" in str(e.value) and f"unexpected key {name + '_renamed'!r}" in str(
            e.value
        )

        bad = tmp_path / f"shape{i}"
        shutil.copytree(good, bad)
        t = load_file(str(good / "model.safetensors"))[name]
        wrong = (t.shape[0] + 1, *t.shape[1:])
        _rewrite(bad, lambda s, n=name, w=wrong, t=t: s.__setitem__(n, torch.zeros(w, dtype=t.dtype)))
        with pytest.raises(ExportError) as e:
            check_folder(bad, engine)
        assert f"key {name!r}: the table expects shape {list(t.shape)}" in str(e.value)
        assert f"the file has {list(wrong)}" in str(e.value)
    # the --from path checks too, before loading anything
    with pytest.raises(ExportError, match=rf"missing key {names[0]!r}"):
        load_exported(tmp_path / "renamed0", engine, target)


def test_wrong_dtype_and_config_refused(tmp_path, target):
    good = tmp_path / "good"
    export(_saved(tmp_path, target, "eagle3"), "vllm", good)
    bad = shutil.copytree(good, tmp_path / "d2t32")
    _rewrite(bad, lambda s: s.__setitem__("d2t", s["d2t"].to(torch.int32)))
    with pytest.raises(ExportError, match=r"key 'd2t': the table expects dtype int64, the file has i32"):
        check_folder(bad, "vllm")
    bad = shutil.copytree(good, tmp_path / "cfg")
    config = json.loads((bad / "config.json").read_text())
    config["draft_vocab_size"] = VP + 5  # config and weights disagree: lm_head / d2t shapes named
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ExportError, match=rf"key 'lm_head.weight': the table expects shape \[{VP + 5}, {H}\]"
    ):
        check_folder(bad, "vllm")
    bad = shutil.copytree(good, tmp_path / "stray")
    (bad / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ExportError, match="pytorch_model.bin"):
        check_folder(bad, "vllm")


# EAGLE-3 also with a feature scale (folded into fc); EAGLE-1's scale is refused (tested below).
ROUND_TRIPS = [(e, m, False) for e, m in PAIRS] + [("vllm", "eagle3", True), ("sglang", "eagle3", True)]


@pytest.mark.parametrize("engine,method,scaled", ROUND_TRIPS)
def test_round_trip_gives_identical_draft_logits(tmp_path, target, engine, method, scaled):
    heads = _heads(target, method, scaled=scaled)
    heads.save_pretrained(tmp_path / "ckpt")
    export(tmp_path / "ckpt", engine, tmp_path / "out", engine_version=VERSION.get(method))
    back = load_exported(tmp_path / "out", engine, target)
    assert type(back) is type(heads)
    ids = _ids()
    before, after = _logits(heads, target, ids), _logits(back, target, ids)
    for x, y in zip(before, after, strict=True):
        if scaled:  # (W / s) f against W (f / s): float rounding only
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(x, y)
    if method != "eagle1":
        draft_ids = torch.arange(VP)
        assert torch.equal(heads.to_target_ids(draft_ids), back.to_target_ids(draft_ids))
    if method == "eagle3":
        assert back.config.feature_layers == [1, 2, 3] and back.feature_scale is None


def test_eagle3_engine_weights_fold_the_feature_scale_exactly(tmp_path, target):
    """The export rule itself: `feature_scale` folded into fc and dropped, loadable with no scale anywhere."""
    d = _heads(target, "eagle3", scaled=True)
    ckpt = read_checkpoint(d.save_pretrained(tmp_path / "d"))
    ids = _ids()
    for engine in ("vllm", "sglang"):
        state = engine_weights(ckpt, engine)
        assert "feature_scale" not in state and set(state) == set(d.state_dict()) - {"feature_scale"}
        plain = Eagle3Drafter.from_target(
            target, feature_layers=[1, 2, 3], vocab=VOCAB, feature_norm="none"
        ).eval()
        plain.load_state_dict(state, strict=True)  # what an engine loads: no scale anywhere
        for x, y in zip(_logits(d, target, ids), _logits(plain, target, ids), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def test_eagle1_engine_weights_only_for_the_engines_graph(tmp_path, target):
    torch.manual_seed(1)
    pre = Eagle1Drafter.from_target(target, feature_norm="per_dim").save_pretrained(tmp_path / "pre")
    with pytest.raises(ExportError, match=r"feature_source='pre_norm'.*post_norm.*feature_norm=none"):
        engine_weights(read_checkpoint(pre), "vllm")
    d = Eagle1Drafter.from_target(target, feature_source="post_norm")
    ckpt = read_checkpoint(d.save_pretrained(tmp_path / "post"))
    assert set(engine_weights(ckpt, "vllm")) == set(d.state_dict())
    sglang = engine_weights(ckpt, "sglang")  # SGLang's fc has a bias: a zero one
    assert set(sglang) == set(d.state_dict()) | {"fc.bias"} and not sglang["fc.bias"].any()
    assert sglang["fc.bias"].shape == (H,)


def test_round_trip_through_the_other_engine_and_hf(tmp_path, target):
    """vLLM folder -> (--from vllm) SGLang folder -> (--from sglang) hf folder -> headway's own loader."""
    heads = _heads(target, "eagle3", scaled=False)
    heads.save_pretrained(tmp_path / "ckpt")
    export(tmp_path / "ckpt", "vllm", tmp_path / "v")
    export(to_headway(tmp_path / "v", "vllm", target.config), "sglang", tmp_path / "s")
    export(to_headway(tmp_path / "s", "sglang", target.config), "hf", tmp_path / "h")
    back = load_drafter(tmp_path / "h", target)
    for x, y in zip(_logits(heads, target, _ids(1)), _logits(back, target, _ids(1)), strict=True):
        assert torch.equal(x, y)


def test_feature_layers_written_for_both_engines(tmp_path, target):
    """Every EAGLE-3 folder names its layers in both numberings: vLLM's hidden_states index i, SGLang's
    layer output i - 1; default layers too, so a folder served by the other engine reads the same layers."""
    export(_saved(tmp_path, target, "eagle3"), "vllm", tmp_path / "v")
    export(tmp_path / "ckpt", "sglang", tmp_path / "s")
    for name in ("v", "s"):
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
        assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
        check_folder(tmp_path / name, "vllm")  # each folder loads in both engines
        check_folder(tmp_path / name, "sglang")
    deep = tiny_llama(vocab_size=V, hidden_size=H, num_layers=8, seed=0)  # default layers [2, 4, 5]
    default = [2, 4, 5]
    export(_saved(tmp_path, deep, "eagle3", name="d", layers=None), "vllm", tmp_path / "vd")
    config = json.loads((tmp_path / "vd" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == default
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert load_exported(tmp_path / "vd", "vllm", deep).config.feature_layers == default
    assert load_exported(tmp_path / "vd", "sglang", deep).config.feature_layers == default


def test_wrong_method_for_the_engine_refused(tmp_path, target):
    medusa = _saved(tmp_path, target, "medusa")
    with pytest.raises(ExportError, match="SGLang has no Medusa"):
        export(medusa, "sglang", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    export(medusa, "vllm", tmp_path / "m", engine_version="0.11")
    with pytest.raises(ExportError, match="declares a medusa draft, not eagle3"):
        check_folder(tmp_path / "m", "vllm", "eagle3")
    export(_saved(tmp_path, target, "eagle1", name="e1"), "sglang", tmp_path / "e1s")
    with pytest.raises(
        ExportError, match=r"architectures \['LlamaForCausalLMEagle'\] is not what vllm loads"
    ):
        load_exported(tmp_path / "e1s", "vllm", target)
    with pytest.raises(ExportError, match="pass --from vllm or --from sglang"):
        read_checkpoint(tmp_path / "m")


def test_eagle1_the_engines_cannot_reproduce_is_refused(tmp_path, target):
    torch.manual_seed(0)
    Eagle1Drafter.from_target(target, feature_source="pre_norm").save_pretrained(tmp_path / "pre")
    with pytest.raises(ExportError, match="feature_source"):
        export(tmp_path / "pre", "vllm", tmp_path / "x")
    Eagle1Drafter.from_target(target, feature_source="post_norm", feature_norm="per_dim").save_pretrained(
        tmp_path / "scaled"
    )
    with pytest.raises(ExportError, match="feature_norm"):
        export(tmp_path / "scaled", "sglang", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_broken_source_checkpoint_refused_and_out_untouched(tmp_path, target):
    ckpt = _saved(tmp_path, target, "eagle3")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _rewrite(
        ckpt, lambda s: s.__setitem__("midlayer.hiddennorm.weight", s.pop("midlayer.hidden_norm.weight"))
    )
    with pytest.raises(ExportError, match="missing key 'midlayer.hidden_norm.weight'"):
        export(ckpt, "vllm", out, force=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temporary folder left
    _rewrite(
        ckpt, lambda s: s.__setitem__("midlayer.hidden_norm.weight", s.pop("midlayer.hiddennorm.weight"))
    )
    _rewrite(ckpt, lambda s: s.__setitem__("lm_head.weight", s["lm_head.weight"][:-1].clone()))
    with pytest.raises(
        ExportError, match=rf"key 'lm_head.weight': the table expects shape \[{VP}, {H}\].*\[{VP - 1}, {H}\]"
    ):
        export(ckpt, "sglang", tmp_path / "o2")
    assert not (tmp_path / "o2").exists()


def test_out_folder_rules(tmp_path, target):
    ckpt = _saved(tmp_path, target, "medusa")
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(ExportError, match="not empty"):
        export(ckpt, "vllm", out)
    assert (out / "old.txt").read_text() == "old"
    export(ckpt, "vllm", out, force=True, engine_version="0.11")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(ExportError, match="checkpoint folder"):
        export(ckpt, "hf", ckpt, force=True)
    with pytest.raises(ExportError, match="checkpoint folder"):
        export(ckpt, "hf", tmp_path, force=True)
    assert (ckpt / "model.safetensors").is_file()


def test_non_llama_layer_refused(tmp_path, target):
    ckpt = _saved(tmp_path, target, "eagle3")
    config = json.loads((ckpt / "config.json").read_text())
    config["headway"]["model_type"] = "qwen2"
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="'qwen2' decoder layer"):
        export(ckpt, "vllm", tmp_path / "x")


def test_sglang_nonzero_fc_bias_refused_on_load(tmp_path, target):
    export(_saved(tmp_path, target, "eagle1"), "sglang", tmp_path / "s")
    _rewrite(tmp_path / "s", lambda s: s.__setitem__("fc.bias", torch.ones_like(s["fc.bias"])))
    with pytest.raises(ExportError, match="'fc.bias' is not zero"):
        load_exported(tmp_path / "s", "sglang", target)


def test_hf_export_with_model_card(tmp_path, target):
    run = tmp_path / "runs" / "medusa"
    heads = _heads(target, "medusa")
    heads.save_pretrained(run)
    sources = [
        {"path": "data/prompts/gsm8k/train.jsonl", "domain": "math", "num_prompts": 40, "name": "gsm8k"}
    ]
    data = {"output_dir": str(tmp_path / "nodata"), "sources": sources, "generation": {"max_new_tokens": 99}}
    (run / "run_config.json").write_text(json.dumps({"target": {"name": "org/Tiny-Model"}, "data": data}))
    (run / "train_summary.json").write_text(json.dumps({"step": 12, "tokens_seen": 3400, "val/loss": 1.25}))
    (run / "eval").mkdir()
    domains = {"math": {"n_prompts": 5, "tau": 2.345, "speedup": 1.678, "pld_speedup": 1.1}}
    report = {
        "checkpoint": str(run),
        "device": "cpu",
        "dtype": "float32",
        "domains": domains,
        "overall": {"n_prompts": 5, "tau": 2.345, "speedup": 1.678, "pld_speedup": 1.1},
    }
    (run / "eval" / "report.json").write_text(json.dumps(report))
    result = export(run, "hf", tmp_path / "hub")
    card = (tmp_path / "hub" / "README.md").read_text()
    assert "Medusa-1 draft for tiny" in card and f"{K} heads" in card
    assert "| gsm8k | math | 40 |" in card and "max_new_tokens 99" in card
    assert "| math | 5 | 2.35 | 1.68x | 1.10x |" in card and "12 steps" in card
    assert "--to vllm --engine-version 0.11 --out" in card and "--to sglang" not in card  # reduced vocabulary
    assert sorted(p.name for p in (tmp_path / "hub").iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
        "report.json",
        "run_config.json",
        "train_summary.json",
    ]
    back = MedusaHeads.from_pretrained(tmp_path / "hub", target=target)
    assert torch.equal(_logits(heads, target, _ids())[0], _logits(back, target, _ids())[0])
    assert result.engine == "hf"

    # a report beside the run that names another checkpoint is not used
    other = tmp_path / "runs" / "eagle3"
    _heads(target, "eagle3").save_pretrained(other)
    (tmp_path / "runs" / "report.json").write_text(json.dumps({**report, "checkpoint": str(run)}))
    export(other, "hf", tmp_path / "hub3")
    card = (tmp_path / "hub3" / "README.md").read_text()
    assert "Not measured" in card and "EAGLE-3 draft for tiny" in card
    assert "--to sglang --out" in card and "--to llamacpp --out" in card


def _cli():
    path = Path(__file__).resolve().parents[1] / "scripts" / "export.py"
    spec = importlib.util.spec_from_file_location("export_cli", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_cli(tmp_path, target, capsys):
    main = _cli()
    ckpt = _saved(tmp_path, target, "eagle3")
    assert main(["--checkpoint", str(ckpt), "--to", "vllm", "--out", str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    assert "llama_eagle3.py @ 583507d13075" in out and '"method": "eagle3"' in out
    assert main(["--from", "vllm", "--checkpoint", str(tmp_path / "v")]) == 0
    assert "matches the vllm eagle3 key table" in capsys.readouterr().out
    args = [
        "--from",
        "vllm",
        "--checkpoint",
        str(tmp_path / "v"),
        "--to",
        "sglang",
        "--out",
        str(tmp_path / "s"),
    ]
    assert main(args) == 0
    check_folder(tmp_path / "s", "sglang", "eagle3")
    assert main(["--checkpoint", str(ckpt), "--to", "vllm", "--out", str(tmp_path / "v")]) == 1
    assert "not empty" in capsys.readouterr().err
    medusa = _saved(tmp_path, target, "medusa", name="m")
    assert main(["--checkpoint", str(medusa), "--to", "sglang", "--out", str(tmp_path / "ms")]) == 1
    assert "SGLang has no Medusa" in capsys.readouterr().err
    assert (
        main(
            [
                "--checkpoint",
                str(medusa),
                "--to",
                "vllm",
                "--out",
                str(tmp_path / "mb"),
                "--dtype",
                "bfloat16",
                "--engine-version",
                "0.11",
            ]
        )
        == 0
    )
    header = weight_header(tmp_path / "mb" / "model.safetensors")
    assert load_file(str(tmp_path / "mb" / "model.safetensors"))["lm_heads.0.weight"].dtype == torch.bfloat16
    assert header["token_map"][1] == "int64"


def test_rope_written_for_older_engines_and_layer_values_checked_on_load(tmp_path):
    """transformers 5 writes rope_parameters only; engines on transformers 4 read rope_theta / rope_scaling."""
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    target = tiny_llama(vocab_size=V, hidden_size=H, num_layers=L, seed=0, rope_parameters=rope)
    export(_saved(tmp_path, target, "eagle3"), "sglang", tmp_path / "s")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert config["rope_theta"] == 500000.0
    assert config["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert load_exported(tmp_path / "s", "sglang", target).config.draft_vocab_size == VP
    config["rms_norm_eps"] = 1e-3  # changes every output, no shape: must be the target's
    (tmp_path / "s" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match=r"rms_norm_eps=0.001, the target has rms_norm_eps=1e-06"):
        load_exported(tmp_path / "s", "sglang", target)
