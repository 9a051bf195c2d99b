"""Self-distillation: the target answers the configured prompts; the answers become training data.

    python scripts/generate_data.py --config configs/smollm2-135m/data.yaml [data.key=value ...]

Work is cut into shards of `generation.shard_size` conversations. One generator answers all of this
run's shards, conversation after conversation (continuous batching: headway.data.generate, or a serving
engine: headway.data.server); a shard is written atomically to `<output_dir>/shards/` once its last
conversation is done. A rerun skips finished shards, so an interrupted run resumes without generating a
finished shard twice. Under `accelerate launch` each process takes every n-th shard. When all shards
exist, they are assembled into `<output_dir>/dataset` (train/validation DatasetDict).

With `data.features` the generator keeps those hidden states while it answers: each shard's features
go to `<output_dir>/features/shards/` before its rows, and assembly writes the feature cache's manifest
(headway.data.captured_features), which every offline recipe whose features it holds trains from.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from headway.cli import UserError
from headway.config import Config
from headway.data.answering import ConversationJob, ShardClock, ShardWork, TurnSettings
from headway.data.captured_features import FEATURES_SUBDIR, write_manifest, write_shard
from headway.data.chat import first_turn_ids
from headway.data.dataset import COLUMNS, DATASET_SUBDIR, META_FILE, features
from headway.data.features import data_feature_spec
from headway.data.generate import make_generator
from headway.data.prompt_files import validate_sources
from headway.data.sources import Conversation, PromptWriter, load_conversations, source_identity
from headway.diff import diff
from headway.features import FeatureSpec
from headway.sampling import SamplingParams
from headway.target import context_length, stop_token_ids

SHARDS_SUBDIR = "shards"
SUMMARY_FILE = "summary.json"
SELF_WRITTEN_SUBDIR = "self_written"  # prompts the target wrote for self_written sources (headway.data.magpie)


class OutputMismatchError(UserError):
    """The output folder holds data made with another target or other settings."""


def identity(cfg: Config, fingerprint: dict, dtype: torch.dtype | str) -> dict:
    """Everything that decides what the rows contain (batch size does not, so it may change on resume; nor
    does the server's address). Settings added later are recorded only when set, so older folders resume."""
    gen = dataclasses.asdict(cfg.data.generation)
    for key in ("batch_size", "server_url") + (("backend", "server_api", "server_model") if gen["backend"] == "local" else ()):
        gen.pop(key)
    ident = {
        "target": fingerprint,
        "dtype": str(dtype).removeprefix("torch."),
        "generation": gen,
        "sources": [source_identity(s) for s in cfg.data.sources],
        "max_prompts_per_source": cfg.data.max_prompts_per_source,
        "seed": cfg.data.seed,
    }
    if cfg.data.features:
        ident["features"] = sorted(cfg.data.features)
    return ident


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


def shard_path(out: Path, k: int) -> Path:
    """Generation shard k's rows in the output folder (written once the shard's last conversation is done)."""
    return out / SHARDS_SUBDIR / f"shard-{k:05d}.json"


def answer_order(n_shards: int, seed: int) -> list[int]:
    """The order shards are answered in: shuffled, because shards hold the sources one after another, so
    that the shards finished at any moment mix every domain (`--partial` can train on them)."""
    order = list(range(n_shards))
    random.Random(f"{seed}:shard-order").shuffle(order)
    return order


def plan(
    cfg: Config, tok, writer: PromptWriter | None = None, max_context: int = 1 << 30
) -> tuple[list[list[tuple[Conversation, list[int]]]], Counter]:
    """Conversations with their first-turn ids, cut into shards; and the prompts skipped, by reason."""
    convs, skipped = load_conversations(cfg.data, writer)
    skipped.update(getattr(writer, "skipped", {}))
    gen, kept = cfg.data.generation, []
    for c in convs:
        ids = first_turn_ids(tok, c.turns[0])
        if len(ids) > gen.max_prompt_tokens:
            skipped[f"prompt longer than max_prompt_tokens={gen.max_prompt_tokens}"] += 1
        elif len(ids) + gen.max_new_tokens > max_context:
            skipped["prompt + max_new_tokens exceed the model's max positions"] += 1
        else:
            kept.append((c, ids))
    size = cfg.data.generation.shard_size
    return [kept[i : i + size] for i in range(0, len(kept), size)], skipped


def load_backend(cfg: Config, device):
    """The target (local backend) or a `TokenServer` standing in for it (server backend), and the tokenizer."""
    from headway.target import load_target, load_tokenizer

    if cfg.data.generation.backend == "server":
        from headway.data.server import TokenServer

        return TokenServer.from_config(cfg), load_tokenizer(cfg.target)
    return load_target(cfg.target, device=device)


def distill(
    cfg: Config, model=None, tok=None, after_shard=None, log=print, fingerprint: dict | None = None, partial: bool = False
) -> dict:
    """Generate (or finish generating) the dataset of `cfg.data`; return the summary.

    `partial`: generate nothing; assemble the shards finished so far (a rerun without it finishes the rest).
    `after_shard(k)` runs after shard k is saved (tests interrupt there); `fingerprint` replaces
    the target's computed identity (for stand-in models in tests).
    """
    from headway.data.server import TokenServer
    from headway.distributed import process_state
    from headway.target import config_fingerprint, pick_device, target_fingerprint

    validate_sources(cfg.data)  # a missing or malformed prompt file stops the run before anything loads
    state = process_state(cfg.target.device)
    if model is None:
        # Several processes: each takes its own accelerator (state.device); one: the configured device.
        model, tok = load_backend(cfg, state.device if state.num_processes > 1 else pick_device(cfg.target.device))
    served = isinstance(model, TokenServer)
    # A server returns no hidden states: data.features then names what the one extraction pass writes.
    capture = data_feature_spec(cfg.data.features, model.config.num_hidden_layers) if cfg.data.features else None
    if served and capture is not None:
        log("data.features: a generation server keeps no hidden states; the first offline recipe extracts them once")
        capture = None
    out = Path(cfg.data.output_dir)
    if fingerprint is None:
        name = cfg.target.name
        fingerprint = config_fingerprint(model.config, tok, name) if served else target_fingerprint(model, tok, name)
    dtype = "served" if served else model.dtype
    ident = identity(cfg, fingerprint, dtype)
    max_context = context_length(model)
    plan(cfg, tok)  # every file source read before meta.json: a bad one writes nothing
    if state.is_main_process:
        check_or_write_meta(out, ident)
    state.wait_for_everyone()
    (out / SHARDS_SUBDIR).mkdir(parents=True, exist_ok=True)

    from headway.data.magpie import PromptWriter

    # The main process writes any self_written prompts into the output folder; the others then read them.
    writer = PromptWriter(model, tok, out / SELF_WRITTEN_SUBDIR, cfg.data, log=log)
    if state.is_main_process:
        shards, prompt_skips = plan(cfg, tok, writer, max_context)
    state.wait_for_everyone()
    if not state.is_main_process:
        shards, prompt_skips = plan(cfg, tok, writer, max_context)
    planned = Counter(c.domain for shard in shards for c, _ in shard)
    mine = {k for k in range(len(shards)) if k % state.num_processes == state.process_index}
    todo = [k for k in answer_order(len(shards), cfg.data.seed) if k in mine and not shard_path(out, k).is_file()]
    if partial:
        done = sum(shard_path(out, k).is_file() for k in range(len(shards)))
        log(f"--partial: assembling the {done} finished shards of {len(shards)}, generating nothing")
        todo = []
    elif len(todo) < len(mine):
        log(f"resuming: {len(mine) - len(todo)} of {len(mine)} shards already done")
    n_answers = sum(len(c.turns) - (c.first_answer is not None) for k in todo for c, _ in shards[k])  # kept answers: fed
    bar = tqdm(total=n_answers, desc="answers", unit="ans", disable=not state.is_local_main_process or n_answers == 0)
    t0, done_tokens, clock = time.perf_counter(), 0, ShardClock()

    def on_answer(answer) -> None:
        nonlocal done_tokens
        done_tokens += len(answer.tokens)
        bar.update(1)
        bar.set_postfix(tok_s=f"{done_tokens / (time.perf_counter() - t0):.0f}")

    def save(shard: ShardWork) -> None:
        if capture is not None:  # features first: a shard whose rows exist has its features
            train = [not is_validation(r["prompt_id"], cfg.data.val_fraction) for r in shard.rows]
            write_shard(out / FEATURES_SUBDIR, shard.index, shard.rows, shard.features, train)
        stats = {"skipped": dict(shard.skipped), "gen_tokens": shard.gen_tokens, "seconds": clock.lap()}
        _write_json(shard_path(out, shard.index), {"rows": shard.rows, "stats": {**stats, "process": state.process_index}})
        if after_shard is not None:
            after_shard(shard.index)

    g = cfg.data.generation
    settings = TurnSettings(g.max_new_tokens, max_context, cfg.data.seed)
    jobs = (
        ConversationJob(c, ids, tok, settings, work, slot)
        for k in todo
        for work in [ShardWork(k, len(shards[k]), save)]
        for slot, (c, ids) in enumerate(shards[k])
    )
    sampling = SamplingParams(temperature=g.temperature, top_p=g.top_p)
    generator = make_generator(model, g.batch_size, g.max_new_tokens, stop_token_ids(model, tok), sampling, capture, on_answer)
    generator.run(jobs)
    bar.close()
    if getattr(generator, "reused_tokens", 0):  # the local generator: prompt prefixes its rows kept (the system turn)
        log(f"prefills skipped {generator.reused_tokens} prompt tokens whose keys their row kept from its last conversation")
    state.wait_for_everyone()
    summary = None
    if state.is_main_process:
        summary = assemble(
            cfg, out, len(shards), prompt_skips, time.perf_counter() - t0, planned, capture, ident, partial
        )
        log(format_summary(summary))
    state.wait_for_everyone()
    return summary or json.loads((out / SUMMARY_FILE).read_text())


def assemble(
    cfg: Config,
    out: Path,
    n_shards: int,
    prompt_skips: Counter,
    run_seconds: float,
    planned: Counter | None = None,
    capture: FeatureSpec | None = None,
    ident: dict | None = None,
    partial: bool = False,
) -> dict:
    """Join the shards into the train/validation DatasetDict (and, with `capture`, the feature cache kept
    while generating) and write the summary.

    `planned`: conversations sent to the target, per domain (the summary's `prompts` column).
    `partial`: join the shards that exist and name the missing ones in the summary, instead of refusing.
    """
    from datasets import Dataset, DatasetDict, DatasetInfo

    shard_ids = [k for k in range(n_shards) if shard_path(out, k).is_file()]
    if not partial and len(shard_ids) < n_shards:
        missing = min(set(range(n_shards)) - set(shard_ids))
        raise RuntimeError(f"shard {shard_path(out, missing)} is missing: rerun generation to finish it")
    rows, skipped, gen_tokens, gen_seconds = [], Counter(prompt_skips), 0, 0.0
    for k in shard_ids:
        shard = json.loads(shard_path(out, k).read_text())
        rows += [(r, (k, i)) for i, r in enumerate(shard["rows"])]  # with its place in the shard's features
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
        split["validation" if is_validation(r[0]["prompt_id"], cfg.data.val_fraction) else "train"].append(r)
    moved = False
    for src, dst in (("train", "validation"), ("validation", "train")):
        if not split[dst]:  # tiny runs: keep both splits non-empty, deterministically
            r = min(split[src], key=lambda r: zlib.crc32(r[0]["prompt_id"].encode()))
            split[src].remove(r)
            split[dst].append(r)
            moved = True
    dd = DatasetDict(
        {
            name: Dataset.from_dict({c: [r[c] for r, _ in split[name]] for c in COLUMNS}, features=features(), info=info)
            for name in ("train", "validation")
        }
    )
    target = out / DATASET_SUBDIR
    tmp = out / (DATASET_SUBDIR + ".tmp")
    dd.save_to_disk(str(tmp))
    if target.exists():
        import shutil

        shutil.rmtree(target)
    os.replace(tmp, target)
    feature_cache = None
    if capture is not None:
        places = {name: [place for _, place in split[name]] for name in ("train", "validation")}
        ident = ident or meta["identity"]
        feature_cache = write_manifest(
            out / FEATURES_SUBDIR, capture, getattr(torch, ident["dtype"]), ident["target"], dd, places, shard_ids, moved
        )
    rows = [r for r, _ in rows]

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
    if len(shard_ids) < n_shards:
        summary["partial"] = {"shards": len(shard_ids), "of": n_shards}
    if feature_cache is not None:
        spec = feature_cache.spec
        summary["features"] = {
            "folder": str(feature_cache.folder),
            "layers": list(spec.layers),
            "final_normed": spec.final_normed,
            "bytes": feature_cache.bytes_on_disk,
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
    if "partial" in s:
        p = s["partial"]
        lines.append(f"PARTIAL: {p['shards']} of {p['of']} shards (rerun without --partial to finish the rest)")
    lines.append("skipped: " + (", ".join(f"{k}: {v}" for k, v in s["skipped"].items()) or "none"))
    if "features" in s:
        f = s["features"]
        lines.append(
            f"features kept while generating: layers {f['layers']} final_normed={f['final_normed']} -> {f['folder']} "
            f"({f['bytes'] / 2**30:.2f} GiB, {f['bytes'] / max(1, s['tokens']) / 1024:.1f} KiB per token)"
        )
    return "\n".join(lines)
