"""The target-feature contract (headway/features.py): one naming scheme, one layer numbering, one capture hook."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

from headway.features import (
    FeatureSpec,
    LayerCapture,
    TargetFeatures,
    feature_key,
    feature_keys,
    hidden_state_to_layer,
    layer_to_hidden_state,
    parse_feature_key,
)


def test_feature_names_parse_back_and_bad_names_are_refused():
    for kind, layer in (("layer", 0), ("layer", 27), ("final_normed", None), ("logits", None)):
        assert parse_feature_key(feature_key(kind, layer)) == (kind, layer)
    assert feature_key("layer", 7) == "features.layer.7"
    assert feature_keys(FeatureSpec(layers=(5, 1, 5), final_normed=True)) == [
        "features.layer.5",
        "features.layer.1",
        "features.final_normed",
    ]
    for bad in ("layer.7", "features.layer.x", "features.layer", "features.final_normed.3", "features.hidden"):
        with pytest.raises(ValueError, match="not a feature name"):
            parse_feature_key(bad)
    with pytest.raises(ValueError, match="unknown feature kind 'hidden'"):
        feature_key("hidden")
    with pytest.raises(ValueError, match="only 'layer' takes"):
        feature_key("layer")


def test_features_travel_as_a_dict_and_back():
    t = [torch.randn(1, 2, 3) for _ in range(4)]
    feats = TargetFeatures(layers={0: t[0], 4: t[1]}, final_normed=t[2], logits=t[3])
    d = {**feats.as_dict(), "input_ids": torch.zeros(1, 2)}
    back = TargetFeatures.from_dict(d)
    assert back.layers == {0: t[0], 4: t[1]} and back.final_normed is t[2] and back.logits is t[3]
    some = TargetFeatures.from_dict(d, FeatureSpec(layers=(4,)))
    assert some.layers == {4: t[1]} and some.final_normed is None and some.logits is None
    with pytest.raises(KeyError, match=r"no feature 'features.layer.2' \(features present: \['features.final_normed'"):
        TargetFeatures.from_dict(d, FeatureSpec(layers=(2,)))


def test_layer_numbering_against_transformers_hidden_states():
    """Layer j's captured output is hidden_states[j + 1]; hidden_states[i] is layer i - 1's output."""
    model = tiny_llama(vocab_size=64, hidden_size=16, num_layers=3)
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
        with LayerCapture(model, (0, 1)) as out:
            model.get_decoder()(input_ids=ids)
    for j in (0, 1):
        assert layer_to_hidden_state(j) == j + 1 and hidden_state_to_layer(j + 1) == j
        torch.testing.assert_close(out[j], states[layer_to_hidden_state(j)])
    assert hidden_state_to_layer(layer_to_hidden_state(2)) == 2


def test_capture_stops_after_the_deepest_layer_and_removes_its_hooks():
    model = tiny_llama(vocab_size=64, hidden_size=16, num_layers=3)
    ids = torch.randint(0, 64, (1, 4))
    reached = []
    model.model.layers[2].register_forward_pre_hook(lambda *_: reached.append(2))
    capture = LayerCapture(model, (1, 0), stop_after_deepest=True)
    after_forward = False
    with torch.no_grad(), capture as out:
        model.get_decoder()(input_ids=ids)
        after_forward = True
    assert sorted(out) == [0, 1] and not reached and not after_forward
    assert not any(layer._forward_hooks for layer in model.model.layers)
    with torch.no_grad():
        model.get_decoder()(input_ids=ids)  # no hook left: the whole forward runs
    assert reached == [2]
    with pytest.raises(ValueError, match="feature layer 3 does not exist: the target has decoder layers 0..2"):
        LayerCapture(model, (3,))
