"""Export an EAGLE-3 drafter for llama.cpp: the draft as GGUF, the target's GGUF(s) beside it, the serve command.

    result = export_llamacpp("runs/smollm2-135m/eagle3", "exports/smollm2-eagle3-llamacpp")
    print(result.serve["f16"])   # llama-server -m .../target-f16.gguf -md .../draft-f16.gguf --spec-type draft-eagle3 ...

llama.cpp runs EAGLE-3 drafts only (`--spec-type draft-eagle3`); Medusa heads and EAGLE-1 drafters are
refused. The draft goes through llama.cpp's own converter (`convert_hf_to_gguf.py --target-model-dir`)
from the vLLM-layout folder headway writes (export/rules.py: feature scale folded into fc, layers
ascending with fc permuted, the top-level `eagle_aux_hidden_state_layer_ids` always written: llama.cpp
reads only that key, in hidden_states numbering, and falls back to [2, L/2, L-3] without it), into a
temporary folder. Beside it go the target GGUFs (headway/llamacpp_models.py): `f16`, converted from the
prepared checkpoint, gives headway's fp32 greedy output exactly; `q4_1`, the shipped file of a built-in
target, decodes fastest. The written folder is checked (GGUF headers: architecture, feature layers,
sizes, d2t) before it replaces --out, and holds `headway_llamacpp.json` naming the files and commands.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from headway.export.checkpoint import Checkpoint, read_checkpoint
from headway.export.engine_keys import ExportError
from headway.export.folders import ExportResult, check_out, export, write_atomically
from headway.export.rules import check_feature_layers, reduced_vocab
from headway.export.serve import FLASH_ATTN, llamacpp_serve_command
from headway.llamacpp_gguf import read_gguf
from headway.llamacpp_models import SHIPPED, TARGET_KINDS, builtin_of, place, target_gguf

ENGINE = "llamacpp"
# Draft GGUF types. q8_0 by default: a draft step is a large share of a small target's step on a CPU, and
# measured here (an EAGLE-3 drafter on SmolLM2, 5 prompts x 48 tokens, one thread, shared CPU: rough)
# q8_0 drafts accept exactly the tokens f16 drafts do and run as fast or faster; bf16 and f32 drafts
# cost about twice as much per step.
DRAFT_OUTTYPES = ("q8_0", "f16", "bf16", "f32")
MANIFEST = "headway_llamacpp.json"
# Draft settings of the serve command. On this CPU a 2-token forward costs 1.16x a 1-token one and 4
# tokens 1.63x (llama-bench -p 1,2,4 -d 256), and a draft step about 9.5 ms against a 22 ms target step,
# so a draft token is worth verifying only when likely: the chain stops at the first token the draft
# gives probability under DEFAULT_P_MIN (a step left without draft verifies alone), and runs up to
# DEFAULT_N_MAX tokens while it stays confident. Spec-Bench 3 per domain, interleaved
# (docs/results/2026-12-05-smollm2/llamacpp-draft-sweep/): 1 token, no cut 0.99x of plain; 1 / 2 / 3
# tokens at p 0.5 1.07-1.09x / 1.08x / 1.11x; ngram-mod 1.04-1.08x.
DEFAULT_N_MAX = 3
DEFAULT_P_MIN = 0.5
NGRAM = "ngram-mod"  # the n-gram type of the second serve command
# Flash attention off in the serve commands: llama.cpp's default (auto) turns it on for the CPU backend,
# and on this CPU it slows decoding as the context grows (llama-bench f16, 2 threads: tg128 47.0 tokens/s
# at depth 0, 35.1 at depth 256 with it; 44.5 / 42.4 without) and makes a 2-token verify forward cost 1.32x
# a 1-token one instead of 1.10x. Spec-Bench 3 per domain, interleaved
# (docs/results/2026-12-05-smollm2/llamacpp-flash-attn/): plain f16 +11%, plain Q4_1 +17%, and the drafter
# 1.12x of plain f16 with both off against 1.07x with both on. On a GPU build pass --flash-attn auto.
DEFAULT_FLASH_ATTN = "off"


def target_folder(ckpt: Checkpoint, target: str | Path | None) -> Path:
    """The target's checkpoint folder (config.json, tokenizer, weights) the converter reads."""
    from headway.target import servable_target

    folder = Path(target) if target is not None else Path(servable_target(ckpt.target_name))
    if not (folder / "config.json").is_file():
        raise ExportError(
            f"llama.cpp's converter reads the target's config.json and tokenizer from a local folder; "
            f"{folder} has none: pass --target DIR (the target's Hugging Face folder)"
        )
    return folder


def refuse_for_llamacpp(ckpt: Checkpoint) -> list[int]:
    """The feature layers llama.cpp captures for `ckpt`, or an ExportError saying why it cannot run it."""
    if ckpt.method != "eagle3":
        name = {"medusa": "Medusa heads", "eagle1": "an EAGLE-1 drafter"}.get(ckpt.method, ckpt.method)
        raise ExportError(
            f"llama.cpp runs EAGLE-3 drafts only (--spec-type draft-eagle3); {name} cannot be served there: "
            "export it with --to vllm or --to sglang, or train an EAGLE-3 drafter for llama.cpp"
        )
    layers = check_feature_layers(ckpt.own, ENGINE)
    L = int(ckpt.own["num_target_layers"])
    if len(layers) != 3 or not all(1 <= i <= L for i in layers):
        raise ExportError(
            f"feature_layers {layers}: llama.cpp's EAGLE-3 takes exactly 3 target layers, each a layer's input "
            f"1..{L} (hidden_states index; {L} is the last layer's output)"
        )
    return sorted(layers)


def check_ggufs(folder: Path, ckpt: Checkpoint, layers: list[int], draft: str, targets: list[str]) -> None:
    """The converter's output is what llama.cpp must load for this drafter and target."""
    own = ckpt.own
    info = read_gguf(folder / draft)
    meta = info.metadata
    want = {
        "general.architecture": "eagle3",
        "eagle3.target_layers": layers,
        "eagle3.target_hidden_size": int(own["hidden_size"]),
        "eagle3.block_count": 1,
    }
    for key, value in want.items():
        if meta.get(key) != value:
            raise ExportError(
                f"{folder / draft}: GGUF key {key} is {meta.get(key)!r}, the drafter needs {value!r}"
            )
    vp = int(own.get("draft_vocab_size") or own["vocab_size"])
    rows = info.tensors.get("output.weight", ((0, 0), ""))[0][-1]
    if rows != vp or ("d2t" in info.tensors) != reduced_vocab(own):
        raise ExportError(
            f"{folder / draft}: output rows {rows} / d2t {'present' if 'd2t' in info.tensors else 'absent'}; "
            f"the drafter has {vp} draft tokens of {own['vocab_size']}"
        )
    for name in targets:
        t = read_gguf(folder / name).metadata
        arch = t.get("general.architecture")
        if t.get(f"{arch}.block_count") != int(own["num_target_layers"]) or t.get(
            f"{arch}.vocab_size"
        ) != int(own["vocab_size"]):
            raise ExportError(
                f"{folder / name}: {t.get(f'{arch}.block_count')} layers / vocabulary {t.get(f'{arch}.vocab_size')}, "
                f"the drafter's target has {own['num_target_layers']} / {own['vocab_size']}"
            )


def export_llamacpp(
    checkpoint: str | Path | Checkpoint,
    out: str | Path,
    *,
    draft_outtype: str = DRAFT_OUTTYPES[0],
    target_ggufs: tuple[str, ...] | None = None,
    n_max: int = DEFAULT_N_MAX,
    p_min: float = DEFAULT_P_MIN,
    flash_attn: str | None = DEFAULT_FLASH_ATTN,
    target: str | Path | None = None,
    force: bool = False,
    llama=None,
    log=print,
) -> ExportResult:
    """Write the drafter's GGUF and its target's GGUF(s) into `out`; `result.serve[kind]` is the serve command
    with target GGUF `kind`. target_ggufs None: f16, plus the shipped q4_1 for a built-in target."""
    from headway.llamacpp import ensure_llamacpp

    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint)
    out = Path(out)
    check_out(out, force, ckpt.folder)
    layers = refuse_for_llamacpp(ckpt)
    if draft_outtype not in DRAFT_OUTTYPES:
        raise ExportError(f"--draft-outtype {draft_outtype!r}: choose one of {', '.join(DRAFT_OUTTYPES)}")
    if n_max < 1:
        raise ExportError(f"--draft-n-max must be at least 1, got {n_max}")
    if not 0 <= p_min < 1:
        raise ExportError(f"--draft-p-min is a probability in [0, 1), got {p_min}")
    if flash_attn is not None and flash_attn not in FLASH_ATTN:
        raise ExportError(f"--flash-attn {flash_attn!r}: llama.cpp takes one of {', '.join(FLASH_ATTN)}")
    tdir = target_folder(ckpt, target)
    kinds = target_ggufs or (("f16", SHIPPED) if builtin_of(tdir) else ("f16",))
    bad = [k for k in kinds if k not in TARGET_KINDS]
    if bad:
        raise ExportError(f"--target-gguf {bad}: choose from {', '.join(TARGET_KINDS)}")
    llama = llama or ensure_llamacpp(log=log)
    draft = f"draft-{draft_outtype}.gguf"
    targets = {k: f"target-{k}.gguf" for k in kinds}
    sources = {k: target_gguf(tdir, k, llama, log) for k in kinds}  # cached: outside the atomic write
    server = llama.binary("llama-server")
    serve = {
        k: llamacpp_serve_command(
            server, out.resolve() / name, out.resolve() / draft, n_max, p_min, flash_attn=flash_attn
        )
        for k, name in targets.items()
    }
    # The drafter beside llama.cpp's ngram-mod: the fastest lossless configuration measured here (1.12x of
    # plain f16 against 1.07x for either alone, docs/results/2026-12-05-smollm2/llamacpp-eagle3-p05/)
    serve_ngram = {
        k: llamacpp_serve_command(
            server, out.resolve() / name, out.resolve() / draft, n_max, p_min, ngram=NGRAM, flash_attn=flash_attn
        )
        for k, name in targets.items()
    }

    def write(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as work:
            hf = Path(work) / "eagle3-vllm"
            export(ckpt, "vllm", hf, dtype=None)  # the checked vLLM layout, float weights as trained
            llama.convert(hf, tmp / draft, draft_outtype, target_dir=tdir)
        for k, name in targets.items():
            place(sources[k], tmp / name)
        manifest = {
            "method": "eagle3",
            "checkpoint": str(ckpt.folder) if ckpt.folder else None,
            "target": ckpt.target_name,
            "target_folder": str(tdir),
            "feature_layers": layers,
            "draft": draft,
            "draft_outtype": draft_outtype,
            "targets": targets,
            "n_max": n_max,
            "p_min": p_min,
            "flash_attn": flash_attn,
            "serve": serve,
            f"serve_with_{NGRAM}": serve_ngram,
            "llama_cpp": llama.version,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    write_atomically(out, write, lambda tmp: check_ggufs(tmp, ckpt, layers, draft, list(targets.values())))
    notes = [f"serve with target GGUF {k}:\n  {cmd}" for k, cmd in serve.items()]
    notes += [f"the same with {NGRAM} beside the draft (fastest here):\n  {serve_ngram[k]}" for k in serve]
    return ExportResult(out, ENGINE, "eagle3", notes, serve=serve)
