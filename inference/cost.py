"""The verification cost curve of the target on this device, and the node budget it implies.

    curve = measure_verify_cost(model)              # {new tokens: seconds per forward}
    budget, table = choose_budget(curve, accuracies) # maximises expected tau / cost(budget + 1)
    budget, table = choose_budget(curve, accuracies, 6, draft_cost=0.004, forward_cost=0.003)  # depth too
    accuracies, scale = fit_acceptance(accuracies, tree, observed_tau=2.4)  # the profile, as seen on real prompts

On this CPU (SmolLM2-135M, bf16) a forward over 16 new tokens costs ~1.6x one token and 64 tokens
~3.3x; on an H100 the curve is far flatter, so the best tree is far larger there.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from headway.bench import timed
from headway.inference.layout import additive_mask
from headway.inference.trees import Tree, build_tree, expected_tau
from headway.kv import cache_kwarg, crop

SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


@torch.inference_mode()
def measure_verify_cost(
    model, sizes: tuple[int, ...] = SIZES, context: int = 256, reps: int = 5, seed: int = 0
) -> dict[int, float]:
    """Median seconds of one verification forward (decoder + lm_head) over k new tokens on a cache
    of `context` tokens, for each k in `sizes`, on the model's own device and dtype."""
    p = next(model.parameters())
    device, dtype = p.device, p.dtype
    dec, head = model.get_decoder(), model.get_output_embeddings()
    g = torch.Generator().manual_seed(seed)
    vocab = head.weight.shape[0]
    ids = torch.randint(0, vocab, (1, context + max(sizes)), generator=g).to(device)
    cache = DynamicCache(config=model.config)
    dec(input_ids=ids[:, :context], use_cache=True, **cache_kwarg(dec, cache))
    masks = {}
    for k in sizes:
        allowed = torch.ones(k, context + k, dtype=torch.bool, device=device)
        allowed[:, context:] = torch.ones(k, k, dtype=torch.bool, device=device).tril()
        masks[k] = additive_mask(allowed, dtype)[None, None]
    times: dict[int, list[float]] = {k: [] for k in sizes}
    for r in range(reps + 1):  # round-robin over sizes, so drift hits all sizes alike; round 0 warms up
        for k in sizes:
            pos = torch.arange(context, context + k, device=device)[None]
            with timed(device) as m:
                out = dec(
                    input_ids=ids[:, context : context + k],
                    attention_mask=masks[k],
                    position_ids=pos,
                    **cache_kwarg(dec, cache),
                    use_cache=True,
                )
                head(out.last_hidden_state)
            if r:
                times[k].append(m.seconds)
            crop(cache, context)  # back to the context
    median = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    # More tokens never cost less: a noisy spike at k is capped by any larger size's time.
    curve, best = {}, float("inf")
    for k in sorted(sizes, reverse=True):
        best = min(best, median[k])
        curve[k] = best
    return dict(sorted(curve.items()))


def cost_at(curve: dict[int, float], k: float) -> float:
    """Linear interpolation (and flat extrapolation past the ends) of the measured curve."""
    xs = sorted(curve)
    if k <= xs[0]:
        return curve[xs[0]]
    for a, b in zip(xs, xs[1:], strict=False):
        if k <= b:
            return curve[a] + (curve[b] - curve[a]) * (k - a) / (b - a)
    return curve[xs[-1]] * k / xs[-1]


def choose_budget(
    curve: dict[int, float],
    accuracies: list[list[float]],
    max_depth: int | None = None,
    candidates: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 127),
    draft_cost: float = 0.0,
    forward_cost: float = 0.0,
) -> tuple[int, list[dict]]:
    """The node budget maximising expected tokens per second: tau(best tree of n nodes) /
    (cost of verifying n + 1 tokens + draft_cost). Returns (budget, the table of candidates).

    forward_cost > 0: the drafter runs one forward per tree level (EAGLE, a small LM), each costing
    that much on top of draft_cost, so shallower trees are candidates too; each table row names its
    depth, and `best_row(table)` is the choice."""
    depths = [max_depth] if forward_cost <= 0 or max_depth is None else list(range(1, max_depth + 1))
    table = []
    for n in candidates:
        for d in depths:
            tree = build_tree(accuracies, n, max_depth=d)
            tau = expected_tau(tree, accuracies)
            cost = cost_at(curve, n + 1) + draft_cost + (d or 0) * forward_cost
            table.append({"nodes": n, "depth": d, "tau": round(tau, 4), "cost_s": cost, "tokens_per_s": tau / cost})
    return best_row(table)["nodes"], table


def scale_accuracies(accuracies: list[list[float]], scale: float) -> list[list[float]]:
    """Depth d's cumulative accuracies times scale**d (depth 1 first), capped at 1."""
    return [[min(1.0, a * scale ** (d + 1)) for a in row] for d, row in enumerate(accuracies)]


def fit_acceptance(
    accuracies: list[list[float]], tree: Tree, observed_tau: float, lo: float = 0.05, hi: float = 2.0
) -> tuple[list[list[float]], float]:
    """The profile rescaled so that `tree` expects the tau observed with it: (accuracies, scale).

    A profile measured on the training mix's validation split overstates acceptance on other text,
    and more the deeper the draft (each depth compounds the drift), while budget choice turns on
    what the deepest, widest nodes add. One number, applied as scale**d at depth d (so a path of
    depth D is scaled by scale**(D(D+1)/2): 0.88 gives 0.28 at depth 4), fitted by bisection on
    the mean accepted length (the least noisy thing a few calibration steps measure). On a model-167
    Xeon's Spec-Bench run the profile expected tau 3.11 of 16 nodes at depth 4 against 2.44 seen;
    the fitted 0.88 expected 2.28 of 8 nodes at depth 3 against 2.23 seen, and chose that tree,
    the fastest of nine measured (docs/results/2026-12-07-smollm2/xeon/, section 11)."""
    if observed_tau < 1:
        raise ValueError(f"observed tau counts the bonus token, so it is at least 1, got {observed_tau}")

    def tau(scale: float) -> float:
        return expected_tau(tree, scale_accuracies(accuracies, scale))

    if tau(hi) <= observed_tau:
        return scale_accuracies(accuracies, hi), hi
    for _ in range(40):  # expected tau rises with the scale (below 1 every path probability does; above, until capped)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau(mid) < observed_tau else (lo, mid)
    return scale_accuracies(accuracies, lo), lo


def best_row(table: list[dict]) -> dict:
    """The candidate with the most expected tokens per second (the smallest tree among equals)."""
    return max(table, key=lambda r: r["tokens_per_s"])
