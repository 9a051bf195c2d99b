"""Features kept while generating: one cache, equal to a fresh forward, that every offline recipe reads;
the extraction fallback writes the union once."""

from __future__ import annotations

import json

import pytest
import torch
from lossless_common import one_thread  # noqa: F401  (small ops: one thread is steadier on a shared CPU)
from test_data import PROMPTS

from headway.config import Config, DataConfig, GenerationConfig, MedusaConfig, SourceConfig, TrainConfig
from headway.data.dataset import load_distilled
from headway.data.distill import distill
from headway.data.feature_cache import FeatureCache, StaleCacheError
from headway.data.feature_stats import FeatureMoments
from headway.data.features import OnlineFeatures, data_feature_spec
from headway.features import FeatureSpec, feature_key
from headway.train.recipe import ensure_feature_cache

KEPT = ["layer.0", "final_normed"]  # the tiny target's layer 0 and final normed state
SPEC = FeatureSpec(layers=(0,), final_normed=True)


def _cfg(tmp_path, features, val_fraction=0.3, **train) -> Config:
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    gen = GenerationConfig(max_new_tokens=10, batch_size=4, shard_size=2, max_prompt_tokens=200, max_turns=2)
    data = DataConfig(
        output_dir=str(tmp_path / "data"), sources=[SourceConfig(path=str(src), domain="chat")],
        generation=gen, val_fraction=val_fraction, features=features,
    )  # fmt: skip
    return Config(data=data, medusa=MedusaConfig(hidden_states="offline"), train=TrainConfig(max_seq_len=64, **train))


def _moments(model, ds) -> FeatureMoments:
    m, fresh = FeatureMoments(), OnlineFeatures(model, SPEC)
    for row in ds:
        x = torch.tensor([row["input_ids"]])
        feats = fresh({"input_ids": x, "attention_mask": torch.ones_like(x)})
        m.update(feats, torch.tensor([row["loss_mask"]]))
    return m


@pytest.mark.parametrize("val_fraction", [0.3, 0.0])  # 0.0: the split moves a row (both splits non-empty)
def test_generation_keeps_one_cache_equal_to_a_fresh_forward(tmp_path, tiny_smol_vocab, smol_tok, val_fraction):
    cfg = _cfg(tmp_path, KEPT, val_fraction)
    summary = distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    assert summary["features"]["layers"] == [0] and summary["features"]["final_normed"]
    ds = load_distilled(cfg.data.output_dir)
    cache = FeatureCache(tmp_path / "data" / "features")
    assert cache.bytes_on_disk == sum(f.stat().st_size for f in (tmp_path / "data/features/shards").glob("*.safetensors"))
    _check_cache_equals_a_fresh_forward(tiny_smol_vocab, ds, cache)


def test_partial_assembly_holds_the_finished_shards_and_their_features(tmp_path, tiny_smol_vocab, smol_tok):
    cfg = _cfg(tmp_path, KEPT)
    quiet = dict(model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    finished = []

    def stop_after_two(k):
        finished.append(k)
        if len(finished) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        distill(cfg, after_shard=stop_after_two, **quiet)
    summary = distill(cfg, partial=True, **quiet)
    assert summary["partial"] == {"shards": 2, "of": 3}  # 5 prompts, 2 per shard
    ds = load_distilled(cfg.data.output_dir)
    rows = json.loads((tmp_path / "data/shards" / f"shard-{finished[1]:05d}.json").read_text())["rows"]
    held = {r["prompt_id"] for split in ds.values() for r in split}
    assert {r["prompt_id"] for r in rows} <= held and len(held) == summary["examples"] < len(PROMPTS)
    _check_cache_equals_a_fresh_forward(tiny_smol_vocab, ds, FeatureCache(tmp_path / "data" / "features"))

    summary = distill(cfg, **quiet)  # finishes the last shard and assembles everything
    assert "partial" not in summary and summary["examples"] == len(PROMPTS)
    _check_cache_equals_a_fresh_forward(tiny_smol_vocab, load_distilled(cfg.data.output_dir), FeatureCache(tmp_path / "data" / "features"))


def _check_cache_equals_a_fresh_forward(tiny_smol_vocab, ds, cache):
    cache.check(SPEC, datasets=ds, max_len=4096)  # rows are whole: any max_seq_len is covered
    fresh = OnlineFeatures(tiny_smol_vocab, SPEC)
    for split in ("train", "validation"):
        for i, row in enumerate(ds[split]):
            x = torch.tensor([row["input_ids"]])
            ref = fresh({"input_ids": x, "attention_mask": torch.ones_like(x)}).as_dict()
            got = cache.row(split, i)
            for key in ref:
                assert got[key].shape == ref[key][0].shape, (split, i, key)
                torch.testing.assert_close(got[key], ref[key][0], rtol=1e-4, atol=1e-4)
    want, have = _moments(tiny_smol_vocab, ds["train"]), cache.moments()
    for key in (feature_key("layer", 0), feature_key("final_normed")):
        assert int(have.count[key]) == sum(sum(r["loss_mask"]) for r in ds["train"])
        torch.testing.assert_close(have.mean(key), want.mean(key), rtol=1e-4, atol=1e-5)


def test_a_recipe_trains_from_the_kept_cache_without_extracting(tmp_path, tiny_smol_vocab, smol_tok, monkeypatch):
    cfg = _cfg(tmp_path, KEPT)
    distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    ds = load_distilled(cfg.data.output_dir)
    import headway.train.recipe as recipe

    monkeypatch.setattr(recipe, "build_feature_cache", lambda *a, **k: pytest.fail("extracted again"))
    for spec in (FeatureSpec(final_normed=True), FeatureSpec(layers=(0,)), SPEC):  # Medusa, EAGLE-1-like, both
        cache, report = ensure_feature_cache(cfg, tiny_smol_vocab, smol_tok, ds, spec, None, log=lambda *_: None)
        assert report is None and cache.folder == tmp_path / "data" / "features"
    with pytest.raises(StaleCacheError, match=r"training needs layers \[1\].*Nothing was overwritten"):
        ensure_feature_cache(cfg, tiny_smol_vocab, smol_tok, ds, FeatureSpec(layers=(1,)), None, log=lambda *_: None)


def test_without_kept_features_one_extraction_writes_the_union(tmp_path, tiny_smol_vocab, smol_tok):
    cfg = _cfg(tmp_path, [])
    distill(cfg, model=tiny_smol_vocab, tok=smol_tok, log=lambda *_: None)
    assert not (tmp_path / "data" / "features").exists()
    ds = load_distilled(cfg.data.output_dir)
    cfg.data.features = ["layer.1", "medusa"]  # every offline head the user trains
    quiet = dict(log=lambda *_: None, progress=False)
    cache, report = ensure_feature_cache(cfg, tiny_smol_vocab, smol_tok, ds, FeatureSpec(final_normed=True), None, **quiet)
    assert report is not None and report.rows == len(ds["train"]) + len(ds["validation"])
    assert cache.spec == FeatureSpec(layers=(1,), final_normed=True)
    again, report = ensure_feature_cache(cfg, tiny_smol_vocab, smol_tok, ds, FeatureSpec(layers=(1,)), None, **quiet)
    assert report is None and again.folder == cache.folder, "the second head extracts nothing"


def test_feature_names_resolve_per_head():
    assert data_feature_spec(["medusa"], 30) == FeatureSpec(final_normed=True)
    assert data_feature_spec(["eagle"], 30) == FeatureSpec(layers=(29,))
    assert data_feature_spec(["eagle3"], 30) == FeatureSpec(layers=(1, 14, 26), final_normed=True)
    assert data_feature_spec(["medusa", "eagle", "eagle3", "layer.3"], 30) == FeatureSpec(
        layers=(1, 3, 14, 26, 29), final_normed=True
    )
    with pytest.raises(ValueError, match=r"data.features: 'layer.30' asks for decoder layers \[30\].*0\.\.29"):
        data_feature_spec(["layer.30"], 30)
    with pytest.raises(ValueError, match=r"'eagle3' asks for decoder layers \[1, 0, -2\]"):
        data_feature_spec(["eagle3"], 2)  # a 2-layer target has no EAGLE-3 default layers
    with pytest.raises(ValueError, match="'eagle2' is not one of medusa, eagle, eagle3"):
        data_feature_spec(["eagle2"], 30)
