"""Prompt sources: local JSON/JSONL files or Hugging Face datasets, turned into user turns.

    from headway.data.sources import load_conversations
    convs, skipped = load_conversations(cfg.data)

A row becomes a list of user turns; the target writes every answer itself (self-distillation),
so any answers a source ships (ShareGPT's gpt turns, GSM8K's rationale) are dropped.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from headway.config import DataConfig, SourceConfig
from headway.data.prompt_files import load_json_rows
from headway.paths import resolve_path


@dataclass
class Conversation:
    prompt_id: str  # "<source>:<row>" — stable across runs, used for the split and for resume
    source: str
    domain: str
    turns: list[str]  # user turns, answered one after the other


def source_name(src: SourceConfig) -> str:
    if src.name:
        return src.name
    p = Path(src.path)
    stem = f"{p.parent.name}_{p.stem}" if p.suffix in (".json", ".jsonl") and p.parent.name else p.stem
    return stem.replace("-", "_").replace("/", "_")


def read_rows(src: SourceConfig) -> list[dict]:
    """Rows of a local .json/.jsonl file or a HF dataset id, read with `datasets`."""
    from datasets import load_dataset

    path = resolve_path(src.path)
    if path.suffix in (".json", ".jsonl"):
        if not path.is_file():
            raise FileNotFoundError(f"prompt source not found: {path} (data.sources entry with domain {src.domain!r})")
        ds = load_json_rows(path)  # names the file and line of a parse error
    elif path.exists():
        ds = load_dataset(str(path), split=src.split)  # a local dataset folder
    else:
        ds = load_dataset(src.path, split=src.split)  # a Hugging Face dataset id (online users)
    if len(ds) == 0:
        raise ValueError(f"prompt source {src.path} is empty")
    return ds.to_list()


def row_turns(row: dict, fmt: str) -> list[str]:
    """The user turns of one row; [] when the row holds no usable prompt."""
    if fmt == "auto":
        fmt = next(
            (f for f, keys in _FORMAT_KEYS.items() if any(k in row and row[k] is not None for k in keys)),
            "unknown",
        )
    if fmt == "turns":
        turns = row.get("turns") or []
        return [t for t in turns if isinstance(t, str)]
    if fmt == "conversations":
        msgs = row.get("conversations") or row.get("messages") or []
        users = []
        for m in msgs:
            role = m.get("from", m.get("role"))
            text = m.get("value", m.get("content"))
            if role in ("human", "user") and isinstance(text, str):
                users.append(text)
            elif not users and role not in ("system",):
                return []  # a conversation must open with the user
        return users
    if fmt == "instruction":
        text = (row.get("instruction") or "").strip()
        extra = row.get("input")
        if not extra and row.get("instances"):  # Self-Instruct: the input sits in instances[0]
            extra = (row["instances"][0] or {}).get("input")
        if extra and str(extra).strip():
            text = f"{text}\n\n{str(extra).strip()}"
        return [text] if text else []
    if fmt in ("question", "prompt"):
        text = row.get(fmt)
        return [text] if isinstance(text, str) else []
    return []


_FORMAT_KEYS = {
    "turns": ("turns",),
    "conversations": ("conversations", "messages"),
    "instruction": ("instruction",),
    "question": ("question",),
    "prompt": ("prompt",),
}


def load_conversations(cfg: DataConfig) -> tuple[list[Conversation], Counter]:
    """Every source's sampled conversations, in a deterministic order, and why rows were dropped."""
    if not cfg.sources:
        raise ValueError("data.sources is empty: name at least one prompt file or dataset")
    names = [source_name(s) for s in cfg.sources]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"data.sources: two sources share the name {sorted(dupes)[0]!r}; set `name:` on one")
    convs: list[Conversation] = []
    skipped: Counter = Counter()
    for src, name in zip(cfg.sources, names, strict=True):
        rows = read_rows(src)
        usable, seen = [], set()
        for i, row in enumerate(rows):
            turns = [t.strip() for t in row_turns(row, src.format)]
            turns = [t for t in turns if t][: cfg.generation.max_turns]
            if not turns:
                skipped[f"{name}: row without a usable prompt"] += 1
                continue
            key = "\x00".join(turns)
            if key in seen:
                skipped[f"{name}: duplicate prompt"] += 1
                continue
            seen.add(key)
            usable.append(Conversation(f"{name}:{i}", name, src.domain, turns))
        if not usable:
            raise ValueError(f"prompt source {src.path} has no usable prompts (format {src.format!r})")
        n = src.num_prompts if src.num_prompts is not None else len(usable)
        if cfg.max_prompts_per_source is not None:
            n = min(n, cfg.max_prompts_per_source)
        # A seeded sample, not the file's head: files are often sorted (by length, by topic).
        random.Random(f"{cfg.seed}:{name}").shuffle(usable)
        convs.extend(usable[:n])
    return convs, skipped
