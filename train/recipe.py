"""The recipe skeleton every training entry shares; a head adds only what is its own.

    class Medusa(HeadRecipe): ...            # train/medusa.py: the YAML section, the objective, the report
    sys.exit(run_recipe(Medusa(), argv, __doc__))

`run_recipe` parses `--config` and `section.key=value` overrides (flags and overrides in any order),
loads the config, makes the accelerator, loads the frozen target, checks the data came from it, loads
the dataset, makes sure the feature cache is complete when `<section>.hidden_states` is offline (a
single process builds or finishes it; several processes need it built beforehand with CACHE_COMMAND),
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
from headway.data.dataset import check_data_target, default_collate, load_distilled
from headway.data.feature_cache import MANIFEST, CacheReport, FeatureCache, with_split_column, write_cache
from headway.data.features import BatchFeatures, FeatureSource, OnlineFeatures
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


def ensure_feature_cache(run: Run, spec: FeatureSpec, folder: str) -> FeatureCache:
    """The complete cache in `folder`: built (or finished) here when a single process runs."""
    manifest = Path(folder) / MANIFEST
    if not (manifest.is_file() and json.loads(manifest.read_text()).get("complete")):
        if run.accelerator.num_processes > 1:
            raise RuntimeError(
                f"the feature cache {folder} is not complete: build it first with one process, `{CACHE_COMMAND}`"
            )
        build_feature_cache(run.cfg, run.target, run.tok, run.ds, spec, folder)
    return FeatureCache(folder)


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
    if offline and not settings.feature_cache_dir:
        parser.error(f"{args.config}: {head.section}.hidden_states is offline but {head.section}.feature_cache_dir is not set")
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
        run.cache = ensure_feature_cache(run, head.feature_spec(cfg, target), settings.feature_cache_dir)
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
    return 0
