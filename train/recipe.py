"""The recipe skeleton every training entry shares; a head adds only what is its own.

    class Medusa(HeadRecipe): ...            # train/medusa.py: the YAML section, the objective, the report
    sys.exit(run_recipe(Medusa(), argv, __doc__))

`run_recipe` parses `--config` and `section.key=value` overrides (flags and overrides in any order),
loads the config, makes the accelerator, loads the frozen target, checks the data came from it, loads
the dataset, finds a feature cache holding its features when `<section>.hidden_states` is offline (the
recipe's feature_cache_dir, else the one kept while generating; when there is none, one extraction pass
writes the union of what data.features names, so no other head extracts again: a single process builds
or finishes it, several need it built beforehand with CACHE_COMMAND),
lets the head build its objective, hands it its target features (online hooks or the cache), runs
`train(...)` and prints the head's summary. `build_feature_cache` is the one writer of caches: the
training entries and CACHE_COMMAND (train/cache_features.py) both call it.
"""

from __future__ import annotations

import argparse
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headway.config import Config, ConfigError, load_config
from headway.data.captured_features import FEATURES_SUBDIR
from headway.data.dataset import check_data_target, default_collate, load_distilled
from headway.data.feature_cache import (
    MANIFEST,
    CacheReport,
    FeatureCache,
    StaleCacheError,
    with_split_column,
    write_cache,
)
from headway.data.features import BatchFeatures, FeatureSource, OnlineFeatures, data_feature_spec, union
from headway.features import FeatureSpec
from headway.heads.vocab import DraftVocab, build_draft_vocab, coverage
from headway.memory import format_peak
from headway.target import load_target, target_fingerprint
from headway.train.loop import NonFiniteLossError, TrainResult, make_accelerator, train
from headway.train.resume import refuse_early

# The one command that builds a feature cache, for every offline recipe; every hint names exactly it.
CACHE_COMMAND = "python scripts/cache_features.py --config <recipe>"


# ---------------------------------------------------------------- what a head adds


@dataclass
class Run:
    """What the skeleton has loaded when the head builds its objective."""

    cfg: Config
    accelerator: Any
    target: nn.Module
    tok: Any
    ds: Any  # DatasetDict: train (+ validation)
    cache: FeatureCache | None = None  # offline runs


@dataclass
class Batches:
    """How training reads its rows and their target features."""

    train_rows: Any
    val_rows: Any | None
    feature_source: FeatureSource | None  # None: the objective runs the target itself (Medusa-2)
    collate_fn: Callable[[list[dict]], dict[str, torch.Tensor]]


class HeadRecipe(ABC):
    """One kind of head: its YAML section and what only it does around the shared skeleton."""

    section: str  # "medusa" or "eagle": the recipe's section, with hidden_states and feature_cache_dir
    example: str  # a recipe for --help

    def settings(self, cfg: Config):
        return getattr(cfg, self.section)

    def check(self, cfg: Config) -> str | None:
        """Why this config cannot train, or None (checked before anything is loaded)."""
        return None

    def find_unused_parameters(self, cfg: Config) -> bool:
        return False

    @abstractmethod
    def feature_spec(self, cfg: Config, target: nn.Module) -> FeatureSpec:
        """What offline training reads from the target, known before the head is built: the cache's content."""

    @abstractmethod
    def build_objective(self, run: Run) -> nn.Module:
        """A fresh head for the target, inside its training objective (see train/loop.py)."""

    def before_training(self, run: Run, objective: nn.Module, batches: Batches) -> None:
        """Last touches that need the features at hand (EAGLE: feature scale, output calibration)."""
        return None

    @abstractmethod
    def summary(self, cfg: Config, result: TrainResult) -> str:
        """The line printed after training."""


# ---------------------------------------------------------------- the shared steps


def recipe_parser(doc: str, example: str) -> argparse.ArgumentParser:
    """`--config` and `section.key=value` overrides; callers add their own flags."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help=f"a recipe YAML, e.g. {example}")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. train.max_steps=50")
    return parser


def parse_recipe(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, Config]:
    """Flags and overrides in any order (`... train.lr=1e-3 --overwrite eagle.version=3` included)."""
    args = parser.parse_intermixed_args(argv)
    try:
        return args, load_config(args.config, args.overrides)
    except ConfigError as err:
        parser.error(str(err))


def load_checked_data(cfg: Config, target: nn.Module, tok):
    """The recipe's distilled dataset, refused when another target generated it."""
    dataset_dir = cfg.train.dataset_dir or cfg.data.output_dir
    check_data_target(dataset_dir, target, tok, cfg.target.name)
    return load_distilled(dataset_dir)


def draft_vocab(size: int | None, target: nn.Module, tok, train_rows, log=print) -> DraftVocab | None:
    """The `size` most frequent answer tokens of `train_rows` (EOS and pad always in); None: the full vocabulary.

    Rebuilt from the data every run (deterministic): never a map cached for another model."""
    vocab_size = target.get_output_embeddings().weight.shape[0]
    if size is None or size >= vocab_size:
        return None
    special = [i for i in (tok.eos_token_id, tok.pad_token_id) if i is not None]
    vocab = build_draft_vocab(train_rows, size, vocab_size, always_include=special)
    log(f"draft vocabulary: {vocab.size} of {vocab_size} tokens, covering {coverage(vocab, train_rows):.2%} of answer tokens")
    return vocab


def build_feature_cache(cfg: Config, target, tok, ds, spec: FeatureSpec, folder, **options) -> CacheReport:
    """Extract `spec` for every train and validation row into `folder`; resumes a partial cache."""
    return write_cache(
        target,
        ds,
        spec,
        folder,
        max_len=cfg.train.max_seq_len,
        target_fingerprint=target_fingerprint(target, tok, cfg.target.name),
        pad_id=tok.pad_token_id,
        **options,
    )


def shared_feature_dir(cfg: Config) -> Path:
    """The dataset's own feature cache: kept while generating (data.features), or the one extraction pass."""
    return Path(cfg.train.dataset_dir or cfg.data.output_dir) / FEATURES_SUBDIR


def _complete(folder: Path) -> bool:
    manifest = folder / MANIFEST
    return manifest.is_file() and bool(json.loads(manifest.read_text()).get("complete"))


def ensure_feature_cache(
    cfg: Config, target, tok, ds, spec: FeatureSpec, folder: str | None, processes: int = 1, log=print, **options
) -> tuple[FeatureCache, CacheReport | None]:
    """A complete cache holding `spec` for this target, dataset and max_seq_len, and the extraction's report
    (None when nothing was extracted).

    Looked for in `folder` (the recipe's feature_cache_dir) when set, then in the dataset's shared folder
    (`shared_feature_dir`: what generation kept). When neither holds it, one extraction pass writes `folder`,
    or the shared folder with the union of `spec` and `data.features`, so that every head named there
    finds its features afterwards and none extracts again. A single process builds (or finishes) it;
    several need it built beforehand (CACHE_COMMAND)."""
    fp, max_len = target_fingerprint(target, tok, cfg.target.name), cfg.train.max_seq_len
    shared = shared_feature_dir(cfg)
    dest = Path(folder) if folder else shared
    refusals = []
    for candidate in dict.fromkeys([dest, shared]):
        if _complete(candidate):
            cache = FeatureCache(candidate)
            try:
                cache.check(spec, fp, ds, max_len=max_len)
            except StaleCacheError as err:
                refusals.append(str(err))
                continue
            log(f"features from {candidate} ({cache.bytes_on_disk / 2**30:.2f} GiB): nothing to extract")
            return cache, None
    if _complete(dest):
        raise StaleCacheError(
            f"{refusals[0]}. Nothing was overwritten: give this recipe its own {_section(cfg)}.feature_cache_dir, "
            "or list every offline head in data.features before the cache is made"
        )
    if processes > 1:
        raise RuntimeError(f"the feature cache {dest} is not complete: build it first with one process, `{CACHE_COMMAND}`")
    if dest == shared and cfg.data.features:
        spec = union(spec, data_feature_spec(cfg.data.features, target.config.num_hidden_layers))
    report = build_feature_cache(cfg, target, tok, ds, spec, dest, **options)
    return FeatureCache(dest), report


def _section(cfg: Config) -> str:
    return "medusa" if cfg.medusa is not None else "eagle"


def keep_only_what_offline_needs(target: nn.Module) -> None:
    """Offline training never runs the target: keep its first decoder layer (its class) and drop the rest."""
    base = target.get_decoder()
    base.layers = nn.ModuleList([base.layers[0]])


def feature_batches(run: Run, objective: nn.Module) -> Batches:
    """Rows, collate function and feature source for `objective`: from the cache when there is one."""
    spec = objective.feature_spec()
    pad_id, max_len = run.tok.pad_token_id, run.cfg.train.max_seq_len
    train_rows, val_rows = run.ds["train"], run.ds.get("validation")
    if run.cache is None:
        # An objective that asks for nothing runs the target itself: no forward is spent on features.
        source = None if spec == FeatureSpec() else OnlineFeatures(run.target, spec)
        return Batches(train_rows, val_rows, source, default_collate(pad_id, max_len))
    run.cache.check(spec, target_fingerprint(run.target, run.tok, run.cfg.target.name), run.ds, max_len=max_len)
    keep_only_what_offline_needs(run.target)  # the head took what it shares (embedding, lm_head) already
    run.accelerator.print(f"offline features from {run.cache.folder} ({run.cache.bytes_on_disk / 2**30:.2f} GiB)")
    return Batches(
        with_split_column(train_rows, "train"),
        with_split_column(val_rows, "validation") if val_rows is not None else None,
        BatchFeatures(spec),
        run.cache.collate_fn(spec, pad_id=pad_id, max_len=max_len),
    )


# ---------------------------------------------------------------- the skeleton


def run_recipe(head: HeadRecipe, argv: list[str] | None, doc: str) -> int:
    """Train `head` as the recipe in argv says; 0 when the head was saved, 1 on a non-finite loss."""
    parser = recipe_parser(doc, head.example)
    args, cfg = parse_recipe(parser, argv)
    settings = head.settings(cfg)
    if settings is None:
        parser.error(f"{args.config} has no `{head.section}:` section")
    offline = settings.hidden_states == "offline"
    problem = head.check(cfg)
    if problem:
        parser.error(f"{args.config}: {problem}")
    if cfg.train.resume == "auto":
        refuse_early(cfg.train.output_dir, asdict(cfg))  # a resume with changed settings, before anything loads

    tc = cfg.train
    accelerator = make_accelerator(tc, find_unused_parameters=head.find_unused_parameters(cfg), device=cfg.target.device)
    target, tok = load_target(cfg.target, device=accelerator.device)
    run = Run(cfg, accelerator, target, tok, load_checked_data(cfg, target, tok))
    if offline:
        run.cache, _ = ensure_feature_cache(
            cfg, target, tok, run.ds, head.feature_spec(cfg, target), settings.feature_cache_dir,
            accelerator.num_processes, log=accelerator.print,
        )  # fmt: skip
    torch.manual_seed(tc.seed)  # the head's initial weights: the same on every rank and every run
    objective = head.build_objective(run)
    batches = feature_batches(run, objective)
    head.before_training(run, objective, batches)
    try:
        result = train(
            objective,
            batches.train_rows,
            batches.val_rows,
            tc,
            accelerator,
            pad_id=tok.pad_token_id,
            feature_source=batches.feature_source,
            collate_fn=batches.collate_fn,
            run_config=asdict(cfg),
        )
    except NonFiniteLossError as err:
        accelerator.print(f"error: {err}")
        return 1
    accelerator.print(head.summary(cfg, result))
    accelerator.print(format_peak(result.peak_memory))
    if tc.accuracy_profile and run.ds.get("validation") is not None and accelerator.is_main_process:
        write_accuracy_profile(tc.output_dir, accelerator.print)
    return 0


def write_accuracy_profile(checkpoint: str, log=print) -> None:
    """head_accuracy.json beside the saved heads, so inference builds its trees from what they measured."""
    from headway.inference import head_accuracy  # inference imports train's data order: import late

    log(f"accuracy profile: scoring the validation split per depth -> {Path(checkpoint) / 'head_accuracy.json'}")
    head_accuracy.main(["--checkpoint", checkpoint])
