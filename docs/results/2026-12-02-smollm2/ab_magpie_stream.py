"""A/B: self-written prompts (Magpie) before and after streaming, same target, same sources, each run alone.

    python docs/results/2026-12-02-smollm2/ab_magpie_stream.py OLD_CHECKOUT [ROUNDS] [N] [SOURCES]

OLD_CHECKOUT is a checkout of the commit before streaming (2c35b46). Each variant runs in its own process
(old: a symlinked package tree, imported instead of the editable install's mapping), in ABBA order,
writing N first turns of the default mix's `writing` source and N/2 two-turn conversations of
`chat_multi_turn` (SOURCES: a comma-separated subset) into a fresh folder. Prints seconds per source and the candidates each wrote. The written
prompts differ (candidates are seeded one by one now, by call before), so only time and counts compare.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[3]
PACKAGES = {"data": "data", "export": "export", "heads": "heads", "inference": "inference", "train": "train"}

CHILD = r"""
import json, sys, time
if len(sys.argv) > 4:  # the old tree: before the editable install's finder, which maps headway to this checkout
    sys.meta_path = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
    sys.path.insert(0, sys.argv[4])
from pathlib import Path
import torch
from headway.config import load_config
from headway.data.magpie import PromptWriter
from headway.target import load_target

torch.set_num_threads(2)
out, n, sources = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target, device="cpu", dtype=torch.bfloat16)
writer = PromptWriter(model, tok, out, cfg.data, log=lambda *_: None)
result = {}
for src in cfg.data.sources:
    if src.name not in sources:
        continue
    k = n if src.turns == 1 else n // 2
    t0 = time.perf_counter()
    convs = writer(src, src.name, k)
    seconds = time.perf_counter() - t0
    done = json.loads((out / f"{src.name}.json").read_text())
    result[src.name] = {
        "seconds": round(seconds, 1),
        "conversations": len(convs),
        "turns": sum(len(c) for c in done["conversations"]),
        "dropped": sum(done["rejected"].values()),
        "kept_first_answers": sum(a is not None for a in done.get("first_answers", [])),
    }
print("RESULT " + json.dumps(result))
"""


def old_tree(old: Path, dest: Path) -> Path:
    """headway.* of the old checkout as a package tree (the editable install maps folders, not a tree)."""
    pkg = dest / "headway"
    pkg.mkdir(parents=True)
    for f in (old / "headway").iterdir():
        (pkg / f.name).symlink_to(f)
    for name, folder in PACKAGES.items():
        (pkg / name).symlink_to(old / folder)
    return dest


def run(variant: str, tree: str | None, n: int, sources: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        args = [sys.executable, "-c", CHILD, out, str(n), sources] + ([tree] if tree else [])
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{p.stderr[-3000:]}")
        line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
        res = json.loads(line.removeprefix("RESULT "))
        print(f"{variant}: {res}  (process {time.perf_counter() - t0:.0f} s)", flush=True)
        return res


def main() -> None:
    old = Path(sys.argv[1]).resolve()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 96
    sources = sys.argv[4] if len(sys.argv) > 4 else "writing,chat_multi_turn"
    with tempfile.TemporaryDirectory() as tree:
        old_path = str(old_tree(old, Path(tree)))
        results = {"old": [], "new": []}
        for r in range(rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for v in order:
                results[v].append(run(v, old_path if v == "old" else None, n, sources))
    for source in results["new"][0]:
        old_s = sum(x[source]["seconds"] for x in results["old"]) / rounds
        new_s = sum(x[source]["seconds"] for x in results["new"]) / rounds
        print(f"{source}: old {old_s:.1f} s, new {new_s:.1f} s, {old_s / new_s:.2f}x")


if __name__ == "__main__":
    main()
