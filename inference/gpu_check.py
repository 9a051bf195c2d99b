"""A check ready to run on a CUDA machine: exactness on the device, then the engine and training on a
randomly initialised target shaped like Llama-3.1-8B, the verify-cost curve and per-phase step times.

    bash scripts/gpu_check.sh                       # CUDA; prints everything, writes runs/gpu_check/gpu_check.json
    bash scripts/gpu_check.sh --layers 8            # fewer decoder layers (each one Llama-3.1-8B's shape)
    bash scripts/gpu_check.sh --tiny --device cpu   # the same path with tiny models (the test suite runs this)

Needs torch and transformers only; nothing is downloaded (every model is built with random weights
on the device) and the optional packages (datasets, gguf, deepspeed, wandb) are never imported.
1. exactness, tiny fp32 targets: greedy output of every drafter (Medusa, EAGLE-1, EAGLE-3, lookup,
   EAGLE-3 + lookup fused) equal to plain greedy at batch 1 and 4 (asserted); the same in bf16
   (reported, not asserted); the chi-square test of speculative sampling on fused trees, and its
   negative control, which must fail (asserted).
2. a Llama-3.1-8B-shaped target (hidden 4096, 32 query / 8 KV heads, MLP 14336, vocabulary 128,256;
   `--layers` of its 32 decoder layers), random bf16 weights made on the device: the verify-cost
   curve, engine steps per head type with per-phase times (random drafters accept next to nothing:
   the times are the point) and a few training steps of each head type.
Exit status 1 when an asserted check fails. A part that raises is reported with its traceback and
the later parts still run; gpu_check.json is rewritten after every part, so a timeout keeps what was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from headway.inference import exactness
from headway.inference.acceptance import accept_sampling
from headway.inference.allocation import NodePlanner
from headway.inference.cost import choose_budget, measure_verify_cost
from headway.inference.drafters import (
    EagleTreeDrafter,
    FusedDrafter,
    LookupDrafter,
    MedusaDrafter,
    ModelDrafter,
)
from headway.inference.engine import SpecEngine
from headway.inference.trees import DEFAULT_ACCURACIES, DRAFTER_DEFAULT_ACCURACIES, Tree, TreeSpec, build_tree
from headway.sampling import SamplingParams

LLAMA_31_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}  # per-layer shapes; 32 layers
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def random_llama(shape: dict, layers: int, device, dtype=torch.float32, seed: int = 0):
    """A LlamaForCausalLM with random weights made directly on `device` in `dtype`; no EOS (never stops)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, num_hidden_layers=layers, max_position_embeddings=8192, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype):
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = None
    return model.eval().requires_grad_(False)


def echo_drafter(drafter):
    """An EAGLE drafter whose layer passes the target feature through (fc reads only the last feature
    block; attention and MLP outputs zeroed): it guesses the target's next token one step early, so
    an untrained drafter gets some drafts accepted and the accepted paths are exercised."""
    h = drafter.config.hidden_size
    layer = drafter.midlayer if hasattr(drafter, "midlayer") else drafter.layers[0]
    with torch.no_grad():
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, -h:] = torch.eye(h)
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return drafter


def fused(trained, spec: TreeSpec, accuracies, lookup: LookupDrafter | None = None) -> FusedDrafter:
    lookup = lookup or LookupDrafter(max_ngram=3, max_tokens=6, num_candidates=3)
    planner = NodePlanner(accuracies, spec.num_nodes, spec.max_depth, lookup.max_tokens)
    return FusedDrafter(trained, lookup, planner, accuracies)


def drafters(target, depth: int, vocab=None, echo: bool = True) -> dict:
    """name -> (drafter, tree spec) for every head type, untrained, on `target` (its device and dtype)."""
    from headway.features import default_feature_layers
    from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter
    from headway.heads.medusa import MedusaHeads

    dtype, L = next(target.parameters()).dtype, target.config.num_hidden_layers
    static = TreeSpec("static", build_tree(DEFAULT_ACCURACIES, 10, max_depth=min(depth, 4)))
    dynamic = TreeSpec("dynamic", depth=depth, top_k=4, budget=10)
    prep = echo_drafter if echo else (lambda d: d)
    layers = default_feature_layers(L) if L > 5 else [1, L // 2 + 1, L]
    eagle3 = EagleTreeDrafter(prep(Eagle3Drafter.from_target(target, layers, vocab=vocab)).to(dtype).eval())
    return {
        "medusa": (MedusaDrafter(MedusaHeads.from_target(target, 4, vocab=vocab).to(dtype).eval()), static),
        "eagle1": (EagleTreeDrafter(prep(Eagle1Drafter.from_target(target)).to(dtype).eval()), dynamic),
        "eagle3": (eagle3, dynamic),
        "lookup": (LookupDrafter(), TreeSpec("dynamic", depth=10, top_k=3, budget=30)),
        "eagle3+lookup": (fused(eagle3, dynamic, DRAFTER_DEFAULT_ACCURACIES), dynamic),
    }


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random prompts of 6..48 tokens; every other one repeats a phrase (something for lookup to find)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(1, vocab, (int(torch.randint(6, 48, (1,), generator=g)),), generator=g).tolist()
        out.append(ids + ids[: len(ids) // 2] if i % 2 else ids)
    return out


@torch.no_grad()
def plain_greedy(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids], device=next(model.parameters()).device)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def greedy_exactness(device, dtype, tokens: int, n_prompts: int) -> dict:
    """Per drafter and batch size: prompts equal to plain greedy, and draft tokens accepted."""
    target = random_llama(TINY, 4, device, dtype, seed=1)
    ps = prompts(n_prompts, TINY["vocab_size"])
    refs = [plain_greedy(target, p, tokens) for p in ps]
    out = {}
    for name, (drafter, spec) in drafters(target, 4).items():
        engine = SpecEngine(target, drafter, spec, eos_ids=set())
        for batch in (1, 4):
            same, accepted = 0, 0
            for i in range(0, len(ps), batch):
                res = engine.generate(ps[i : i + batch], tokens)
                same += sum(t == r for t, r in zip(res.tokens, refs[i : i + batch], strict=True))
                accepted += sum(map(sum, res.accepted))
            out[f"{name} batch {batch}"] = {"identical": same, "prompts": len(ps), "accepted": accepted}
    return out


SAMPLING_PROMPT = [3, 1, 4, 1, 0, 2]
BRANCHING = Tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


def _sampling_model(seed: int, device):
    m = random_llama({**TINY, "vocab_size": 5, "hidden_size": 16, "intermediate_size": 32}, 1, device, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # far from uniform, and far from each other
        m.lm_head.weight.copy_(torch.randn(m.lm_head.weight.shape, generator=g) * 0.2)
    return m


def sampling_exactness(device, samples: int) -> dict:
    """Chi-square p-values of fused speculative sampling (must pass) and of a wrong residual (must fail)."""
    target, draft = _sampling_model(0, device), _sampling_model(1, device)
    s = SamplingParams(temperature=1.0)
    joint = exactness.exact_joint(target, SAMPLING_PROMPT, 4, s)
    cases = {
        "fused, sampled children": (TreeSpec("static", BRANCHING), "sample"),
        "fused, top-k dynamic": (TreeSpec("dynamic", depth=3, top_k=2, budget=5), "topk"),
    }
    out = {}
    for name, (spec, children) in cases.items():
        lookup = LookupDrafter(max_ngram=3, max_tokens=4, num_candidates=2)
        drafter = fused(ModelDrafter(draft, children=children), spec, DRAFTER_DEFAULT_ACCURACIES, lookup)
        drafter.planner.resize_trained = False
        engine = SpecEngine(target, drafter, spec, s, eos_ids=set())
        counts = exactness.sample_counts(engine, SAMPLING_PROMPT, 4, samples)
        out[name] = {"p": exactness.chi_square_p(counts, joint), "lookup_tokens": drafter.totals["lookup_tokens"]}
    import headway.inference.engine as engine_mod

    wrong = engine_mod.accept_sampling
    engine_mod.accept_sampling = lambda *a, **k: accept_sampling(*a, **k, correction=lambda p, q: p)
    try:
        spec, children = cases["fused, top-k dynamic"]
        drafter = fused(ModelDrafter(draft, children=children), spec, DRAFTER_DEFAULT_ACCURACIES)
        engine = SpecEngine(target, drafter, spec, s, eos_ids=set())
        counts = exactness.sample_counts(engine, SAMPLING_PROMPT, 4, samples)
        out["negative control: residual from p"] = {"p": exactness.chi_square_p(counts, joint)}
    finally:
        engine_mod.accept_sampling = wrong
    return out


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def engine_phases(target, tokens: int, n_prompts: int, vocab, curve: dict[int, float], batch_sizes=(1, 4)) -> dict:
    """Per head type and batch size: ms per verification step by phase, tokens per step, tree budget."""
    out = {}
    ps = prompts(n_prompts, target.config.vocab_size, seed=2)
    for name, (drafter, spec) in drafters(target, 6, vocab=vocab, echo=False).items():
        if spec.kind == "dynamic" and name != "lookup":  # the budget the curve implies, as tree_budget: auto
            budget, _ = choose_budget(curve, DRAFTER_DEFAULT_ACCURACIES, max_depth=spec.depth)
            spec = TreeSpec("dynamic", depth=spec.depth, top_k=8, budget=budget)
        engine = SpecEngine(target, drafter, spec, eos_ids=set(), profile=True)
        engine.generate([ps[0]], 4)  # warm up
        for b in batch_sizes:
            steps, times, made = 0, {}, 0
            for i in range(0, len(ps), b):
                res = engine.generate(ps[i : i + b], tokens)
                steps += max(map(len, res.accepted))
                made += sum(map(len, res.tokens))
                for k, v in res.timings.items():
                    times[k] = times.get(k, 0.0) + v
            ms = {k: round(1000 * v / steps, 2) for k, v in times.items() if k != "prefill"}
            out[f"{name} batch {b}"] = {"nodes": spec.num_nodes, "tokens_per_step": round(made / steps, 2), "ms": ms}
    return out


def training_steps(target, vocab, steps: int, seq_len: int, device) -> dict:
    """A few optimizer steps of each head type on random rows: seconds per step and the losses."""
    from headway.data.features import OnlineFeatures
    from headway.features import default_feature_layers
    from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter
    from headway.heads.eagle_objective import EagleLossConfig, build_objective
    from headway.heads.medusa import MedusaHeads
    from headway.heads.medusa_loss import MedusaObjective

    L, V = target.config.num_hidden_layers, target.config.vocab_size
    layers = default_feature_layers(L) if L > 5 else [1, L // 2 + 1, L]
    objectives = {
        "medusa": MedusaObjective(MedusaHeads.from_target(target, 4, vocab=vocab)),
        "eagle1": build_objective(Eagle1Drafter.from_target(target), EagleLossConfig(unroll_steps=1)),
        "eagle3": build_objective(Eagle3Drafter.from_target(target, layers, vocab=vocab), EagleLossConfig(unroll_steps=7)),
    }
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, V, (2, seq_len), generator=g).to(device)
    mask = torch.ones_like(ids)
    loss_mask = torch.cat([torch.zeros_like(ids[:, : seq_len // 4]), torch.ones_like(ids[:, seq_len // 4 :])], 1)
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}
    cuda = torch.device(device).type == "cuda"
    out = {}
    for name, obj in objectives.items():
        obj = obj.to(device).train()
        opt = torch.optim.AdamW([p for p in obj.parameters() if p.requires_grad], lr=1e-4)
        feats = OnlineFeatures(target, obj.feature_spec())(batch)
        losses, seconds = [], []
        for _ in range(steps):
            sync(device)
            t = time.perf_counter()
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=cuda):
                loss = obj.training_loss(batch, feats).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(device)
            seconds.append(time.perf_counter() - t)
            losses.append(float(loss.detach()))
        out[name] = {"s_per_step": round(sorted(seconds)[len(seconds) // 2], 4), "losses": [round(x, 4) for x in losses]}
        del obj, opt, feats
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny models throughout (CPU smoke run of this path)")
    p.add_argument("--layers", type=int, help="decoder layers of the Llama-3.1-8B-shaped target (default 32; --tiny: 2)")
    p.add_argument("--tokens", type=int, help="new tokens per prompt in the engine runs (default 64; --tiny: 8)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per engine run")
    p.add_argument("--train-len", type=int, help="tokens per training row (default 1024; --tiny: 64)")
    p.add_argument("--out", default="runs/gpu_check", help="folder for gpu_check.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device")
    tiny = args.tiny
    layers = args.layers or (2 if tiny else 32)
    started = time.perf_counter()
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "tiny": tiny,
        "optional_packages": {m: _present(m) for m in ("datasets", "gguf", "deepspeed", "wandb")},
    }
    import transformers

    info["transformers"] = transformers.__version__
    print(json.dumps(info))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"info": info, "errors": {}}

    def save() -> None:  # after every section, so a timeout or a crash still leaves what was measured
        report["seconds"] = round(time.perf_counter() - started, 1)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")

    def section(name: str, run) -> bool:
        """Run one part of the check; an exception fails the check but the later parts still run."""
        try:
            good = run()
        except Exception:  # noqa: BLE001 (reported with its traceback, counted as a failure)
            report["errors"][name] = traceback.format_exc()
            print(f"FAIL {name}:\n{report['errors'][name]}", flush=True)
            good = False
        save()
        return good

    print("\n== 1. exactness on the device, tiny targets ==")
    tokens, n = (12, 8) if tiny else (24, 12)

    def greedy_fp32() -> bool:
        report["greedy_fp32"] = greedy_exactness(device, torch.float32, tokens, n)
        ok = True
        for k, v in report["greedy_fp32"].items():
            good = v["identical"] == v["prompts"]
            ok &= good
            print(f"fp32 greedy {k:<22} identical {v['identical']}/{v['prompts']}  accepted {v['accepted']}  {'ok' if good else 'FAIL'}")
        return ok

    def greedy_bf16() -> bool:
        report["greedy_bf16"] = greedy_exactness(device, torch.bfloat16, tokens, n)
        for k, v in report["greedy_bf16"].items():
            print(f"bf16 greedy {k:<22} identical {v['identical']}/{v['prompts']}  (reported, not asserted)")
        return True

    def sampling() -> bool:
        report["sampling"] = sampling_exactness(device, 6000 if tiny else 20000)
        ok = True
        for k, v in report["sampling"].items():
            control = k.startswith("negative")
            good = (v["p"] < 0.01) if control else (v["p"] > 0.01)
            ok &= good
            print(f"chi-square {k:<36} p = {v['p']:.3g}  {'ok' if good else 'FAIL'}" + ("  (must reject)" if control else ""))
        return ok

    ok = section("greedy_fp32", greedy_fp32)
    ok &= section("greedy_bf16", greedy_bf16)
    ok &= section("sampling", sampling)

    shape = TINY if tiny else LLAMA_31_8B
    print(f"\n== 2. {'tiny' if tiny else 'Llama-3.1-8B-shaped'} random target, {layers} decoder layers, bf16 ==")
    target = random_llama(shape, layers, device, torch.bfloat16, seed=4)
    from headway.heads.vocab import DraftVocab

    vocab = DraftVocab(torch.arange(min(32000, shape["vocab_size"] // 2)), shape["vocab_size"])
    curve: dict[int, float] = {}

    def verify_cost() -> bool:
        curve.update(measure_verify_cost(target, context=64 if tiny else 512, reps=2 if tiny else 5))
        base = curve[min(curve)]
        report["verify_cost_s"] = curve
        print("verify cost (k new tokens / one): " + ", ".join(f"{k}: {v / base:.2f}x" for k, v in curve.items()))
        print(f"one-token forward: {1000 * base:.2f} ms")
        return True

    def engine() -> bool:
        report["engine"] = engine_phases(target, args.tokens or (8 if tiny else 64), args.prompts, vocab, curve)
        for k, v in report["engine"].items():
            print(f"engine {k:<22} nodes {v['nodes']:>3}  tokens/step (all rows) {v['tokens_per_step']:.2f}  ms/step {v['ms']}")
        return True

    def training() -> bool:
        report["training"] = training_steps(target, vocab, 2 if tiny else 3, args.train_len or (64 if tiny else 1024), device)
        ok = True
        for k, v in report["training"].items():
            finite = all(x == x and abs(x) != float("inf") for x in v["losses"])
            ok &= finite
            print(f"train {k:<8} {v['s_per_step']:.3f} s/step  losses {v['losses']}  {'ok' if finite else 'FAIL (not finite)'}")
        return ok

    ok &= section("verify_cost", verify_cost)
    if curve:  # the engine's tree budgets come from the curve
        ok &= section("engine", engine)
    ok &= section("training", training)
    report["passed"] = bool(ok)
    save()
    print(f"\n{'PASSED' if ok else 'FAILED'} in {report['seconds']} s; written to {out / 'gpu_check.json'}")
    return 0 if ok else 1


def _present(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
