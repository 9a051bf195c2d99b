"""Shared fixtures: the real SmolLM2 tokenizer/model (prepared by scripts/test.sh) and tiny models."""

from __future__ import annotations

import pytest
import torch

from headway.config import TargetConfig

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="session")
def smol_path():
    from headway.target import prepare_builtin

    return prepare_builtin("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smol_tok(smol_path):
    from headway.target import load_tokenizer

    return load_tokenizer(TargetConfig())


@pytest.fixture(scope="session")
def smol_fp32(smol_path):
    """The real target in fp32 (exactness tests)."""
    from headway.target import load_target

    model, _ = load_target(TargetConfig(device="cpu"), dtype=torch.float32)
    return model


@pytest.fixture(scope="session")
def lossless_case(smol_fp32, smol_tok):
    """(prompts, plain greedy answers) of the fp32 losslessness tests (tests/lossless_common.py), once for all."""
    from lossless_common import reference_case

    return reference_case(smol_fp32, smol_tok)


@pytest.fixture
def tiny_smol_vocab():
    """A random 2-layer Llama over SmolLM2's vocabulary, so the real tokenizer and template apply."""
    from tiny_models import tiny_llama

    return tiny_llama(vocab_size=49152, hidden_size=64, num_layers=2, seed=0)


@pytest.fixture
def fresh_accelerate():
    """Accelerate's process-wide state reset before and after a test (modules that build Accelerators)."""
    from train_helpers import reset_accelerate

    reset_accelerate()
    yield
    reset_accelerate()
