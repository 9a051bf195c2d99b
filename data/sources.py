"""Prompt sources: local JSON/JSONL files, Hugging Face datasets, passages, or the target itself.

    from headway.data.sources import load_conversations
    convs, skipped = load_conversations(cfg.data)            # self_written sources need writer=...

A row becomes a list of user turns; the target writes every answer itself (self-distillation),
so any answers a source ships (ShareGPT's gpt turns, GSM8K's rationale) are dropped. Source kinds:
`file` (rows of a file or dataset), `context` (headway.data.context: passage + instruction) and
`self_written` (headway.data.magpie: the target writes the user turns). Whatever the kind, a prompt
that shares a 13-word window with an evaluation question (headway.data.overlap) is dropped and counted.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from headway.config import DataConfig, SourceConfig
from headway.data.chat import first_turn_ids
from headway.data.overlap import eval_overlap
from headway.data.prompt_files import load_json_rows
from headway.paths import resolve_path

# (source, its name, how many prompts) -> the conversations it wrote; see headway.data.magpie.
PromptWriter = Callable[[SourceConfig, str, int], list["Written"]]
# Fields every data folder's identity records; later fields are recorded only when set (old folders resume).
_RECORDED_FIELDS = ("path", "domain", "num_prompts", "split", "format", "name")


@dataclass
class Conversation:
    prompt_id: str  # "<source>:<row>" — stable across runs, used for the split and for resume
    source: str
    domain: str
    turns: list[str]  # user turns, answered one after the other
    # The target's own answer to turns[0], {"tokens", "finished"}, where it already wrote one from the same
    # context (a self_written follow-up was written after it): the distiller feeds it instead of answering again.
    first_answer: dict | None = None


@dataclass
class Written:
    """A conversation a PromptWriter wrote: its user turns, and the target's answer to the first where it
    answered it to write the next."""

    turns: list[str]
    first_answer: dict | None = None


def source_name(src: SourceConfig) -> str:
    if src.name:
        return src.name
    if src.kind != "file":
        return f"{src.kind}_{src.domain}"
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


def source_identity(src: SourceConfig) -> dict:
    """The source's settings as a data folder records them (fields added later only when not at their default)."""
    out = {}
    for f in dataclasses.fields(src):
        value = getattr(src, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name in _RECORDED_FIELDS or value != default:
            out[f.name] = value
    return out


def source_turns(
    src: SourceConfig, name: str, n: int | None, seed: int, writer: PromptWriter | None
) -> list[list[str] | Written] | None:
    """The source's candidate conversations (lists of user turns, or what a writer wrote); None: a
    self_written source without a writer."""
    where = f"data.sources entry {name!r}"
    if src.kind == "file":
        if not src.path:
            raise ValueError(f"{where}: kind file needs path: a .json/.jsonl file or a dataset id")
        return [row_turns(row, src.format) for row in read_rows(src)]
    if src.kind == "context":
        from headway.data.context import context_prompts

        return [[p] for p in context_prompts(src, seed, name)]
    if src.path:
        raise ValueError(f"{where}: kind self_written takes no path (the target writes the prompts)")
    if n is None:
        raise ValueError(f"{where}: kind self_written needs num_prompts (how many prompts the target writes)")
    return None if writer is None else writer(src, name, n)


def prompts_wanted(cfg: DataConfig, src: SourceConfig) -> int | None:
    """How many prompts the mix takes from `src`: its num_prompts capped by max_prompts_per_source (None: all)."""
    n = src.num_prompts
    if cfg.max_prompts_per_source is not None:
        n = cfg.max_prompts_per_source if n is None else min(n, cfg.max_prompts_per_source)
    return n


def load_conversations(cfg: DataConfig, writer: PromptWriter | None = None) -> tuple[list[Conversation], Counter]:
    """Every source's sampled conversations, in a deterministic order, and why prompts were dropped.

    `writer` writes the prompts of self_written sources (it needs the target); without one those
    sources are skipped and counted.
    """
    if not cfg.sources:
        raise ValueError("data.sources is empty: name at least one prompt file or dataset")
    names = [source_name(s) for s in cfg.sources]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"data.sources: two sources share the name {sorted(dupes)[0]!r}; set `name:` on one")
    overlap = eval_overlap()
    convs: list[Conversation] = []
    skipped: Counter = Counter()
    for src, name in zip(cfg.sources, names, strict=True):
        n = prompts_wanted(cfg, src)
        candidates = source_turns(src, name, n, cfg.seed, writer)
        if candidates is None:
            skipped[f"{name}: self_written source skipped (no target to write its prompts)"] += 1
            continue
        usable, seen = [], set()
        for i, row in enumerate(candidates):
            written = row.turns if isinstance(row, Written) else row
            turns = [t.strip() for t in written]
            turns = [t for t in turns if t][: cfg.generation.max_turns]
            # A kept answer is fed only where its turn is followed by the same next turn it was written before.
            kept = isinstance(row, Written) and len(turns) > 1 and turns[:2] == written[:2]
            first_answer = row.first_answer if kept else None
            if not turns:
                skipped[f"{name}: row without a usable prompt"] += 1
                continue
            key = "\x00".join(turns)
            if key in seen:
                skipped[f"{name}: duplicate prompt"] += 1
                continue
            seen.add(key)
            if any(overlap.hits(t) for t in turns):
                skipped[f"{name}: shares a 13-word window with an evaluation question"] += 1
                continue
            usable.append(Conversation(f"{name}:{i}", name, src.domain, turns, first_answer))
        if not usable:
            what = f"format {src.format!r}" if src.kind == "file" else f"kind {src.kind!r}"
            raise ValueError(f"prompt source {src.path or name} has no usable prompts ({what})")
        # A seeded sample, not the file's head: files are often sorted (by length, by topic).
        random.Random(f"{cfg.seed}:{name}").shuffle(usable)
        convs.extend(usable[:n])
    return convs, skipped


def benchmark_prompts(cfg: DataConfig, tok, seed: int = 0) -> list[list[int]]:
    """First-turn prompt ids of the file and passage sources (self_written ones need a run) that fit
    `generation.max_prompt_tokens`, in a seeded shuffle: what the generator's benchmarks draw from."""
    convs, _ = load_conversations(cfg)
    prompts = [first_turn_ids(tok, c.turns[0]) for c in convs]
    prompts = [p for p in prompts if len(p) <= cfg.generation.max_prompt_tokens]
    random.Random(seed).shuffle(prompts)
    return prompts
