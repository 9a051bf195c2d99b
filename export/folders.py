"""Write export folders (checked, atomically) and load engine folders back into headway.

    from headway.export.folders import export, load_exported
    export("runs/llama-3.1-8b-instruct/eagle3", to="vllm", out="exports/llama-3.1-8b-instruct/eagle3-vllm")
    export("runs/x/medusa", to="vllm", out="exports/x-medusa-vllm-0.11", engine_version="0.11")
    drafter = load_exported("exports/llama-3.1-8b-instruct/eagle3-vllm", "vllm", target)  # same draft logits
    python scripts/export.py --checkpoint runs/smollm2-135m/eagle3 --to sglang --out exports/smollm2-eagle3-sglang

An engine folder is config.json + model.safetensors exactly as export/engine_keys.py's table for the
(engine, method) says, made by the rule of export/rules.py. It is written under a temporary name beside
--out, checked against the table, and only then renamed into place, so a refused or killed export
leaves --out as it was. config.json also carries a `headway_export` block (the source's headway
config and the release range it was written for; engines ignore it). `engine_version` picks the
release range (export/releases.py; default: the newest checked). Engine folders hold the weights in the
target's dtype (export/checkpoint.py `target_dtype`; SGLang would turn a float32 draft into float16
under `--dtype auto` beside a bfloat16 target) unless `dtype` says otherwise. `hf` writes headway's own
folder with a model card (export/model_card.py), in the checkpoint's own dtype unless `dtype` is given.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headway.export.check import check_folder, read_config, weight_header
from headway.export.checkpoint import (
    Checkpoint,
    method_of_headway,
    read_checkpoint,
    target_dtype,
    write_headway,
)
from headway.export.engine_keys import CONFIG_FILE, WEIGHTS_FILE, ExportError, method_of_config
from headway.export.releases import release_for
from headway.export.rules import check_layer_config, engine_files, expected_dims, to_headway
from headway.heads.eagle import load_drafter
from headway.heads.medusa import MedusaHeads

TARGETS = ("vllm", "sglang", "hf")
TARGET_DTYPE = "target"  # `dtype` default of engine exports: the target's own dtype
# Files of a training run that travel with an `hf` export (the rest, checkpoints/, stays behind).
RUN_FILES = ("run_config.json", "train_summary.json")


@dataclass
class ExportResult:
    out: Path
    engine: str
    method: str
    notes: list[str] = field(default_factory=list)  # what the user must know (printed by the CLI)
    release: object | None = None  # export/releases.py Release the folder was checked for (engines only)
    serve: dict[str, str] = field(default_factory=dict)  # llamacpp: target GGUF kind -> serve command


def resolve_dtype(ckpt: Checkpoint, dtype) -> tuple[torch.dtype | None, str | None]:
    """(the dtype to write, a note saying why); `dtype` "target": the target's, None: the checkpoint's own."""
    if dtype != TARGET_DTYPE:
        return dtype, None
    found, where = target_dtype(ckpt)
    if found is None:
        return None, "the target's dtype is not known here (no config.json of it): weights keep the checkpoint's dtype"
    return found, f"weights in {str(found).removeprefix('torch.')}, the target's dtype (from {where}); --dtype overrides"


def cast_floats(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Floating weights to `dtype`; the int64/bool maps (d2t, t2d, token_map) stay as they are."""
    if dtype is None:
        return state
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def check_out(out: Path, force: bool, source: Path | None) -> None:
    if source is not None:
        o, s = out.resolve(), source.resolve()
        if o == s or o in s.parents:
            raise ExportError(f"--out {out} is the checkpoint folder or holds it: choose another folder")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} is not empty: choose another folder, or pass --force to replace it")


def _public(folder: Path) -> None:
    """The umask's permissions, not mkdtemp's 0700: a serving engine may run as another user."""
    mask = os.umask(0)
    os.umask(mask)
    for p in [folder, *folder.rglob("*")]:
        p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def write_atomically(out: Path, write, check) -> None:
    """write(tmp) then check(tmp) in a temporary folder beside `out`; only a checked folder replaces `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        _public(tmp)
        check(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def export(
    checkpoint: str | Path | Checkpoint,
    to: str,
    out: str | Path,
    force: bool = False,
    dtype: torch.dtype | str | None = TARGET_DTYPE,
    report: str | Path | None = None,
    engine_version: str | None = None,
) -> ExportResult:
    """Write `checkpoint` (a headway folder, or a Checkpoint from to_headway) for `to` into `out`.

    dtype: "target" (engines: the target's dtype; hf: the checkpoint's), a torch dtype, or None (keep).
    engine_version: a release (0.30.1) or range name (0.12-0.32) of `to`; None: the newest checked.
    """
    from safetensors.torch import save_file

    if to not in TARGETS:
        raise ExportError(f"--to {to!r}: choose one of {', '.join(TARGETS)}")
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    out = Path(out)
    check_out(out, force, ckpt.folder)
    if to == "hf":
        return _export_hf(ckpt, out, None if dtype == TARGET_DTYPE else dtype, report)

    release = release_for(to, engine_version)
    config, state, notes = engine_files(ckpt, to, release)
    dtype, why = resolve_dtype(ckpt, dtype)
    notes += [why] if why else []
    state = cast_floats(state, dtype)
    written = next(v.dtype for v in state.values() if v.is_floating_point())
    config["torch_dtype"] = config["dtype"] = str(written).removeprefix("torch.")  # one dtype, the file's
    want = expected_dims(ckpt)

    def write(tmp: Path) -> None:
        save_file(
            {k: v.contiguous() for k, v in state.items()}, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"}
        )
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str) + "\n")

    write_atomically(out, write, lambda tmp: check_folder(tmp, to, ckpt.method, expect=want, release=release))
    return ExportResult(out, to, ckpt.method, notes, release)


def _export_hf(ckpt: Checkpoint, out: Path, dtype, report) -> ExportResult:
    from headway.export.model_card import find_report, model_card

    state = cast_floats(ckpt.state, dtype)
    report_path = find_report(ckpt.folder, report)
    run_files = [ckpt.folder / n for n in RUN_FILES if ckpt.folder and (ckpt.folder / n).is_file()]
    lora = ckpt.folder / "lora" if ckpt.folder and (ckpt.folder / "lora").is_dir() else None
    notes = [f"model card with the measured speed from {report_path}"] if report_path else []
    if report_path is None:
        notes.append("no report.json found beside the checkpoint: the model card has no measured speed")

    def write(tmp: Path) -> None:
        write_headway(Checkpoint(ckpt.method, ckpt.config, state), tmp)
        for f in run_files:
            shutil.copy2(f, tmp / f.name)
        if lora is not None:
            shutil.copytree(lora, tmp / "lora")
        if report_path is not None:
            shutil.copy2(report_path, tmp / "report.json")
        (tmp / "README.md").write_text(model_card(ckpt, report_path))

    def check(tmp: Path) -> None:
        method_of_headway(read_config(tmp), str(tmp / CONFIG_FILE))
        have = weight_header(tmp / WEIGHTS_FILE)
        if set(have) != set(state):
            diff = sorted(set(have) ^ set(state))
            raise ExportError(f"{tmp / WEIGHTS_FILE}: keys differ from the checkpoint's: {diff}")
        for k, v in state.items():
            if have[k][0] != tuple(v.shape):
                raise ExportError(
                    f"{tmp / WEIGHTS_FILE}: key {k!r} has shape {list(have[k][0])}, the checkpoint {list(v.shape)}"
                )

    write_atomically(out, write, check)
    return ExportResult(out, "hf", ckpt.method, notes)


def load_exported(folder: str | Path, engine: str, target=None, device=None, dtype=None):
    """An engine folder back as a headway object (MedusaHeads, Eagle1Drafter or Eagle3Drafter).

    EAGLE needs the target (shared embedding, lm_head, layer class); Medusa checks it when given.
    Loading back reads the engine's own keys, plus the target for what they do not say.
    """
    folder = Path(folder)
    if method_of_config(read_config(folder)) != "medusa":
        if target is None:
            raise ExportError(f"{folder}: loading an EAGLE drafter needs its target")
        check_layer_config(folder, read_config(folder), target)
    ckpt = to_headway(folder, engine, target.config if target is not None else None)
    with tempfile.TemporaryDirectory() as tmp:
        write_headway(ckpt, Path(tmp))
        if ckpt.method == "medusa":
            return MedusaHeads.from_pretrained(tmp, target=target, device=device, dtype=dtype)
        return load_drafter(tmp, target, device=device, dtype=dtype)
