"""Engine release ranges (issue 16): each mismatch between headway's folders and today's vLLM / SGLang
loaders is either written the way that release loads it or refused naming the release and the reason."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import tiny_llama

from headway.export.check import check_folder, weight_header
from headway.export.engine_keys import ExportError
from headway.export.folders import export, load_exported
from headway.export.releases import release_for
from headway.heads.eagle import Eagle3Drafter
from headway.heads.medusa import MedusaHeads
from headway.heads.vocab import DraftVocab

V, H, L = 256, 32, 8
VOCAB = DraftVocab(torch.arange(0, V, 2, dtype=torch.int64), V)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=L, seed=0)


def _medusa(tmp_path, target, vocab, name="medusa"):
    torch.manual_seed(0)
    return MedusaHeads.from_target(target, 2, 1, vocab=vocab, target_name="tiny").save_pretrained(
        tmp_path / name
    )


def _eagle3(tmp_path, target, name="eagle3", layers=(1, 4, 6), vocab=VOCAB, **config):
    torch.manual_seed(0)
    d = Eagle3Drafter.from_target(target, feature_layers=list(layers), vocab=vocab, target_name="tiny")
    folder = d.save_pretrained(tmp_path / name)
    if config:
        c = json.loads((folder / "config.json").read_text())
        c.update(config)
        (folder / "config.json").write_text(json.dumps(c))
    return folder


def _config(folder):
    return json.loads((folder / "config.json").read_text())


def test_release_ranges_from_versions():
    assert release_for("vllm").name == "0.33"  # the default: the newest checked
    assert release_for("vllm", "0.30.1").name == release_for("vllm", "0.12").name == "0.12-0.32"
    assert release_for("vllm", "0.11.2").name == release_for("vllm", "0.8.5").name == "<=0.11"
    assert release_for("vllm", "v0.33.0").name == "0.33" and release_for("sglang").name == "0.5.23"
    with pytest.raises(ExportError, match=r"0\.34\.0: no checked vLLM release range holds it .*0\.33"):
        release_for("vllm", "0.34.0")
    with pytest.raises(ExportError, match="0.5.20: no checked SGLang release"):
        release_for("sglang", "0.5.20")
    with pytest.raises(ExportError, match="not a version"):
        release_for("vllm", "latest")


def test_vllm_033_has_no_medusa(tmp_path, target):
    ckpt = _medusa(tmp_path, target, vocab=None)
    with pytest.raises(
        ExportError, match=r"vLLM 0\.33 has no Medusa method.*0\.32\.0 is the last release with Medusa"
    ):
        export(ckpt, "vllm", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    export(ckpt, "vllm", tmp_path / "m", engine_version="0.32.0")
    assert _config(tmp_path / "m")["headway_export"]["engine_version"] == "0.12-0.32"
    with pytest.raises(ExportError, match="vLLM 0.33 has no Medusa"):
        check_folder(tmp_path / "m", "vllm", release=release_for("vllm", "0.33"))


def test_reduced_vocab_medusa_only_for_vllm_011(tmp_path, target):
    ckpt = _medusa(tmp_path, target, vocab=VOCAB)
    for version in ("0.12", "0.32.0", "0.20.1"):
        with pytest.raises(ExportError) as e:
            export(ckpt, "vllm", tmp_path / "x", engine_version=version)
        msg = str(e.value)
        assert "vLLM 0.12-0.32 sizes each Medusa lm_heads.i by the full vocab_size (256)" in msg
        assert "only vLLM <= 0.11 loads them" in msg and "cannot be written exactly" in msg
    export(ckpt, "vllm", tmp_path / "old", engine_version="0.11")
    assert {k: v[0] for k, v in weight_header(tmp_path / "old" / "model.safetensors").items()}[
        "token_map"
    ] == (128,)
    check_folder(tmp_path / "old", "vllm")  # the range its block names
    with pytest.raises(ExportError, match="vLLM 0.12-0.32 sizes each Medusa"):
        check_folder(tmp_path / "old", "vllm", release=release_for("vllm", "0.32"))
    # without a headway_export block the check finds the newest range that loads the folder
    config = _config(tmp_path / "old")
    config.pop("headway_export")
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    check_folder(tmp_path / "old", "vllm")


def test_eagle3_full_vocab_leaves_out_d2t_and_t2d(tmp_path, target):
    ckpt = _eagle3(tmp_path, target, vocab=None)
    for engine in ("vllm", "sglang"):
        export(ckpt, engine, tmp_path / engine)
        names = set(weight_header(tmp_path / engine / "model.safetensors"))
        assert "d2t" not in names and "t2d" not in names and "lm_head.weight" in names
        back = load_exported(tmp_path / engine, engine, target)
        assert back.config.draft_vocab_size == V and torch.equal(
            back.to_target_ids(torch.arange(V)), torch.arange(V)
        )
    # a folder that carries d2t with V' = V is refused: vLLM >= 0.31 has no parameter to load it into
    bad = shutil.copytree(tmp_path / "vllm", tmp_path / "bad")
    state = load_file(str(bad / "model.safetensors"))
    state["d2t"] = torch.zeros(V, dtype=torch.int64)
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(ExportError, match=r"unexpected key 'd2t'.*vLLM 0\.33 .*refused: the loader raises"):
        check_folder(bad, "vllm")
    with pytest.raises(
        ExportError, match=r"unexpected key 'd2t'.*SGLang 0\.5\.23 .*skipped without an error"
    ):
        check_folder(bad, "sglang")
    with pytest.raises(
        ExportError, match=r"unexpected key 'd2t'.*vLLM 0\.12-0\.32 .*skipped without an error"
    ):
        check_folder(bad, "vllm", release=release_for("vllm", "0.31.0"))


def test_layer_ids_both_keys_ascending_and_capturable(tmp_path, target):
    unordered = _eagle3(tmp_path, target, name="u", layers=(6, 1, 4))
    result = export(unordered, "sglang", tmp_path / "s")
    config = _config(tmp_path / "s")
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6]  # vLLM, llama.cpp: hidden_states index
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 5]  # SGLang: layer output
    assert any("written in layer order [1, 4, 6]" in n for n in result.notes)
    assert load_exported(tmp_path / "s", "vllm", target).config.feature_layers == [1, 4, 6]

    with pytest.raises(ExportError, match=r"feature_layers \[1, 4, 4\] repeat a layer"):
        export(_eagle3(tmp_path, target, name="r", layers=(1, 4, 4)), "vllm", tmp_path / "x")
    last = _eagle3(tmp_path, target, name="last", layers=(1, 4, L))
    with pytest.raises(ExportError, match=rf"include hidden_states\[{L}\], the last layer's output: SGLang"):
        export(last, "sglang", tmp_path / "x")
    export(last, "vllm", tmp_path / "v")  # vLLM captures it; the SGLang check of that folder refuses it
    with pytest.raises(ExportError, match=rf"layer id {L - 1} in eagle_config.*never captured"):
        check_folder(tmp_path / "v", "sglang")

    for name, edit, error in [
        (
            "mixed",
            {"eagle_aux_hidden_state_layer_ids": [1, 4, 5]},
            r"vLLM reads layers \[1, 4, 5\].*SGLang reads \[1, 4, 6\]",
        ),
        ("order", {"eagle_aux_hidden_state_layer_ids": [4, 1, 6], "eagle_config": {}}, "not ascending"),
        (
            "other",
            {"eagle_aux_hidden_state_layer_ids": None},
            "only the other engine's layer ids.*vllm would read its default",
        ),
    ]:
        bad = shutil.copytree(tmp_path / "s", tmp_path / name)
        config = _config(bad)
        config.update(edit)
        (bad / "config.json").write_text(json.dumps(config))
        with pytest.raises(ExportError, match=error):
            check_folder(bad, "vllm")


def test_weights_in_the_targets_dtype(tmp_path, target):
    """The drafter's config keeps the dtype its target ran in; a target folder's config.json wins; --dtype overrides."""
    bf16 = _eagle3(tmp_path, target, name="b", dtype="bfloat16")
    result = export(bf16, "sglang", tmp_path / "s")
    state = load_file(str(tmp_path / "s" / "model.safetensors"))
    assert state["fc.weight"].dtype == torch.bfloat16 and state["d2t"].dtype == torch.int64
    config = _config(tmp_path / "s")
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    assert any("the target's dtype" in n for n in result.notes)
    export(bf16, "vllm", tmp_path / "kept", dtype=None)  # keep: the checkpoint's float32
    assert load_file(str(tmp_path / "kept" / "model.safetensors"))["fc.weight"].dtype == torch.float32
    assert _config(tmp_path / "kept")["torch_dtype"] == _config(tmp_path / "kept")["dtype"] == "float32"

    folder = tmp_path / "target16"  # a local target folder: its config.json says float16
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float16"}))
    torch.manual_seed(0)
    medusa = MedusaHeads.from_target(target, 2, 1, vocab=None, target_name=str(folder)).save_pretrained(
        tmp_path / "m"
    )
    export(medusa, "vllm", tmp_path / "m16", engine_version="0.32")
    assert load_file(str(tmp_path / "m16" / "model.safetensors"))["lm_heads.0.weight"].dtype == torch.float16
