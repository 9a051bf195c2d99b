"""Export trained heads for vLLM, SGLang, llama.cpp or the Hugging Face Hub, checked key by key; or load such folders back.

    python scripts/export.py --checkpoint runs/llama-3.1-8b-instruct/eagle3 --to vllm --out exports/llama-3.1-8b-instruct/eagle3-vllm
    python scripts/export.py --checkpoint runs/llama-3.1-8b-instruct/eagle3 --to sglang --out exports/llama-3.1-8b-instruct/eagle3-sglang
    python scripts/export.py --checkpoint runs/llama-3.1-8b-instruct/medusa --to vllm --engine-version 0.32 --out exports/llama-3.1-8b-instruct/medusa-vllm
    python scripts/export.py --checkpoint runs/smollm2-135m/medusa --to hf --out exports/smollm2-medusa [--report FILE]
    python scripts/export.py --checkpoint runs/smollm2-135m/eagle3 --to llamacpp --out exports/smollm2-eagle3-llamacpp \
        [--draft-outtype q8_0] [--target-gguf f16,q4_1] [--draft-n-max 1] [--draft-p-min P] [--flash-attn off]
    python scripts/export.py --from vllm --checkpoint exports/x-eagle3-vllm                 # check it against the table
    python scripts/export.py --from vllm --checkpoint exports/x-eagle3-vllm --to hf --out runs/x-back [--target NAME]

--to vllm|sglang writes config.json + model.safetensors in the engine's names and checks the folder
against export/engine_keys.py's table for (engine, method) and what the release range loads
(export/releases.py; --engine-version picks it, default the newest checked: vLLM 0.33, SGLang 0.5.23):
a missing, unexpected or misshapen key is an error naming it, and a method the release lacks (Medusa on
SGLang or vLLM 0.33), a drafter it cannot reproduce or load (reduced-vocabulary Medusa on vLLM
0.12-0.32) is refused naming the release and the reason. Weights are written in the target's dtype
(--dtype overrides; keep: the checkpoint's). --to hf writes headway's own folder with a model card
(README.md) for `push_to_hub`. --from vllm|sglang reads an engine folder back (EAGLE: --target when the
folder does not name its target's layer count). --to llamacpp writes an EAGLE-3 draft as GGUF through
llama.cpp's converter, the target's GGUF(s) beside it, and prints the llama-server command
(export/llamacpp.py; builds llama.cpp into the cache on first use). --out must be empty or absent
unless --force; it is replaced only after the new folder passed its check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from headway.cli import run_main
from headway.export.check import check_folder, read_config
from headway.export.checkpoint import read_checkpoint
from headway.export.engine_keys import ExportError, method_of_config, table_for
from headway.export.folders import TARGET_DTYPE, TARGETS, export
from headway.export.llamacpp import (
    DEFAULT_FLASH_ATTN,
    DEFAULT_N_MAX,
    DEFAULT_P_MIN,
    DRAFT_OUTTYPES,
    ENGINE,
    export_llamacpp,
)
from headway.export.releases import release_of_folder
from headway.export.rules import to_headway
from headway.export.serve import FLASH_ATTN, serve_command

DTYPES = {
    TARGET_DTYPE: TARGET_DTYPE,
    "keep": None,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _target_config(name: str | None):
    if name is None:
        return None
    from transformers import AutoConfig

    from headway.target import resolve_target

    return AutoConfig.from_pretrained(resolve_target(name))  # the config only: no weights are loaded


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--checkpoint", required=True, help="a headway heads folder (or, with --from, an engine folder)"
    )
    p.add_argument("--to", choices=(*TARGETS, ENGINE), help="the format to write; omitted with --from: only check")
    p.add_argument("--out", help="the folder to write (must be empty or absent unless --force)")
    p.add_argument("--from", dest="source", choices=("headway", "vllm", "sglang"), default="headway")
    p.add_argument(
        "--target",
        help="EAGLE folders from an engine: the target (HF id, folder or built-in name); llamacpp: the target's "
        "local folder, when the checkpoint's target is not one here",
    )
    p.add_argument(
        "--draft-outtype", choices=DRAFT_OUTTYPES, default=DRAFT_OUTTYPES[0], help="llamacpp: the draft GGUF's type"
    )
    p.add_argument(
        "--target-gguf",
        help="llamacpp: target GGUFs to write, comma-separated from f16, f32, bf16, q8_0 (converted) and q4_1 "
        "(a built-in's shipped file); default f16 (+ q4_1 for a built-in)",
    )
    p.add_argument("--draft-n-max", type=int, default=DEFAULT_N_MAX, help="llamacpp: draft tokens per step")
    p.add_argument(
        "--draft-p-min",
        type=float,
        default=DEFAULT_P_MIN,
        help="llamacpp: drop draft tokens under this draft probability (the serve command's --spec-draft-p-min)",
    )
    p.add_argument(
        "--flash-attn",
        choices=FLASH_ATTN,
        default=DEFAULT_FLASH_ATTN,
        help="llamacpp: the serve commands' -fa (default off: faster on the CPU here; auto for a GPU build)",
    )
    p.add_argument("--report", help="hf: the report.json to put in the model card (default: found beside)")
    p.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=TARGET_DTYPE,
        help="floating weights: the target's dtype (default; hf: the checkpoint's), keep, or a dtype",
    )
    p.add_argument(
        "--engine-version",
        help="vllm/sglang: the engine release to write for, e.g. 0.32.0 or a range (<=0.11, 0.12-0.32, 0.33, "
        "0.5.23); default: the newest checked",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    args = p.parse_args(argv)
    if args.to and not args.out:
        p.error("--to needs --out")
    if not args.to and args.source == "headway":
        p.error("--to is required (omit it only with --from vllm|sglang, to check a folder)")

    try:
        if args.source == "headway":
            ckpt = read_checkpoint(args.checkpoint)
        else:
            folder = Path(args.checkpoint)
            release = None
            if args.engine_version:
                from headway.export.releases import release_for

                release = release_for(args.source, args.engine_version)
            dims = check_folder(folder, args.source, release=release)
            config = read_config(folder)
            method = method_of_config(config)
            table = table_for(args.source, method)
            release = release or release_of_folder(config, args.source, method, dims, str(folder))
            print(
                f"{folder} matches the {args.source} {method} key table ({len(table.expected(dims))} keys; {dims}) "
                f"and loads in {release.label}"
            )
            if not args.to:
                return 0
            ckpt = to_headway(folder, args.source, _target_config(args.target))
        if args.to == ENGINE:
            kinds = tuple(k.strip() for k in args.target_gguf.split(",")) if args.target_gguf else None
            result = export_llamacpp(
                ckpt,
                args.out,
                draft_outtype=args.draft_outtype,
                target_ggufs=kinds,
                n_max=args.draft_n_max,
                p_min=args.draft_p_min,
                flash_attn=args.flash_attn,
                target=args.target,
                force=args.force,
                log=lambda m: print(m, file=sys.stderr),
            )
            print(f"wrote {result.out} (EAGLE-3 draft and target GGUFs for llama.cpp)")
            for note in result.notes:
                print(f"note: {note}")
            return 0
        result = export(
            ckpt,
            args.to,
            args.out,
            force=args.force,
            dtype=DTYPES[args.dtype],
            report=args.report,
            engine_version=args.engine_version,
        )
    except (ExportError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    print(f"wrote {result.out} ({result.method} for {result.engine})")
    if result.engine != "hf":
        print(f"  for {result.release.label}; its loader facts from:")
        for s in (*table_for(result.engine, result.method).sources, *result.release.sources):
            print(f"  checked against {s.repo} {s.path} @ {s.commit[:12]}")
        heads = ckpt.own.get("num_heads", 5)
        print(
            "serve it with:\n  "
            + serve_command(result.method, result.engine, str(result.out), ckpt.target_name, heads)
        )
    for note in result.notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
