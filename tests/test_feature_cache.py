"""Offline feature cache: same batches as online extraction, resumable, statistics, refusals naming both values."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from datasets import DatasetDict
from tiny_models import tiny_llama
from train_helpers import synthetic_rows

from headway.data.dataset import collate, select_rows
from headway.data.feature_cache import FeatureCache, StaleCacheError, with_split_column, write_cache
from headway.data.feature_stats import FeatureMoments, generated_mask
from headway.data.features import BatchFeatures, OnlineFeatures
from headway.features import FeatureSpec, feature_keys
from headway.target import target_fingerprint
from headway.train.data_order import DataOrder

V, H = 128, 32
SPEC = FeatureSpec(layers=(0, 1), final_normed=True)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=V, hidden_size=H, num_layers=3, seed=0)


@pytest.fixture(scope="module")
def data():
    return DatasetDict({"train": synthetic_rows(23, V, seed=0), "validation": synthetic_rows(6, V, seed=1)})


def _fp(model, name="tiny"):
    return target_fingerprint(model, SimpleNamespace(chat_template=None), name)


def _write(folder, target, data, **kw):
    args = dict(
        max_len=40, target_fingerprint=_fp(target), pad_id=2, batch_size=4, shard_rows=8, progress=False
    )
    args.update(kw)
    return write_cache(target, data, SPEC, folder, **args)


def test_offline_batches_equal_online_batches(tmp_path, target, data):
    report = _write(tmp_path, target, data)
    cache = FeatureCache(tmp_path)
    cache.check(SPEC, _fp(target), data, max_len=40)
    collate_fn = cache.collate_fn(SPEC, pad_id=2, max_len=40)
    online, offline = OnlineFeatures(target, SPEC), BatchFeatures(SPEC)
    compared = set()
    for split in ("train", "validation"):
        rows = with_split_column(data[split], split)
        order = DataOrder([min(len(x), 40) for x in rows["input_ids"]], 5, 1, 0, seed=0)
        for idx in order.batches(0):
            batch = collate_fn(select_rows(rows, idx))
            plain = collate(select_rows(rows, idx), pad_id=2, max_len=40)
            for k in plain:
                assert torch.equal(batch[k], plain[k])
            a, b = online(batch), offline(batch)
            real = batch["attention_mask"].bool()
            for i in SPEC.layers:
                torch.testing.assert_close(b.layers[i][real], a.layers[i][real], rtol=1e-5, atol=1e-5)
                assert (b.layers[i][~real] == 0).all()
            torch.testing.assert_close(b.final_normed[real], a.final_normed[real], rtol=1e-5, atol=1e-5)
            compared |= {(split, i) for i in idx}
    assert len(compared) == len(data["train"]) + len(data["validation"])
    files = list(tmp_path.glob("*/shard-*.safetensors"))
    assert report.bytes_on_disk == sum(f.stat().st_size for f in files) == cache.bytes_on_disk > 0
    assert report.rows_in_cache == 29 and len(files) == 3 + 1


def test_statistics_are_those_of_generated_tokens(tmp_path, target, data):
    _write(tmp_path, target, data)
    m = FeatureCache(tmp_path).moments()
    ref = FeatureMoments()
    extract = OnlineFeatures(target, SPEC)
    for i in range(len(data["train"])):
        batch = collate([data["train"][i]], pad_id=2, max_len=40)
        ref.update(extract(batch), generated_mask(batch))
    for key in ref.keys():
        assert float(m.count[key]) == float(ref.count[key]) > 0
        torch.testing.assert_close(m.mean(key), ref.mean(key), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(m.std(key), ref.std(key), rtol=1e-4, atol=1e-5)


class _Killed(Exception):
    pass


def test_resume_after_kill_gives_the_same_cache(tmp_path, target, data, monkeypatch):
    _write(tmp_path / "straight", target, data)
    import headway.data.feature_cache as fc

    real_save = fc.atomic_write_json
    calls = {"n": 0}

    def dying(path, content):  # dies after the second shard is recorded
        real_save(path, content)
        calls["n"] += 1
        if calls["n"] == 3:
            raise _Killed

    monkeypatch.setattr(fc, "atomic_write_json", dying)
    with pytest.raises(_Killed):
        _write(tmp_path / "killed", target, data)
    monkeypatch.setattr(fc, "atomic_write_json", real_save)
    with pytest.raises(ValueError, match="incomplete"):
        FeatureCache(tmp_path / "killed")
    report = _write(tmp_path / "killed", target, data)
    assert report.skipped_shards == 2 and report.rows == 29 - 16
    for f in sorted((tmp_path / "straight").glob("*/shard-*.safetensors")):
        g = tmp_path / "killed" / f.relative_to(tmp_path / "straight")
        assert f.read_bytes() == g.read_bytes(), f.name
    a = json.loads((tmp_path / "straight" / "manifest.json").read_text())
    b = json.loads((tmp_path / "killed" / "manifest.json").read_text())
    assert a == b


def test_stale_cache_refused_naming_both_values(tmp_path, target, data):
    _write(tmp_path, target, data)
    cache = FeatureCache(tmp_path)
    other = tiny_llama(vocab_size=V, hidden_size=H, num_layers=3, seed=5)
    with pytest.raises(StaleCacheError, match=r"embedding_probe=.*this run's target has embedding_probe="):
        cache.check(SPEC, _fp(other), data)
    with pytest.raises(StaleCacheError, match=r"name='tiny'.*name='other'"):
        cache.check(SPEC, _fp(target, "other"), data)
    with pytest.raises(StaleCacheError, match=r"max_len=40, training wants max_len=64"):
        cache.check(SPEC, _fp(target), data, max_len=64)
    with pytest.raises(StaleCacheError, match=r"holds layers \[0, 1\].*needs layers \[0, 2\]"):
        cache.check(FeatureSpec(layers=(0, 2)), _fp(target), data)
    changed = DatasetDict({"train": synthetic_rows(23, V, seed=9), "validation": data["validation"]})
    with pytest.raises(StaleCacheError, match=r"train split was cached as .* the dataset now is"):
        cache.check(SPEC, _fp(target), changed)
    # and writing into it with other settings is refused, not mixed
    with pytest.raises(StaleCacheError, match=r"max_len=40, this run wants max_len=32"):
        _write(tmp_path, target, data, max_len=32)


def test_shards_name_features_by_feature_key_and_older_formats_are_refused(tmp_path, target, data):
    from safetensors import safe_open

    _write(tmp_path, target, data)
    with safe_open(str(tmp_path / "validation" / "shard-00000.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(feature_keys(SPEC)) | {"offsets"}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["version"] = 1  # a cache of the "layer.{i}" naming
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StaleCacheError, match=r"format version 1, this headway reads versions 2 and 3.*--overwrite"):
        FeatureCache(tmp_path)
    with pytest.raises(StaleCacheError, match=r"version=1, this run wants version=3"):
        _write(tmp_path, target, data)
