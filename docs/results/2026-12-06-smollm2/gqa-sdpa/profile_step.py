"""Where an EAGLE-3 engine step goes: the engine's own per-phase timings (ms per verification step), or a
cProfile of the same run. Session-nineteen drafter, fixed dynamic tree of 16 nodes at depth 4, Spec-Bench
first turns, 128 new tokens.

    python docs/results/2026-12-06-smollm2/gqa-sdpa/profile_step.py 2             # N questions per domain
    python docs/results/2026-12-06-smollm2/gqa-sdpa/profile_step.py 1 --cprofile  # first 6 questions, cProfile
"""

import cProfile
import pstats
import sys
import time

from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.inference.build import build_engine
from headway.inference.questions import load_questions
from headway.paths import resolve_path
from headway.target import load_target

per_domain, use_cprofile = int(sys.argv[1]), "--cprofile" in sys.argv
cfg = load_config("configs/smollm2-135m/eagle3.yaml", ["inference.tree_budget=16", "inference.depth=4"])
model, tok = load_target(cfg.target)
engine = build_engine(cfg, "runs/smollm2-135m/eagle3", model, tok).engine
questions = load_questions(resolve_path(cfg.eval.questions), per_domain)
if use_cprofile:
    questions = questions[:6]
engine.generate([first_turn_ids(tok, "Say hello.")], 8)  # warm-up
tokens = steps = 0
phases: dict[str, float] = {}
profiler = cProfile.Profile() if use_cprofile else None
t = time.perf_counter()
if profiler:
    profiler.enable()
for q in questions:
    out = engine.generate([first_turn_ids(tok, q.turns[0])], 128)
    tokens, steps = tokens + len(out.tokens[0]), steps + out.verify_forwards[0]
    for name, seconds in out.timings.items():
        phases[name] = phases.get(name, 0.0) + seconds
if profiler:
    profiler.disable()
dt = time.perf_counter() - t
print(f"{tokens} tokens, {steps} steps, {dt:.1f} s: {tokens / dt:.1f} tokens/s, tau {tokens / steps:.2f}, "
      f"{1000 * dt / steps:.1f} ms a step")
print("ms per step:", {name: round(1000 * s / steps, 2) for name, s in phases.items()})
if profiler:
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(70)
