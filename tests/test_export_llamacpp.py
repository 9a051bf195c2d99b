"""--to llamacpp without llama.cpp: refusals, the GGUF header check, the manifest and serve command.

A fake converter writes GGUF headers the way llama.cpp's does (layer ids from the folder's top-level
`eagle_aux_hidden_state_layer_ids`, else [2, L/2, L-3]); the real one runs in test_llamacpp_eagle3.py.
"""

from __future__ import annotations

import json
import shlex
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_models import tiny_llama

from headway.export.engine_keys import ExportError
from headway.export.llamacpp import export_llamacpp
from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter
from headway.heads.medusa import MedusaHeads
from headway.heads.vocab import DraftVocab
from headway.llamacpp_gguf import read_gguf
from headway.llamacpp_server import SpecCounters, parse_spec_counters

V, H, L = 256, 32, 8
VOCAB = DraftVocab(torch.arange(0, V, 2, dtype=torch.int64), V)


def write_gguf(path: Path, metadata: dict, tensors: dict[str, tuple[tuple[int, ...], int]]) -> None:
    """A GGUF v3 header (no tensor data): strings, ints, bools and int arrays, as the reader needs."""

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    def value(v) -> bytes:
        if isinstance(v, bool):
            return struct.pack("<I?", 7, v)
        if isinstance(v, int):
            return struct.pack("<Ii", 5, v)
        if isinstance(v, str):
            return struct.pack("<I", 8) + string(v)
        return struct.pack("<IIQ", 9, 5, len(v)) + b"".join(struct.pack("<i", x) for x in v)

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    out += b"".join(string(k) + value(v) for k, v in metadata.items())
    for name, (shape, kind) in tensors.items():
        out += string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", kind, 0)
    path.write_bytes(out)


class FakeLlama:
    """LlamaCpp's interface; `convert` writes the header llama.cpp's converter would (or ignores the ids)."""

    version = "0.0.0"

    def __init__(self, read_layer_ids: bool = True):
        self.read_layer_ids = read_layer_ids
        self.converted: list[tuple[str, str]] = []

    def binary(self, name: str) -> Path:
        return Path("/opt/llama.cpp/bin") / name

    def convert(self, src, outfile, outtype="f16", target_dir=None) -> Path:
        src = Path(src)
        config = json.loads((src / "config.json").read_text())
        self.converted.append((src.name, outtype))
        if "draft_vocab_size" not in config:  # the target
            meta = {"general.architecture": "llama", "llama.block_count": config["num_hidden_layers"]}
            write_gguf(Path(outfile), {**meta, "llama.vocab_size": config["vocab_size"]}, {})
            return Path(outfile)
        n = json.loads((Path(target_dir) / "config.json").read_text())["num_hidden_layers"]
        ids = config.get("eagle_aux_hidden_state_layer_ids") if self.read_layer_ids else None
        meta = {
            "general.architecture": "eagle3",
            "eagle3.target_layers": ids or [2, n // 2, n - 3],
            "eagle3.target_hidden_size": config["target_hidden_size"],
            "eagle3.block_count": 1,
        }
        with safe_open(str(src / "model.safetensors"), framework="pt") as f:
            names = set(f.keys())
        tensors = {"output.weight": ((config["hidden_size"], config["draft_vocab_size"]), 1)}
        tensors |= {"d2t": ((config["draft_vocab_size"],), 27)} if "d2t" in names else {}
        write_gguf(Path(outfile), meta, tensors)
        return Path(outfile)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=L, seed=0)


@pytest.fixture
def target_dir(tmp_path, target, monkeypatch):
    monkeypatch.setenv("HEADWAY_CACHE", str(tmp_path / "cache"))  # converted target GGUFs go there
    folder = tmp_path / "target"
    target.save_pretrained(folder)
    return folder


def _eagle3(tmp_path, target, layers=(6, 1, 4), vocab=VOCAB, name="eagle3"):
    torch.manual_seed(0)
    d = Eagle3Drafter.from_target(target, feature_layers=list(layers), vocab=vocab, target_name="tiny")
    return d.save_pretrained(tmp_path / name)


def test_llamacpp_runs_eagle3_drafts_only(tmp_path, target, target_dir):
    torch.manual_seed(0)
    medusa = MedusaHeads.from_target(target, 2, 1, target_name="tiny").save_pretrained(tmp_path / "m")
    eagle1 = Eagle1Drafter.from_target(target, feature_source="post_norm").save_pretrained(tmp_path / "e1")
    for folder, name in ((medusa, "Medusa heads"), (eagle1, "an EAGLE-1 drafter")):
        with pytest.raises(
            ExportError, match=rf"llama.cpp runs EAGLE-3 drafts only .*; {name} cannot be served"
        ):
            export_llamacpp(folder, tmp_path / "x", target=target_dir, llama=FakeLlama())
    with pytest.raises(ExportError, match=r"feature_layers \[1, 4, 4\] repeat a layer"):
        export_llamacpp(
            _eagle3(tmp_path, target, (1, 4, 4), name="r"),
            tmp_path / "x",
            target=target_dir,
            llama=FakeLlama(),
        )
    with pytest.raises(ExportError, match="has none: pass --target DIR"):
        export_llamacpp(
            _eagle3(tmp_path, target), tmp_path / "x", llama=FakeLlama()
        )  # "tiny": no folder here
    assert not (tmp_path / "x").exists()


def test_llamacpp_export_checked_with_manifest_and_serve_command(tmp_path, target, target_dir):
    llama = FakeLlama()
    result = export_llamacpp(
        _eagle3(tmp_path, target), tmp_path / "out", target=target_dir, n_max=2, p_min=0.4, llama=llama
    )
    out = (tmp_path / "out").resolve()
    assert sorted(p.name for p in out.iterdir()) == [
        "draft-q8_0.gguf",
        "headway_llamacpp.json",
        "target-f16.gguf",
    ]
    assert ("eagle3-vllm", "q8_0") in llama.converted and ("target", "f16") in llama.converted
    draft = read_gguf(out / "draft-q8_0.gguf")
    assert draft.metadata["eagle3.target_layers"] == [1, 4, 6] and "d2t" in draft.tensors
    cmd = result.serve["f16"]
    assert shlex.split(cmd) == [
        "/opt/llama.cpp/bin/llama-server", "-m", str(out / "target-f16.gguf"), "-md", str(out / "draft-q8_0.gguf"),
        "--spec-type", "draft-eagle3", "--spec-draft-n-max", "2", "--spec-draft-p-min", "0.4", "-fa", "off",
    ]  # fmt: skip
    manifest = json.loads((out / "headway_llamacpp.json").read_text())
    assert manifest["serve"] == {"f16": cmd} and manifest["feature_layers"] == [1, 4, 6]
    assert (manifest["n_max"], manifest["p_min"], manifest["flash_attn"]) == (2, 0.4, "off")
    combined = shlex.split(manifest["serve_with_ngram-mod"]["f16"])
    assert combined == [*shlex.split(cmd)[:6], "draft-eagle3,ngram-mod", *shlex.split(cmd)[7:]]
    with pytest.raises(ExportError, match=r"--draft-p-min is a probability in \[0, 1\), got 1.5"):
        export_llamacpp(_eagle3(tmp_path, target, name="p"), tmp_path / "o3", target=target_dir, p_min=1.5, llama=llama)
    assert not (tmp_path / "o3").exists()
    with pytest.raises(ExportError, match=r"--flash-attn 'fast': llama.cpp takes one of on, off, auto"):
        export_llamacpp(
            _eagle3(tmp_path, target, name="f"), tmp_path / "o4", target=target_dir, flash_attn="fast", llama=llama
        )
    assert not (tmp_path / "o4").exists()
    # the converted target is cached: a second export converts only the draft
    export_llamacpp(
        _eagle3(tmp_path, target, vocab=None, name="full"), tmp_path / "o2", target=target_dir, llama=llama
    )
    assert [c for c in llama.converted if c[0] == "target"] == [("target", "f16")]
    assert "d2t" not in read_gguf(tmp_path / "o2" / "draft-q8_0.gguf").tensors  # V' = V: none written


def test_a_draft_gguf_with_other_layers_is_refused(tmp_path, target, target_dir):
    """What a converter reading the wrong key (e.g. an SGLang-only folder) would write never reaches --out."""
    with pytest.raises(
        ExportError, match=r"eagle3.target_layers is \[2, 4, 5\], the drafter needs \[1, 4, 6\]"
    ):
        export_llamacpp(
            _eagle3(tmp_path, target), tmp_path / "out", target=target_dir, llama=FakeLlama(False)
        )
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_gguf_header_and_spec_counters():
    text = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
llamacpp:spec_decode_num_draft_tokens_total 82
llamacpp:spec_decode_num_accepted_tokens_total 18
llamacpp:spec_decode_num_drafts_total 28
llamacpp:predicted_tokens_seconds 45.5
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 15
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 3
"""
    now = parse_spec_counters(text)
    assert now == SpecCounters(drafted=82, accepted=18, steps=28, per_position=(15, 3))
    assert now - SpecCounters(10, 2, 5, (2,)) == SpecCounters(72, 16, 23, (13, 3))
    assert parse_spec_counters("llamacpp:n_decode_total 4\n") == SpecCounters()
