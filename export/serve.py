"""How to serve an exported folder: the engine's command line.

    print(serve_command("eagle3", "vllm", "exports/x-eagle3-vllm", "meta-llama/Llama-3.1-8B-Instruct"))
    print(llamacpp_serve_command("llama-server", "target-f16.gguf", "draft-f16.gguf", n_max=1, p_min=0.4))
"""

from __future__ import annotations

import json

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


def llamacpp_serve_command(
    server,
    target_gguf,
    draft_gguf,
    n_max: int,
    p_min: float = 0.0,
    threads: int | None = None,
    ngram: str | None = None,
) -> str:
    """llama-server with an EAGLE-3 draft: up to `n_max` draft tokens per step, the draft cut at the first
    token whose draft probability is under `p_min` (0: never); `ngram` adds one of llama.cpp's n-gram
    speculation types beside it; threads None: llama.cpp's default (every core; on a CPU other processes
    share, one thread is steadier: a core taken stalls the others)."""
    spec = "draft-eagle3" + (f",{ngram}" if ngram else "")
    args = [str(server), "-m", str(target_gguf), "-md", str(draft_gguf), "--spec-type", spec]
    args += ["--spec-draft-n-max", str(n_max)]
    if p_min > 0:
        args += ["--spec-draft-p-min", f"{p_min:g}"]
    if threads is not None:
        args += ["-t", str(threads), "-tb", str(threads)]
    return " ".join(args)
