"""The one training loop: any head objective, features online or from a cache, through accelerate.

    accelerator = make_accelerator(cfg.train)
    result = train(objective, ds["train"], ds["validation"], cfg.train, accelerator,
                   feature_source=OnlineFeatures(target, objective.feature_spec()), pad_id=tok.pad_token_id)

The objective is an `nn.Module` implementing `heads.base.HeadObjective` (`feature_spec`, `training_loss`);
optionally `param_groups(lr)` (groups with their own lr / start step), `set_step(step)` (told before every
optimizer step), `find_unused_parameters` (DDP) and `save_pretrained(folder)` (the final export).
The loop never asks which head it holds.

`feature_source(batch) -> TargetFeatures` is `data.features.OnlineFeatures` (a forward of the frozen
target) or `data.features.BatchFeatures` (tensors a caching `collate_fn` put in the batch); None when the
objective runs the target itself (Medusa-2). Every batch also carries `row_index` (dataset row ids), so a
collate function can look cached features up by row.

Accelerate gives devices, mixed precision, DDP / DeepSpeed / FSDP (gloo on CPU), trackers; this module
adds the deterministic data order (`train/data_order.py`), checkpoints with exact resume
(`train/checkpoint.py`), AdamW + cosine (`train/optim.py`), validation, a stop on non-finite loss.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import NoReturn

import torch
from torch import nn
from tqdm.auto import tqdm

from headway.cli import UserError
from headway.config import TrainConfig
from headway.data.dataset import default_collate, row_lengths, select_rows
from headway.distributed import wants_cpu
from headway.features import TargetFeatures
from headway.memory import CreepBound, keep_freed_cpu_memory, peak_memory
from headway.packed import cpu_has_bf16_kernels
from headway.train.checkpoint import (
    TrainerState,
    check_holds_weights,
    checkpoint_dir,
    clean_staging,
    latest_checkpoint,
    mark_complete,
    publish,
    read_state,
    rotate,
    staging_dir,
    trainable_signature,
    write_state,
)
from headway.train.data_order import DataOrder, eval_batches
from headway.train.metric_means import WeightedMeans
from headway.train.optim import build_optimizer, build_scheduler, default_param_groups
from headway.train.resume import (
    applied_note,
    check_settings,
    choose_checkpoint,
    run_settings,
    truncate_log,
    write_settings,
)

FeatureSource = Callable[[dict[str, torch.Tensor]], TargetFeatures]
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "train_summary.json"


class NonFiniteLossError(UserError):
    """The loss (or gradient norm) became NaN/inf; the run stopped without saving over good checkpoints."""


@dataclass
class TrainResult:
    step: int
    output_dir: Path
    val_metrics: dict[str, float] = field(default_factory=dict)
    resumed_from: Path | None = None
    peak_memory: dict[str, float] = field(default_factory=dict)  # GB: resident (CPU), and CUDA allocated


# ---------------------------------------------------------------- setup


def resolve_mixed_precision(spec: str, cpu: bool) -> str:
    """`auto`: bf16 where bf16 matmuls are fast (CUDA with bf16; a CPU with oneDNN bf16 kernels), else "no".
    On an AVX2-only CPU bf16 autocast would run every matmul 4-8x slower than fp32 (headway.packed)."""
    if spec != "auto":
        return spec
    if cpu or not torch.cuda.is_available():
        return "bf16" if cpu_has_bf16_kernels() else "no"
    return "bf16" if torch.cuda.is_bf16_supported() else "no"


def make_accelerator(cfg: TrainConfig, find_unused_parameters: bool = False, device: str = "auto"):
    """An Accelerator for this run: precision and trackers from the YAML; devices from `accelerate launch`.

    Without an accelerator (or with target.device cpu) accelerate is told cpu=True: only then do
    processes launched together form a gloo process group instead of each training alone.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration

    cpu = wants_cpu(device)
    if cpu:
        # Reuse freed activations instead of faulting them in again each step (EAGLE-3 recipe: 17% faster).
        keep_freed_cpu_memory()
    if cpu and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        # Under accelerate, DeepSpeed on CPU leaves every process believing it is rank 0 of 1 (checked with
        # accelerate 1.15 / deepspeed 0.19): run the same job as plain DDP over gloo instead, and say so.
        print("headway: DeepSpeed has no working CPU path under accelerate; running DDP over gloo instead")

    if cfg.report_to == "wandb":
        # Never ask for a login: offline unless the YAML (or the environment) says otherwise; `wandb sync` later.
        os.environ.setdefault("WANDB_MODE", cfg.wandb_mode)
        os.environ.setdefault("WANDB_SILENT", "true")
    return Accelerator(
        cpu=cpu,
        mixed_precision=resolve_mixed_precision(cfg.mixed_precision, cpu),
        gradient_accumulation_steps=cfg.grad_accum,
        step_scheduler_with_optimizer=False,  # stepped once per optimizer step, whatever the world size
        log_with=None if cfg.report_to == "none" else cfg.report_to,
        project_config=ProjectConfiguration(project_dir=cfg.output_dir, logging_dir=cfg.output_dir),
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters)],
    )


class ObjectiveModule(nn.Module):
    """What DDP/DeepSpeed wrap: forward(batch, features) -> {"loss", metrics...} through the objective."""

    def __init__(self, objective: nn.Module) -> None:
        super().__init__()
        self.objective = objective

    def forward(self, batch: dict[str, torch.Tensor], features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Features travel as a plain dict under their feature_key names: DDP handles that on every backend.
        out = self.objective.training_loss(batch, TargetFeatures.from_dict(features))
        return {"loss": out.loss, **out.metrics}


# ---------------------------------------------------------------- the loop


def train(
    objective: nn.Module,
    train_rows,
    val_rows,
    cfg: TrainConfig,
    accelerator,
    *,
    pad_id: int,
    feature_source: FeatureSource | None = None,
    collate_fn: Callable[[list[dict]], dict[str, torch.Tensor]] | None = None,
    run_config: dict | None = None,
    on_step_end: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train `objective` on `train_rows` (datasets.Dataset with input_ids, loss_mask); see the module docstring."""
    for name, ds in (("train", train_rows), ("validation", val_rows)):
        if ds is not None and not {"input_ids", "loss_mask"} <= set(ds.column_names):
            raise ValueError(f"the {name} split needs columns input_ids and loss_mask, has {ds.column_names}")
    collate_fn = collate_fn or default_collate(pad_id, cfg.max_seq_len)
    run = _Run(objective, train_rows, val_rows, cfg, accelerator, feature_source, collate_fn, run_config)
    while run.state.step < run.total_steps:
        run.step()
        if on_step_end is not None:
            on_step_end(run.state.step)
    return run.finish()


class _Run:
    """One training run: set up (prepare, resume), optimizer steps, validation, checkpoints, the end."""

    def __init__(self, objective, train_rows, val_rows, cfg: TrainConfig, accelerator, feature_source, collate_fn, run_config):
        self.objective, self.train_rows, self.val_rows, self.cfg = objective, train_rows, val_rows, cfg
        self.accelerator, self.feature_source, self.collate_fn = accelerator, feature_source, collate_fn
        self.out_dir = Path(cfg.output_dir)
        self.ckpt_root = self.out_dir / "checkpoints"
        self.main = accelerator.is_main_process
        if self.main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        self.order = DataOrder(row_lengths(train_rows, cfg.max_seq_len), cfg.batch_size, self.world, self.rank, cfg.seed, cfg.group_by_length)
        if cfg.max_steps is not None:
            self.total_steps = cfg.max_steps
        else:
            self.total_steps = max(1, math.ceil(cfg.epochs * self.order.batches_per_epoch / cfg.grad_accum))
        self._prepare()
        self.run_config = run_config or {"train": asdict(cfg)}
        self.settings = run_settings(self.run_config, train_rows)
        self.state = TrainerState(signature=self.signature)
        self.resumed_from = self._resume()
        self._start_logs(run_config is not None)

        self.model.train()
        self.epoch_batches = self.order.batches(self.state.epoch)
        self.interval = WeightedMeans()  # metrics since the last train log
        self.interval_tokens, self.t_start = 0, time.perf_counter()
        self.step_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.bar = tqdm(total=self.total_steps, initial=self.state.step, disable=not self.main, desc="train", dynamic_ncols=True)
        self.memory_bound = CreepBound()

    # ------------------------------------------------------------ set-up

    def _prepare(self) -> None:
        cfg, accelerator, objective = self.cfg, self.accelerator, self.objective
        module = ObjectiveModule(objective)
        groups = objective.param_groups(cfg.lr) if hasattr(objective, "param_groups") else default_param_groups(module, cfg.lr)
        optimizer = build_optimizer(groups, cfg)
        scheduler = build_scheduler(optimizer, groups, self.total_steps, cfg.warmup_ratio)
        if accelerator.state.deepspeed_plugin is not None:
            # DeepSpeed sizes its buffers from these; our batches come from our own data order, not a prepared loader.
            ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
            ds_config["train_micro_batch_size_per_gpu"] = cfg.batch_size
            ds_config["gradient_accumulation_steps"] = cfg.grad_accum
            ds_config["gradient_clipping"] = cfg.grad_clip
            ds_config["train_batch_size"] = cfg.batch_size * cfg.grad_accum * self.world
        self.model, self.optimizer, self.scheduler = accelerator.prepare(module, optimizer, scheduler)
        self.signature = trainable_signature(module)
        # Named on the unwrapped module: accelerate saves and loads that one, not the DDP wrapper (whose names
        # gain "module.", which once emptied every checkpoint a multi-process launch wrote).
        self.trainable_keys = trainable_keys = {n for n, p in module.named_parameters() if p.requires_grad}

        def keep_trainable_only(_models, weights, _output_dir):
            # A frozen target inside the objective (Medusa-2) is not copied into every checkpoint.
            for w in weights:
                for k in [k for k in w if k not in trainable_keys]:
                    del w[k]
                if missing := trainable_keys - w.keys():
                    raise RuntimeError(f"checkpoint would lack {len(missing)} trainable weights, e.g. {sorted(missing)[:3]}")

        accelerator.register_save_state_pre_hook(keep_trainable_only)

    def _resume(self) -> Path | None:
        """Load the newest good checkpoint (train.resume=auto); returns where it came from, or None."""
        accelerator = self.accelerator
        resumed_from = None
        if self.cfg.resume == "auto":
            resumed_from, damaged = choose_checkpoint(self.ckpt_root)
            for line in damaged:
                accelerator.print(f"warning: {line}: falling back to {resumed_from} (train.resume=never starts over)")
        if resumed_from is None:
            return None
        applied = check_settings(resumed_from, self.settings, self.out_dir)
        if applied:
            accelerator.print(applied_note(resumed_from, applied))
        saved = read_state(resumed_from)
        if saved.signature != self.signature:
            raise ValueError(
                f"checkpoint {resumed_from} holds other trainable weights (signature {saved.signature}, this run "
                f"{self.signature}): use another train.output_dir or train.resume=never"
            )
        # Only trainable weights are saved, so the module load is not strict (DeepSpeed names the flag its own way).
        not_strict = {"load_module_strict": False} if accelerator.state.deepspeed_plugin is not None else {"strict": False}
        check_holds_weights(resumed_from, self.trainable_keys)
        accelerator.load_state(str(resumed_from), **not_strict)
        self.state = saved
        accelerator.print(f"resumed from {resumed_from} at step {saved.step}")
        return resumed_from

    def _start_logs(self, write_run_config: bool) -> None:
        cfg, accelerator = self.cfg, self.accelerator
        if cfg.report_to != "none":
            accelerator.init_trackers(
                cfg.wandb_project,
                config=_flat_config(self.run_config),
                init_kwargs={"wandb": {"dir": str(self.out_dir), "name": self.out_dir.name}},
            )
        if self.main and write_run_config:
            (self.out_dir / "run_config.json").write_text(json.dumps(self.run_config, indent=2, default=str) + "\n")
        if self.main:
            clean_staging(self.ckpt_root)
            truncate_log(self.out_dir / METRICS_FILE, self.state.step)  # later steps are trained, and logged, again
        self.rows_log = (self.out_dir / f"rows_rank{self.rank}.jsonl") if cfg.log_row_ids else None
        if self.rows_log is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            truncate_log(self.rows_log, self.state.step)

    # ------------------------------------------------------------ one optimizer step

    def step(self) -> None:
        """grad_accum micro-batches, one optimizer step; then the train log, validation and checkpoint due."""
        cfg, state = self.cfg, self.state
        if hasattr(self.objective, "set_step"):
            self.objective.set_step(state.step)
        grad_norm = None
        for _ in range(cfg.grad_accum):
            norm = self._micro_step(self._next_batch())
            grad_norm = norm if norm is not None else grad_norm
        state.step += 1
        self.bar.update(1)
        self.memory_bound.after_step()  # kept freed memory fragments across shapes: give it back once it creeps
        last = state.step == self.total_steps
        if state.step % max(1, cfg.log_every) == 0 or last:
            self._log_interval(grad_norm)
        if cfg.eval_every and state.step % cfg.eval_every == 0 and not last:
            self.log(self.evaluate(), "validation")
        if cfg.save_every and state.step % cfg.save_every == 0 and not last:
            self.save_checkpoint()

    def _next_batch(self) -> list[int]:
        state = self.state
        if state.batch_in_epoch >= len(self.epoch_batches):
            state.epoch, state.batch_in_epoch = state.epoch + 1, 0
            self.epoch_batches = self.order.batches(state.epoch)
        idx = self.epoch_batches[state.batch_in_epoch]
        state.batch_in_epoch += 1
        if self.rows_log is not None:
            with self.rows_log.open("a") as f:
                f.write(json.dumps({"step": state.step + 1, "rows": idx}) + "\n")
        return idx

    def _micro_step(self, idx: list[int]) -> torch.Tensor | None:
        """Forward and backward over rows idx; at the last micro-batch of a step, clip and step the
        optimizer. Returns the gradient norm when it clipped one."""
        cfg, accelerator, state = self.cfg, self.accelerator, self.state
        batch = self._to_device(self.collate_fn(select_rows(self.train_rows, idx)))
        feats = self.feature_source(batch) if self.feature_source is not None else TargetFeatures()
        grad_norm = None
        with accelerator.accumulate(self.model):
            outputs = self.model(batch, feats.as_dict())
            loss = outputs["loss"]
            if not self._all_finite(loss):
                self._stop(f"loss is {loss.item()} at step {state.step + 1} (epoch {state.epoch}, rows {idx})")
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                if cfg.grad_clip and cfg.grad_clip > 0:
                    grad_norm = accelerator.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                if grad_norm is not None and cfg.mixed_precision != "fp16" and not self._all_finite(grad_norm):
                    self._stop(f"gradient norm is {float(grad_norm)} at step {state.step + 1}")
                self.step_lrs = [g["lr"] for g in self.optimizer.param_groups]  # the lr this step used
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.interval.add(outputs)
        self.interval_tokens += int(batch["attention_mask"].sum())
        return grad_norm

    def _stop(self, what: str) -> NoReturn:
        """A non-finite loss or gradient: end without saving over the good checkpoints."""
        self.bar.close()
        self.accelerator.end_training()
        ckpt = latest_checkpoint(self.ckpt_root)
        last_good = f"the last good checkpoint is {ckpt}" if ckpt else "no checkpoint was saved yet"
        raise NonFiniteLossError(f"{what}; stopped without saving: {last_good}")

    def _log_interval(self, grad_norm: torch.Tensor | None) -> None:
        accelerator, state = self.accelerator, self.state
        means = self.interval.means(partial(_sum_over_ranks, accelerator))  # micro-batches weighted by their counts
        tokens = _reduce_sum(accelerator, self.interval_tokens)
        state.tokens_seen += tokens
        metrics = {f"train/{k}": v for k, v in means.items()}
        metrics["train/tokens_per_s"] = tokens / max(time.perf_counter() - self.t_start, 1e-9)
        metrics["train/epoch"] = state.epoch + state.batch_in_epoch / max(1, len(self.epoch_batches))
        for i, lr in enumerate(self.step_lrs):
            metrics[f"train/lr_group{i}"] = lr
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        self.log(metrics, "train")
        self.bar.set_postfix(loss=f"{metrics['train/loss']:.4f}", lr=f"{self.step_lrs[0]:.2e}")
        self.interval, self.interval_tokens, self.t_start = WeightedMeans(), 0, time.perf_counter()

    # ------------------------------------------------------------ validation, logs, checkpoints

    def evaluate(self) -> dict[str, float]:
        cfg, val_rows = self.cfg, self.val_rows
        if val_rows is None or len(val_rows) == 0:
            return {}
        n_rows = len(val_rows) if cfg.max_eval_rows is None else min(len(val_rows), cfg.max_eval_rows)
        val_lengths = row_lengths(val_rows.select(range(n_rows)), cfg.max_seq_len)
        # Every row once, each batch's means weighted by what they count (train/metric_means.py): the figure
        # is the one over all validation positions, as head_accuracy scores it.
        means = WeightedMeans()
        self.model.eval()
        with torch.no_grad():
            for idx in eval_batches(val_lengths, cfg.batch_size, self.world, self.rank):
                batch = self._to_device(self.collate_fn(select_rows(val_rows, idx or [0])))
                feats = self.feature_source(batch) if self.feature_source is not None else TargetFeatures()
                # an empty share still runs a forward (ZeRO-3 gathers weights in it) that counts for nothing
                means.add(self.model(batch, feats.as_dict()), scale=1.0 if idx else 0.0)
        self.model.train()
        return {f"val/{k}": v for k, v in means.means(partial(_sum_over_ranks, self.accelerator)).items()}

    def log(self, metrics: dict[str, float], kind: str) -> None:
        if self.cfg.report_to != "none":
            self.accelerator.log(metrics, step=self.state.step)
        if self.main:
            with (self.out_dir / METRICS_FILE).open("a") as f:
                f.write(json.dumps({"step": self.state.step, "kind": kind, **metrics}) + "\n")

    def save_checkpoint(self) -> None:
        accelerator, state = self.accelerator, self.state
        staging = staging_dir(self.ckpt_root, state.step)  # renamed to step-N when complete: no half step-N
        accelerator.save_state(str(staging))
        accelerator.wait_for_everyone()
        if self.main:
            write_state(staging, state)
            write_settings(staging, self.settings)
            mark_complete(staging)
            publish(staging, checkpoint_dir(self.ckpt_root, state.step))
            rotate(self.ckpt_root, self.cfg.keep_checkpoints, current=state.step)
        accelerator.wait_for_everyone()

    def finish(self) -> TrainResult:
        """Validate, checkpoint and export the trained heads; write the summary."""
        accelerator = self.accelerator
        self.bar.close()
        val_metrics = self.evaluate()
        self.log(val_metrics, "validation")
        self.save_checkpoint()
        peak = peak_memory(accelerator.device)
        if self.main:
            accelerator.unwrap_model(self.model).objective.save_pretrained(self.out_dir)
            summary = {"step": self.state.step, "tokens_seen": self.state.tokens_seen, "world_size": self.world, **val_metrics}
            summary.update({f"peak_{k}_gb": v for k, v in peak.items()})
            if self.memory_bound.steps:  # CPU with kept memory: how often fragmentation forced a release
                summary["memory_releases"] = self.memory_bound.releases
                summary["memory_settled_gb"] = round(self.memory_bound.settled_gb, 3)
            (self.out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
            accelerator.print("validation: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(val_metrics.items())))
        accelerator.wait_for_everyone()
        accelerator.end_training()
        return TrainResult(self.state.step, self.out_dir, val_metrics, self.resumed_from, peak)

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    def _all_finite(self, value: torch.Tensor) -> bool:
        flag = torch.isfinite(value.detach().float()).all().reshape(1).to(self.accelerator.device)
        return bool(self.accelerator.gather(flag.int()).all()) if self.world > 1 else bool(flag)


# ---------------------------------------------------------------- helpers


def _sum_over_ranks(accelerator, values: dict) -> dict:
    """Each scalar summed over ranks, in fp32 (one collective for all of them)."""
    if not values:
        return {}
    keys = sorted(values)  # every rank reports the same keys, so every rank stacks them in the same order
    t = torch.stack([torch.as_tensor(values[k], dtype=torch.float32).to(accelerator.device) for k in keys])
    if accelerator.num_processes > 1:
        t = accelerator.reduce(t, reduction="sum")
    return {k: float(v) for k, v in zip(keys, t.tolist(), strict=True)}


def _reduce_sum(accelerator, value: int) -> int:
    """An integer summed over ranks, exactly (fp32 would round token counts past 2**24)."""
    if accelerator.num_processes == 1:
        return value
    return int(accelerator.reduce(torch.tensor([value], device=accelerator.device), reduction="sum").item())


def _flat_config(d: dict, prefix: str = "") -> dict:
    flat = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flat_config(v, key + "."))
        else:
            flat[key] = v if isinstance(v, int | float | str | bool) or v is None else str(v)
    return flat
