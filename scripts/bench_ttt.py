"""EAGLE-3 training step time: where it goes (a profile by component) and the TTT attention kernels compared.

    python scripts/bench_ttt.py --threads 1                      # recipe shapes, both TTT kernels, 3 rounds
    python scripts/bench_ttt.py --profile --shapes 1024:256      # the component table of one step
    python scripts/bench_ttt.py --profile --shapes 1024:256 eagle.draft_vocab_size=4096   # with recipe overrides
    python scripts/bench_ttt.py --variants default --shapes 1024:512 --rounds 1   # peak memory, largest batch
    python scripts/bench_ttt.py --shapes 64:16 --batch-size 2 --rounds 1        # smoke test (seconds)

One step = what train/loop.py does per micro-batch on the recipe (configs/smollm2-135m/eagle3.yaml:
offline features, bf16 autocast, 7 unrolled steps, draft vocabulary 8,192): the objective's loss,
backward, clip, AdamW. Batches are synthetic: `--shapes T:A` gives `--batch-size` rows of about T tokens
(T, T - 8, T - 16, ...: what length grouping hands the loop) whose last A tokens are target-generated,
with random features. The recipe writes at most 256 answer tokens per turn after at most 768 prompt
tokens; distilled rows are about two thirds answer (SmolLM2 math/code/general: 254 tokens, 168
generated), so the default shapes are two-turn and long-context worst cases and two typical ones.
Variants (`headway_base_attention` of the drafter's layer config): `default` is `ttt_attention`,
`materialised` the plain-autograd reference (heads/eagle_attention.py). They run on the same batches
interleaved round by round, so drift on a shared CPU hits all alike; each step prints wall and process
CPU seconds (CPU time counts what this process ran, not what it waited for: on a shared machine
compare CPU times, and with --threads 1, since a starved second thread spins and inflates both).
`--profile` runs one step of the first variant under torch.profiler and splits its time by component,
forward and backward (backward ops are matched to the forward op that recorded them).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch.autograd.profiler import record_function

from headway.config import load_config
from headway.features import TargetFeatures, eagle_feature_spec
from headway.heads import eagle_attention, eagle_objective
from headway.heads.eagle import Eagle3Drafter
from headway.heads.eagle_objective import EagleLossConfig, build_objective
from headway.heads.vocab import DraftVocab
from headway.memory import keep_freed_cpu_memory
from headway.target import load_target

VARIANTS = {"default": "sdpa", "materialised": "eager"}  # -> the drafter's headway_base_attention


def split_shapes(words: list[str], overrides: list[str]) -> tuple[list[tuple[int, int]], list[str]]:
    """`--shapes` words -> [(T, A)], with any `key=value` word (argparse gives `--shapes` every word after it)
    moved to the overrides; a word that is neither raises ValueError naming it."""
    overrides = overrides + [w for w in words if "=" in w]
    words = [w for w in words if "=" not in w]
    bad = [w for w in words if len(w.split(":")) != 2 or not all(x.isdigit() for x in w.split(":"))]
    if bad or not words:
        raise ValueError(f"--shapes wants T:A pairs of token counts such as 1024:256, got {bad or 'none'}")
    return [tuple(int(x) for x in w.split(":")) for w in words], overrides


def synthetic_batch(B: int, T: int, A: int, vocab: torch.Tensor, spec, hidden: int, seed: int) -> tuple[dict, TargetFeatures]:
    """B right-padded rows of T, T - 8, ... tokens, the last A of each generated, and random bf16 features."""
    g = torch.Generator().manual_seed(seed)
    lengths = [max(A + 2, T - 8 * i) for i in range(B)]
    ids = vocab[torch.randint(0, vocab.numel(), (B, T), generator=g)]
    attn = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        attn[b, :n] = 1
        loss_mask[b, n - A : n] = 1
    ids = ids.masked_fill(attn == 0, 2)
    feats = TargetFeatures(
        layers={i: torch.randn(B, T, hidden, generator=g).to(torch.bfloat16) for i in spec.layers},
        final_normed=torch.randn(B, T, hidden, generator=g).to(torch.bfloat16),
    )
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask}, feats


def make_step(objective, lr: float, grad_clip: float):
    params = [p for p in objective.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)

    def step(batch, feats):
        with record_function("step: forward"), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = objective.training_loss(batch, feats).loss
        with record_function("step: backward"):
            loss.backward()
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


# ---------------------------------------------------------------- the profile


COMPONENTS = {  # drafter submodule -> component
    "fc": "fc (3h -> h)",
    "midlayer.input_layernorm": "norms",
    "midlayer.hidden_norm": "norms",
    "midlayer.post_attention_layernorm": "norms",
    "norm": "norms",
    "midlayer.self_attn.q_proj": "q/k/v proj",
    "midlayer.self_attn.k_proj": "q/k/v proj",
    "midlayer.self_attn.v_proj": "q/k/v proj",
    "midlayer.self_attn.o_proj": "o proj",
    "midlayer.self_attn": "attention: rope, reshapes",
    "midlayer.mlp": "MLP",
    "rotary_emb": "rotary tables",
}


@contextmanager
def labelled(drafter):
    """Forward ranges named by component (module hooks), plus the kernel, the soft CE and the target probs."""
    handles, stack = [], []
    named = [(mod, COMPONENTS[name]) for name, mod in drafter.named_modules() if name in COMPONENTS]
    for mod, label in named + [(drafter.target_parts.embed_tokens, "embedding")]:

        def pre(_m, _a, label=label):
            stack.append(record_function(label))
            stack[-1].__enter__()

        def post(*_):
            stack.pop().__exit__(None, None, None)

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    patched = [
        (eagle_attention, "ttt_attention", "TTT attention kernel"),
        (eagle_attention, "ttt_attention_materialised", "TTT attention kernel"),
        (eagle_objective, "projected_soft_ce", "lm_head + soft CE"),
        (eagle_objective, "align_step", "bookkeeping: align, gather"),
    ]
    patched = [(mod, attr, label) for mod, attr, label in patched if hasattr(mod, attr)]  # older trees
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in patched]
    for (mod, attr, label), (_, _, fn) in zip(patched, saved, strict=True):
        setattr(mod, attr, _wrapped(fn, label))
    probs = eagle_objective.EagleObjective._target_probs
    eagle_objective.EagleObjective._target_probs = staticmethod(_wrapped(probs, "target probs (no grad)"))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)
        eagle_objective.EagleObjective._target_probs = staticmethod(probs)


def _wrapped(fn, label):
    def call(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return call


def component_table(prof) -> list[tuple[str, float, float]]:
    """(component, forward ms, backward ms): forward ranges' exclusive time; each backward node's time
    goes to the range its forward op ran in (matched by the autograd sequence number)."""
    events = prof.events()
    labels = set(COMPONENTS.values()) | {
        "embedding", "TTT attention kernel", "lm_head + soft CE", "bookkeeping: align, gather",
        "target probs (no grad)", "step: forward", "step: backward", "optimizer",
    }

    def label_of(e):
        while e is not None and e.name not in labels:
            e = e.cpu_parent
        return e.name if e is not None else None

    fwd, bwd = defaultdict(float), defaultdict(float)
    seq_label = {}
    for e in events:
        if e.name in labels:
            inner = sum(c.cpu_time_total for c in _nearest_labelled(e, labels))
            fwd[e.name] += (e.cpu_time_total - inner) / 1e3
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::engine") and e.sequence_nr not in seq_label:
            lab = label_of(e)
            if lab not in (None, "step: backward"):
                seq_label[e.sequence_nr] = lab
    bwd_total = sum(e.cpu_time_total for e in events if e.name == "step: backward") / 1e3
    attributed = 0.0
    for e in events:
        if e.name.startswith("autograd::engine::evaluate_function") and label_of(e) == "step: backward":
            lab = "grad accumulation" if "AccumulateGrad" in e.name else seq_label.get(e.sequence_nr, "unmatched")
            bwd[lab] += e.cpu_time_total / 1e3
            attributed += e.cpu_time_total / 1e3
    bwd["autograd engine overhead"] += bwd_total - attributed
    fwd["bookkeeping: align, gather"] += fwd.pop("step: forward", 0.0)  # the objective's own ops
    bwd.pop("step: backward", None)
    fwd.pop("step: backward", None)
    names = sorted(set(fwd) | set(bwd), key=lambda k: -(fwd.get(k, 0) + bwd.get(k, 0)))
    return [(k, fwd.get(k, 0.0), bwd.get(k, 0.0)) for k in names]


def _nearest_labelled(e, labels):
    for c in e.cpu_children:
        if c.name in labels:
            yield c
        else:
            yield from _nearest_labelled(c, labels)


def print_profile(drafter, step, batch, feats) -> None:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # warm: allocations settle (the heap grows over the first steps)
        step(batch, feats)
    with labelled(drafter), profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, cpu = time.perf_counter(), time.process_time()
        step(batch, feats)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows = component_table(prof)
    total = sum(f + b for _, f, b in rows)
    print(f"\nprofile of one step (profiled: {wall:.2f} s wall, {cpu:.2f} s CPU; the profiler adds to small ops)")
    print(f"{'component':<30} {'fwd ms':>8} {'bwd ms':>8} {'total':>8} {'share':>6}")
    for name, f, b in rows:
        print(f"{name:<30} {f:>8.0f} {b:>8.0f} {f + b:>8.0f} {(f + b) / total:>6.1%}")
    print(f"{'sum':<30} {sum(r[1] for r in rows):>8.0f} {sum(r[2] for r in rows):>8.0f} {total:>8.0f}")
    print("\ntop ops (self CPU):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=48))


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/smollm2-135m/eagle3.yaml")
    p.add_argument("--shapes", nargs="+", default=["1024:512", "1024:256", "512:340", "256:170"], help="T:A (tokens:generated)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--batch-size", type=int, default=None, help="default: the recipe's")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds, after one warm-up round")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--profile", action="store_true", help="profile one step per shape instead of timing")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides for the recipe")
    args = p.parse_args(argv)
    try:
        shapes, args.overrides = split_shapes(args.shapes, args.overrides)
    except ValueError as err:
        p.error(str(err))

    cfg = load_config(args.config, args.overrides)
    e, tc = cfg.eagle, cfg.train
    if e is None or e.version != 3:
        p.error(f"{args.config} is not an EAGLE-3 recipe")
    keep_freed_cpu_memory()  # as train/loop.py does on CPU
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target, _tok = load_target(cfg.target)
    V = target.get_output_embeddings().weight.shape[0]
    vocab = DraftVocab(torch.randperm(V, generator=torch.Generator().manual_seed(0))[: e.draft_vocab_size].sort().values, V)
    drafter = Eagle3Drafter.from_target(target, feature_layers=e.feature_layers, vocab=vocab, feature_norm=e.feature_norm)
    objective = build_objective(drafter, EagleLossConfig.from_config(e), pad_id=2).train()
    step = make_step(objective, tc.lr, tc.grad_clip)
    spec = eagle_feature_spec(3, target.config.num_hidden_layers, e.feature_layers, training=True)
    B = args.batch_size or tc.batch_size
    batches = {s: synthetic_batch(B, *s, vocab.token_map, spec, target.config.hidden_size, seed=i) for i, s in enumerate(shapes)}
    scale = objective.calibrate_output_scale(*batches[min(shapes)])  # as the recipe does: realistic logits
    print(
        f"EAGLE-3 on {cfg.target.name}: batch {B}, {e.unroll_steps} unrolled steps, draft vocabulary {vocab.size}, "
        f"bf16 autocast, {torch.get_num_threads()} threads; shapes (tokens:generated) {[f'{t}:{a}' for t, a in shapes]}; norm {scale}x"
    )

    def use(variant: str) -> None:
        setattr(drafter.layer_config, eagle_attention.BASE_ATTENTION_ATTR, VARIANTS[variant])

    if args.profile:
        use(args.variants[0])
        for s in shapes:
            print(f"\n=== {args.variants[0]}, shape {s[0]}:{s[1]}")
            print_profile(drafter, step, *batches[s])
        return 0

    times: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in range(args.rounds + 1):  # round 0 warms up and is not counted
        for s in shapes:
            for v in args.variants:
                use(v)
                wall, ru = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                loss = step(*batches[s])
                wall, ru2 = time.perf_counter() - wall, resource.getrusage(resource.RUSAGE_SELF)
                user, system = ru2.ru_utime - ru.ru_utime, ru2.ru_stime - ru.ru_stime
                cpu = user + system
                print(
                    f"round {r} {v:<13} {s[0]}:{s[1]}  {wall:6.2f} s wall {cpu:6.2f} s CPU ({system:.2f} system)  loss {loss:.4f}",
                    flush=True,
                )
                if r:
                    times[s, v].append((wall, cpu))
    print(f"\n{'shape':<10} {'variant':<13} {'wall s (median)':>16} {'CPU s (median)':>15} {'wall range':>16}")
    for s in shapes:
        for v in args.variants:
            w = [a for a, _ in times[s, v]]
            c = [b for _, b in times[s, v]]
            print(f"{s[0]}:{s[1]:<6} {v:<13} {statistics.median(w):>16.2f} {statistics.median(c):>15.2f} {min(w):>7.2f}-{max(w):<7.2f}")
    print(f"\npeak resident memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
