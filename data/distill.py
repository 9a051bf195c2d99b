"""Self-distillation: the target answers the configured prompts; the answers become training data.

    python scripts/generate_data.py --config configs/smollm2-135m/data.yaml [data.key=value ...]

Work is cut into shards of `generation.shard_size` conversations. A finished shard is written
atomically to `<output_dir>/shards/`; a rerun skips finished shards, so an interrupted run resumes
without generating anything twice. Under `accelerate launch` each process takes every n-th shard.
When all shards exist, they are assembled into `<output_dir>/dataset` (train/validation DatasetDict).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from headway.cli import UserError
from headway.config import Config
from headway.data.chat import first_turn_ids, next_turn_ids
from headway.data.dataset import COLUMNS, DATASET_SUBDIR, META_FILE, features
from headway.data.generate import generate_batch
from headway.data.prompt_files import validate_sources
from headway.data.sources import Conversation, PromptWriter, load_conversations, source_identity
from headway.diff import diff
from headway.target import context_length, stop_token_ids

SHARDS_SUBDIR = "shards"
SUMMARY_FILE = "summary.json"
SELF_WRITTEN_SUBDIR = "self_written"  # prompts the target wrote for self_written sources (headway.data.magpie)


class OutputMismatchError(UserError):
    """The output folder holds data made with another target or other settings."""


def identity(cfg: Config, fingerprint: dict, dtype: torch.dtype) -> dict:
    """Everything that decides what the rows contain (batch size does not, so it may change on resume)."""
    gen = dataclasses.asdict(cfg.data.generation)
    gen.pop("batch_size")
    return {
        "target": fingerprint,
        "dtype": str(dtype).removeprefix("torch."),
        "generation": gen,
        "sources": [source_identity(s) for s in cfg.data.sources],
        "max_prompts_per_source": cfg.data.max_prompts_per_source,
        "seed": cfg.data.seed,
    }


def check_or_write_meta(out: Path, ident: dict) -> None:
    meta_path = out / META_FILE
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        diffs = diff(old.get("identity", {}), ident)
        if diffs:
            raise OutputMismatchError(
                f"{out} holds data generated with other settings ({'; '.join(map(str, diffs[:5]))}). "
                "Nothing was changed: choose another data.output_dir, or delete the folder to start over."
            )
        return
    if out.exists() and any(out.iterdir()):
        raise OutputMismatchError(f"{out} is not empty and has no {META_FILE}: refusing to write data into it")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(meta_path, {"identity": ident, "created": time.strftime("%Y-%m-%dT%H:%M:%S")})


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)  # atomic: a killed run never leaves half a file


def is_validation(prompt_id: str, val_fraction: float) -> bool:
    return zlib.crc32(prompt_id.encode()) % 10_000 < val_fraction * 10_000


class Distiller:
    def __init__(self, cfg: Config, model, tok):
        self.cfg, self.gen, self.model, self.tok = cfg, cfg.data.generation, model, tok
        self.eos_ids = stop_token_ids(model, tok)
        self.max_context = context_length(model)

    def run_shard(self, index: int, convs: list[Conversation], first_ids: list[list[int]], on_batch=None) -> dict:
        """Answer every turn of `convs`; return the shard's rows and statistics."""
        gen, tok = self.gen, self.tok
        state = [
            {"ids": [], "mask": [], "messages": [], "turns": 0, "finished": True, "alive": True} for _ in convs
        ]
        skipped: Counter = Counter()
        n_tokens, t0 = 0, time.perf_counter()
        for turn in range(gen.max_turns):
            todo = []
            for c, s, ids0 in zip(convs, state, first_ids, strict=True):
                if not s["alive"] or turn >= len(c.turns):
                    continue
                s["messages"].append({"role": "user", "content": c.turns[turn]})
                ctx = ids0 if turn == 0 else next_turn_ids(tok, s["messages"], s["ids"], s["last_ended"])
                if ctx is None:
                    skipped["later turn dropped: chat template does not render the answer verbatim"] += 1
                    s["alive"] = False
                elif len(ctx) + gen.max_new_tokens > self.max_context:
                    skipped["later turn dropped: context would exceed the model's max positions"] += 1
                    s["alive"] = False
                else:
                    todo.append((s, ctx))
            todo.sort(key=lambda x: len(x[1]))  # similar lengths together: less padding
            for b in range(0, len(todo), gen.batch_size):
                chunk = todo[b : b + gen.batch_size]
                answers = generate_batch(
                    self.model,
                    [ctx for _, ctx in chunk],
                    gen.max_new_tokens,
                    self.eos_ids,
                    tok.pad_token_id,
                    gen.temperature,
                    gen.top_p,
                    seed=zlib.crc32(f"{self.cfg.data.seed}:{index}:{turn}:{b}".encode()),
                )
                for (s, ctx), ans in zip(chunk, answers, strict=True):
                    s["mask"] += [0] * (len(ctx) - len(s["ids"])) + [1] * len(ans.tokens)
                    s["ids"] = ctx + ans.tokens
                    s["turns"] += 1
                    s["finished"] &= ans.finished
                    s["last_ended"] = ans.finished
                    text = tok.decode(ans.tokens[:-1] if ans.finished else ans.tokens, skip_special_tokens=False)
                    s["messages"].append({"role": "assistant", "content": text})
                    n_tokens += len(ans.tokens)
                if on_batch is not None:
                    on_batch(len(chunk), sum(len(a.tokens) for a in answers))
        rows = [
            {
                "input_ids": s["ids"],
                "loss_mask": s["mask"],
                "domain": c.domain,
                "source": c.source,
                "prompt_id": c.prompt_id,
                "num_turns": s["turns"],
                "finished": s["finished"],
            }
            for c, s in zip(convs, state, strict=True)
            if s["turns"] > 0
        ]
        seconds = time.perf_counter() - t0
        return {"rows": rows, "stats": {"skipped": dict(skipped), "gen_tokens": n_tokens, "seconds": seconds}}


def plan(cfg: Config, tok, writer: PromptWriter | None = None) -> tuple[list[list[tuple[Conversation, list[int]]]], Counter]:
    """Conversations with their first-turn ids, cut into shards; and the prompts skipped, by reason."""
    convs, skipped = load_conversations(cfg.data, writer)
    skipped.update(getattr(writer, "skipped", {}))
    kept = []
    for c in convs:
        ids = first_turn_ids(tok, c.turns[0])
        if len(ids) > cfg.data.generation.max_prompt_tokens:
            skipped[f"prompt longer than max_prompt_tokens={cfg.data.generation.max_prompt_tokens}"] += 1
        else:
            kept.append((c, ids))
    size = cfg.data.generation.shard_size
    return [kept[i : i + size] for i in range(0, len(kept), size)], skipped


def distill(cfg: Config, model=None, tok=None, after_shard=None, log=print, fingerprint: dict | None = None) -> dict:
    """Generate (or finish generating) the dataset of `cfg.data`; return the summary.

    `after_shard(k)` runs after shard k is saved (tests interrupt there); `fingerprint` replaces
    the target's computed identity (for stand-in models in tests).
    """
    from headway.distributed import process_state
    from headway.target import load_target, pick_device, target_fingerprint

    validate_sources(cfg.data)  # a missing or malformed prompt file stops the run before anything loads
    state = process_state(cfg.target.device)
    if model is None:
        # Several processes: each takes its own accelerator (state.device); one: the configured device.
        device = state.device if state.num_processes > 1 else pick_device(cfg.target.device)
        model, tok = load_target(cfg.target, device=device)
    out = Path(cfg.data.output_dir)
    ident = identity(cfg, fingerprint or target_fingerprint(model, tok, cfg.target.name), model.dtype)
    plan(cfg, tok)  # every file source read before meta.json: a bad one writes nothing
    if state.is_main_process:
        check_or_write_meta(out, ident)
    state.wait_for_everyone()
    shards_dir = out / SHARDS_SUBDIR
    shards_dir.mkdir(parents=True, exist_ok=True)

    from headway.data.magpie import PromptWriter

    # The main process writes any self_written prompts into the output folder; the others then read them.
    writer = PromptWriter(model, tok, out / SELF_WRITTEN_SUBDIR, cfg.data, log=log)
    if state.is_main_process:
        shards, prompt_skips = plan(cfg, tok, writer)
    state.wait_for_everyone()
    if not state.is_main_process:
        shards, prompt_skips = plan(cfg, tok, writer)
    planned = Counter(c.domain for shard in shards for c, _ in shard)
    mine = [k for k in range(len(shards)) if k % state.num_processes == state.process_index]
    todo = [k for k in mine if not (shards_dir / f"shard-{k:05d}.json").is_file()]
    n_answers = sum(sum(len(c.turns) for c, _ in shards[k]) for k in todo)
    if len(todo) < len(mine):
        log(f"resuming: {len(mine) - len(todo)} of {len(mine)} shards already done")
    bar = tqdm(total=n_answers, desc="answers", unit="ans", disable=not state.is_local_main_process or n_answers == 0)
    t0, done_tokens = time.perf_counter(), 0

    def on_batch(n_answers: int, n_tokens: int) -> None:
        nonlocal done_tokens
        done_tokens += n_tokens
        bar.update(n_answers)
        bar.set_postfix(tok_s=f"{done_tokens / (time.perf_counter() - t0):.0f}")

    distiller = Distiller(cfg, model, tok)
    for k in todo:
        convs = [c for c, _ in shards[k]]
        result = distiller.run_shard(k, convs, [ids for _, ids in shards[k]], on_batch)
        result["stats"]["process"] = state.process_index
        _write_json(shards_dir / f"shard-{k:05d}.json", result)
        if after_shard is not None:
            after_shard(k)
    bar.close()
    state.wait_for_everyone()
    summary = None
    if state.is_main_process:
        summary = assemble(cfg, out, len(shards), prompt_skips, run_seconds=time.perf_counter() - t0, planned=planned)
        log(format_summary(summary))
    state.wait_for_everyone()
    return summary or json.loads((out / SUMMARY_FILE).read_text())


def assemble(
    cfg: Config, out: Path, n_shards: int, prompt_skips: Counter, run_seconds: float, planned: Counter | None = None
) -> dict:
    """Join the shards into the train/validation DatasetDict and write the summary.

    `planned`: conversations sent to the target, per domain (the summary's `prompts` column).
    """
    from datasets import Dataset, DatasetDict, DatasetInfo

    rows, skipped, gen_tokens, gen_seconds = [], Counter(prompt_skips), 0, 0.0
    for k in range(n_shards):
        path = out / SHARDS_SUBDIR / f"shard-{k:05d}.json"
        if not path.is_file():
            raise RuntimeError(f"shard {path} is missing: rerun generation to finish it")
        shard = json.loads(path.read_text())
        rows += shard["rows"]
        skipped.update(shard["stats"]["skipped"])
        gen_tokens += shard["stats"]["gen_tokens"]
        gen_seconds += shard["stats"]["seconds"]
    if not rows:
        raise RuntimeError("no prompt produced a row: see the skipped counts above")
    meta = json.loads((out / META_FILE).read_text())
    info = DatasetInfo(description=json.dumps(meta["identity"]), features=features())  # settings and target travel with the data
    if len(rows) < 2:
        raise RuntimeError(f"only {len(rows)} example was generated: a train/validation split needs at least 2")
    split = defaultdict(list)
    for r in rows:
        split["validation" if is_validation(r["prompt_id"], cfg.data.val_fraction) else "train"].append(r)
    for src, dst in (("train", "validation"), ("validation", "train")):
        if not split[dst]:  # tiny runs: keep both splits non-empty, deterministically
            r = min(split[src], key=lambda r: zlib.crc32(r["prompt_id"].encode()))
            split[src].remove(r)
            split[dst].append(r)
    dd = DatasetDict({name: Dataset.from_dict({c: [r[c] for r in split[name]] for c in COLUMNS}, features=features(), info=info) for name in ("train", "validation")})
    target = out / DATASET_SUBDIR
    tmp = out / (DATASET_SUBDIR + ".tmp")
    dd.save_to_disk(str(tmp))
    if target.exists():
        import shutil

        shutil.rmtree(target)
    os.replace(tmp, target)

    per_domain: dict[str, dict] = defaultdict(lambda: {"prompts": 0, "examples": 0, "answers": 0, "generated_tokens": 0})
    for domain, n in (planned or {}).items():
        per_domain[domain]["prompts"] = n
    for r in rows:
        d = per_domain[r["domain"]]
        d["examples"] += 1
        d["answers"] += r["num_turns"]
        d["generated_tokens"] += sum(r["loss_mask"])
    summary = {
        "dataset": str(target),
        "examples": len(rows),
        "train": len(split["train"]),
        "validation": len(split["validation"]),
        "tokens": sum(len(r["input_ids"]) for r in rows),
        "generated_tokens": sum(d["generated_tokens"] for d in per_domain.values()),
        "unfinished_answers": sum(1 for r in rows if not r["finished"]),
        "per_domain": dict(sorted(per_domain.items())),
        "skipped": dict(sorted(skipped.items())),
        "generation_seconds": round(gen_seconds, 1),
        "generated_tokens_per_s": round(gen_tokens / gen_seconds, 1) if gen_seconds else None,
        "this_run_seconds": round(run_seconds, 1),
    }
    _write_json(out / SUMMARY_FILE, summary)
    return summary


def format_summary(s: dict) -> str:
    lines = [
        f"dataset: {s['dataset']}",
        f"examples: {s['examples']} (train {s['train']}, validation {s['validation']}); "
        f"tokens {s['tokens']}, generated {s['generated_tokens']}; "
        f"answers cut at max_new_tokens: {s['unfinished_answers']}",
        f"generation: {s['generation_seconds']} s, {s['generated_tokens_per_s']} generated tokens/s",
        f"{'domain':<16}{'prompts':>9}{'examples':>10}{'answers':>9}{'gen tokens':>12}",
    ]
    lines += [
        f"{d:<16}{v.get('prompts', ''):>9}{v['examples']:>10}{v.get('answers', ''):>9}{v['generated_tokens']:>12}"
        for d, v in s["per_domain"].items()
    ]
    lines.append("skipped: " + (", ".join(f"{k}: {v}" for k, v in s["skipped"].items()) or "none"))
    return "\n".join(lines)
