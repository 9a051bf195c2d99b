"""Small builders for training tests: synthetic distilled rows, a tiny target folder, a fresh accelerate state."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from datasets import Dataset, DatasetDict


def synthetic_rows(n: int, vocab: int, seed: int = 0, min_len: int = 12, max_len: int = 40) -> Dataset:
    """Chat-shaped rows: a prompt (mask 0), an answer ending in EOS 2 (mask 1), sometimes a second turn.

    Answers count upwards by a per-row stride, so a head can learn something beyond memorising.
    """
    rng = random.Random(seed)
    ids, masks = [], []
    for _ in range(n):
        seq, mask = [], []
        for _turn in range(rng.choice([1, 2])):
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 8))]
            start, stride = rng.randrange(3, vocab), rng.choice([1, 2, 3])
            answer = [3 + (start + stride * j) % (vocab - 3) for j in range(rng.randrange(min_len, max_len) // 2)]
            seq += prompt + answer + [2]
            mask += [0] * len(prompt) + [1] * (len(answer) + 1)
        ids.append(seq)
        masks.append(mask)
    return Dataset.from_dict(
        {
            "input_ids": ids,
            "loss_mask": masks,
            "domain": ["chat"] * n,
            "source": ["synthetic"] * n,
            "prompt_id": [f"p{i}" for i in range(n)],
            "num_turns": [1] * n,
        }
    )


def write_dataset(folder: Path, n_train: int, n_val: int, vocab: int) -> Path:
    DatasetDict({"train": synthetic_rows(n_train, vocab, 0), "validation": synthetic_rows(n_val, vocab, 1)}).save_to_disk(
        str(folder / "dataset")
    )
    return folder


def write_tiny_target(folder: Path, smol_path: Path, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """A random tiny Llama over SmolLM2's vocabulary, with SmolLM2's tokenizer, loadable by load_target."""
    from tiny_models import tiny_llama

    model = tiny_llama(vocab_size=49152, hidden_size=hidden_size, num_layers=num_layers, seed=0)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(smol_path) / name).is_file():
            shutil.copy(Path(smol_path) / name, folder / name)
    return folder


def reset_accelerate() -> None:
    """Accelerate keeps process-wide singletons; tests that build several Accelerators start clean."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
