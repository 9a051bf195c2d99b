"""How to serve an exported folder: the engine's command line.

    print(serve_command("eagle3", "vllm", "exports/x-eagle3-vllm", "meta-llama/Llama-3.1-8B-Instruct"))
    print(llamacpp_serve_command("llama-server", "target-f16.gguf", "draft-f16.gguf", n_max=1, p_min=0.4))
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from headway.target import servable_target


def serve_command(method: str, engine: str, folder: str, target: str, num_heads: int = 5) -> str:
    """The engine command line that serves `target` with the exported draft in `folder`."""
    target = servable_target(target)  # a built-in name means nothing to an engine: its folder or Hub id
    if engine == "vllm":
        name = {"medusa": "medusa", "eagle1": "eagle", "eagle3": "eagle3"}[method]
        k = num_heads if method == "medusa" else 3
        spec = json.dumps({"method": name, "model": folder, "num_speculative_tokens": k})
        return f"vllm serve {target} --speculative-config '{spec}'"
    algo = {"eagle1": "EAGLE", "eagle3": "EAGLE3"}[method]
    return (
        f"python -m sglang.launch_server --model-path {target} --speculative-algorithm {algo} "
        f"--speculative-draft-model-path {folder} --speculative-num-steps 3 --speculative-eagle-topk 4 "
        "--speculative-num-draft-tokens 16"
    )


@dataclass(frozen=True)
class DraftSettings:
    """How llama.cpp drafts with the EAGLE-3 GGUF: up to `n_max` tokens per step, the chain cut at the first
    token whose draft probability is under `p_min` (0: never; a step left without draft verifies alone)."""

    n_max: int = 1
    p_min: float = 0.0

    def __post_init__(self) -> None:
        if self.n_max < 1 or not 0 <= self.p_min < 1:
            raise ValueError(f"draft settings n_max={self.n_max}, p_min={self.p_min}: need n_max >= 1, 0 <= p_min < 1")

    @classmethod
    def parse(cls, text: str) -> DraftSettings:
        """'N' or 'N:P' (draft tokens per step, minimum draft probability)."""
        n, _, p = text.strip().partition(":")
        try:
            return cls(int(n), float(p) if p else 0.0)
        except ValueError as e:
            raise ValueError(f"draft settings {text!r}: expected N or N:P (e.g. 1:0.4), {e}") from None

    @property
    def label(self) -> str:
        return f"n{self.n_max}" + (f"-p{self.p_min:g}" if self.p_min else "")

    def args(self) -> tuple[str, ...]:
        p_min = ("--spec-draft-p-min", f"{self.p_min:g}") if self.p_min else ()
        return ("--spec-draft-n-max", str(self.n_max), *p_min)


def llamacpp_serve_command(
    server,
    target_gguf,
    draft_gguf,
    n_max: int,
    p_min: float = 0.0,
    threads: int | None = None,
    ngram: str | None = None,
    flash_attn: str | None = None,
) -> str:
    """llama-server with an EAGLE-3 draft: up to `n_max` draft tokens per step, the draft cut at the first
    token whose draft probability is under `p_min` (0: never); `ngram` adds one of llama.cpp's n-gram
    speculation types beside it; `flash_attn` on/off/auto is passed as -fa (None: llama.cpp's default,
    auto); threads None: llama.cpp's default (every core; on a CPU other processes share, one thread is
    steadier: a core taken stalls the others)."""
    spec = "draft-eagle3" + (f",{ngram}" if ngram else "")
    args = [str(server), "-m", str(target_gguf), "-md", str(draft_gguf), "--spec-type", spec]
    args += DraftSettings(n_max, p_min).args()
    args += flash_attn_args(flash_attn)
    if threads is not None:
        args += ["-t", str(threads), "-tb", str(threads)]
    return " ".join(args)


FLASH_ATTN = ("on", "off", "auto")  # llama.cpp's -fa values


def flash_attn_args(flash_attn: str | None) -> tuple[str, ...]:
    """llama.cpp's `-fa X` (llama-server and llama-bench alike), or nothing for its default (auto)."""
    if flash_attn is None:
        return ()
    if flash_attn not in FLASH_ATTN:
        raise ValueError(f"flash attention {flash_attn!r}: llama.cpp takes one of {', '.join(FLASH_ATTN)}")
    return ("-fa", flash_attn)
