"""From a recipe and a checkpoint folder to a ready engine: drafter, tree, budget, sampling.

    target, tok = load_target(cfg.target)
    setup = build_engine(cfg, "runs/smollm2-135m/medusa", target, tok)   # None: untrained heads
    out = setup.engine.generate([ids], max_new_tokens=128)
    setups = build_engines(cfg, ckpt, target, tok, modes=("drafter", "lookup", "fused"))  # one drafter load

The trained drafter comes from the recipe (`medusa:` or `eagle:` section); `layer_skip=N` uses the
target's first N layers instead (self-speculation, no checkpoint). `inference.drafter` picks where
draft tokens come from: that drafter alone, prompt lookup alone (`inference.lookup`; no heads
needed), or both fused into one tree. Engines built together share the trained drafter object:
each generate() resets it, and engines never run interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from headway.config import Config
from headway.inference.allocation import NodePlanner
from headway.inference.cost import best_row, choose_budget, measure_verify_cost, scale_accuracies
from headway.inference.drafters.fused import FusedDrafter
from headway.inference.drafters.lookup import LookupDrafter
from headway.inference.engine import SpecEngine
from headway.inference.trees import (
    DEFAULT_ACCURACIES,
    DRAFTER_DEFAULT_ACCURACIES,
    TreeSpec,
    build_tree,
    chain,
    load_accuracies,
    load_paths,
)
from headway.int8 import quantize_drafter
from headway.packed import pack_linears
from headway.sampling import SamplingParams
from headway.target import stop_token_ids


@dataclass
class EngineSetup:
    engine: SpecEngine
    target: object  # the model the engine verifies with (Medusa-2: LoRA merged into the target)
    method: str
    info: dict = field(default_factory=dict)  # tree, budget, its source, cost curve, ... for the report
    accuracies: list[list[float]] | None = None  # what tree_budget: auto and static trees were built from
    depth: int = 0  # the trained drafter's depth
    mode: str = "drafter"  # inference.drafter: drafter | lookup | fused

    @property
    def max_depth(self) -> int:
        """The deepest draft node this engine's trees can hold (lookup chains may reach past the drafter's)."""
        d = self.engine.drafter
        lk = d if isinstance(d, LookupDrafter) else getattr(d, "lookup", None)
        return max(self.engine.spec.max_depth, lk.max_tokens if lk is not None else 0)


def load_drafter(cfg: Config, checkpoint: str | None, target, layer_skip: int | None = None):
    """(drafter, target, method, max_depth, notes). Medusa-2 checkpoints merge their LoRA into the target."""
    from headway.inference.drafters import EagleTreeDrafter, MedusaDrafter, ModelDrafter
    from headway.inference.drafters import layer_skip as make_layer_skip

    inf = cfg.inference
    dtype = next(target.parameters()).dtype
    notes = []
    if layer_skip:
        if inf.draft_quantization != "none":
            notes.append("draft_quantization ignored for layer-skip: its layers are the target's own")
        return (
            ModelDrafter(make_layer_skip(target, layer_skip), inf.children),
            target,
            f"layer-skip-{layer_skip}",
            None,
            notes,
        )
    if cfg.medusa is not None:
        from headway.heads.medusa import MedusaHeads

        if checkpoint is None:
            heads = MedusaHeads.from_target(target, cfg.medusa.num_heads, cfg.medusa.num_layers)
            notes.append("untrained Medusa heads (no checkpoint)")
        else:
            heads = MedusaHeads.from_pretrained(checkpoint, target=target)
            lora = Path(checkpoint) / "lora"
            if (lora / "adapter_config.json").is_file():
                from peft import PeftModel

                target = PeftModel.from_pretrained(target, str(lora)).merge_and_unload().eval()
                if cfg.target.pack_weights:
                    pack_linears(target)  # the merge changed the weights in place, unseen by their packed copies
                notes.append("Medusa-2: LoRA merged into the target; outputs are the adapted model's")
        heads = heads.to(dtype=dtype).eval()
        _quantize(heads, inf.draft_quantization, notes)
        if cfg.target.pack_weights:
            pack_linears(heads)
        return MedusaDrafter(heads, inf.children), target, "medusa", heads.config.num_heads, notes
    if cfg.eagle is not None:
        from headway.heads.eagle import Eagle1Drafter, Eagle3Drafter
        from headway.heads.eagle import load_drafter as load_eagle

        if checkpoint is None:
            if cfg.eagle.version == 3:
                d = Eagle3Drafter.from_target(target, cfg.eagle.feature_layers)
            else:
                d = Eagle1Drafter.from_target(target)
            notes.append(f"untrained EAGLE-{cfg.eagle.version} drafter (no checkpoint)")
        else:
            d = load_eagle(checkpoint, target)
        d = d.to(dtype=dtype).eval()
        _quantize(d, inf.draft_quantization, notes)
        if cfg.target.pack_weights:
            pack_linears(d)
        return EagleTreeDrafter(d, inf.children), target, f"eagle{d.config.version}", None, notes
    raise ValueError(
        f"{cfg.source_file}: the recipe has neither a medusa: nor an eagle: section; nothing to draft with"
    )


def _quantize(drafter, kind: str, notes: list[str]) -> None:
    """inference.draft_quantization: the drafter's own linears only (the target's shared parts are not its submodules)."""
    if kind != "none":
        n = quantize_drafter(drafter, kind)
        notes.append(f"int8 drafter weights ({n} linears)" if n else "draft_quantization int8: no CPU int8 kernel for this drafter; weights kept")


MODES = ("drafter", "lookup", "fused")
BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 127)  # tree_budget: auto chooses among these


def _engine(cfg: Config, target, tokenizer, drafter, spec: TreeSpec) -> SpecEngine:
    inf = cfg.inference
    return SpecEngine(
        target,
        drafter,
        spec,
        SamplingParams(inf.temperature, inf.top_p, inf.sample_top_k),
        acceptance=inf.acceptance,
        eos_ids=stop_token_ids(target, tokenizer),  # stop where `generate` stops
        pad_id=tokenizer.pad_token_id or 0,
        typical_threshold=inf.typical_threshold,
        typical_alpha=inf.typical_alpha,
    )


def _trained_setup(cfg: Config, checkpoint, target, tokenizer, layer_skip, curve, log) -> EngineSetup:
    inf = cfg.inference
    drafter, target, method, head_depth, notes = load_drafter(cfg, checkpoint, target, layer_skip)
    kind = inf.tree if inf.tree != "auto" else ("static" if method == "medusa" else "dynamic")
    if kind not in ("static", "dynamic", "chain"):
        raise ValueError(f"inference.tree must be auto, static, dynamic or chain, got {inf.tree!r}")
    depth = min(inf.depth, head_depth) if head_depth else inf.depth
    if method == "medusa" and kind == "dynamic" and inf.depth > head_depth:
        notes.append(f"depth capped at the {head_depth} Medusa heads")

    acc_path = inf.accuracy_file or (Path(checkpoint) / "head_accuracy.json" if checkpoint else None)
    if acc_path is not None and Path(acc_path).is_file():
        accuracies, acc_source = load_accuracies(acc_path), str(acc_path)
    else:
        accuracies = DEFAULT_ACCURACIES if method == "medusa" else DRAFTER_DEFAULT_ACCURACIES
        acc_source = "default profile"
    info: dict = {"accuracies": acc_source, "notes": notes}

    if kind == "chain":
        spec, budget, source = TreeSpec("static", chain(depth)), depth, "chain of inference.depth"
    elif kind == "static" and inf.tree_paths:
        tree = load_paths(inf.tree_paths)
        spec, budget, source = TreeSpec("static", tree), tree.num_nodes, f"paths from {inf.tree_paths}"
    else:
        if inf.tree_budget == "auto":
            if curve is None:
                log("measuring the verify cost curve (tree_budget: auto)")
                curve = measure_verify_cost(target)
            cands = tuple(n for n in BUDGETS if n <= inf.max_budget)
            budget, table = choose_budget(curve, accuracies, max_depth=depth, candidates=cands)
            source = f"auto: best expected tau per cost from {acc_source}"
            info["budget_table"] = table
        else:
            budget, source = int(inf.tree_budget), "inference.tree_budget"
        if kind == "static":
            spec = TreeSpec("static", build_tree(accuracies, budget, max_depth=depth))
        else:
            spec = TreeSpec("dynamic", depth=depth, top_k=inf.top_k, budget=budget)
    if curve is not None:
        info["verify_cost"] = {str(k): v for k, v in curve.items()}
    info.update({"tree": spec.describe(), "budget": budget, "budget_source": source})
    engine = _engine(cfg, target, tokenizer, drafter, spec)
    return EngineSetup(engine, target, method, info, accuracies, depth, "drafter")


def lookup_drafter(cfg: Config) -> LookupDrafter:
    lk = cfg.inference.lookup
    return LookupDrafter(lk.max_ngram, lk.min_ngram, lk.max_tokens, lk.num_candidates, lk.tokens_per_ngram)


def lookup_setup(cfg: Config, target, tokenizer) -> EngineSetup:
    """Prompt lookup alone: every candidate found (or `tree_budget` nodes), no trained heads."""
    inf, drafter = cfg.inference, lookup_drafter(cfg)
    budget = drafter.max_nodes if inf.tree_budget == "auto" else int(inf.tree_budget)
    spec = TreeSpec("dynamic", depth=drafter.max_tokens, top_k=drafter.num_candidates, budget=budget)
    info = {
        "accuracies": "none (prompt lookup)",
        "notes": [],
        "tree": {"kind": "lookup", "nodes": budget, "depth": drafter.max_tokens, "candidates": drafter.num_candidates},
        "budget": budget,
        "budget_source": "every lookup candidate" if inf.tree_budget == "auto" else "inference.tree_budget",
    }
    return EngineSetup(_engine(cfg, target, tokenizer, drafter, spec), target, "lookup", info, None, 0, "lookup")


def fused_setup(base: EngineSetup, cfg: Config, tokenizer, curve: dict[int, float] | None) -> EngineSetup:
    """The trained drafter of `base` with lookup candidates merged into its trees (its spec, its budget)."""
    inf, spec = cfg.inference, base.engine.spec
    lookup = lookup_drafter(cfg)
    resize = spec.kind == "dynamic" or base.info["budget_source"].startswith(("auto", "inference.tree_budget"))
    planner = NodePlanner(
        base.accuracies,
        base.info["budget"],
        base.depth,
        lookup.max_tokens,
        curve=curve,
        max_budget=inf.max_budget,
        resize_trained=resize,
        max_ngram=lookup.max_ngram,
    )
    drafter = FusedDrafter(base.engine.drafter, lookup, planner, base.accuracies)
    info = {
        **base.info,
        "notes": list(base.info["notes"]),
        "budget_source": base.info["budget_source"]
        + ("; per step, nodes split with lookup by what each accepts" + ("" if curve is None else ", more where they pay for their verification")),
    }
    engine = _engine(cfg, base.target, tokenizer, drafter, spec)
    return EngineSetup(engine, base.target, f"{base.method}+lookup", info, base.accuracies, base.depth, "fused")


def build_engines(
    cfg: Config,
    checkpoint: str | None,
    target,
    tokenizer,
    modes: tuple[str, ...] = MODES,
    layer_skip: int | None = None,
    curve: dict[int, float] | None = None,
    log=print,
) -> dict[str, EngineSetup]:
    """One engine per mode, the trained drafter loaded once (not at all for lookup alone)."""
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown drafting mode {bad[0]!r}: choose from {', '.join(MODES)}")
    out: dict[str, EngineSetup] = {}
    if "drafter" in modes or "fused" in modes:
        base = _trained_setup(cfg, checkpoint, target, tokenizer, layer_skip, curve, log)
        target = base.target  # Medusa-2: the adapted target verifies every mode alike
        curve = curve if curve is not None else _curve(base)
        if "drafter" in modes:
            out["drafter"] = base
        if "fused" in modes:
            out["fused"] = fused_setup(base, cfg, tokenizer, curve)
    if "lookup" in modes:
        out["lookup"] = lookup_setup(cfg, target, tokenizer)
    return {m: out[m] for m in modes}


def _curve(setup: EngineSetup) -> dict[int, float] | None:
    vc = setup.info.get("verify_cost")
    return {int(k): v for k, v in vc.items()} if vc else None


def build_engine(
    cfg: Config,
    checkpoint: str | None,
    target,
    tokenizer,
    layer_skip: int | None = None,
    curve: dict[int, float] | None = None,
    log=print,
) -> EngineSetup:
    """The engine of the recipe's `inference.drafter` mode."""
    mode = cfg.inference.drafter
    return build_engines(cfg, checkpoint, target, tokenizer, (mode,), layer_skip, curve, log)[mode]


def retune_budget(
    setup: EngineSetup,
    curve: dict[int, float],
    draft_cost: float,
    max_budget: int = 127,
    cost_source: str = "measured",
    acceptance_scale: float | None = None,
) -> None:
    """Re-choose an auto budget now that the drafter's own cost per step is measured: a drafter that
    costs a constant per step makes verifying a few more nodes relatively cheaper. A dynamic tree's
    drafter runs one forward per level, so its depth is chosen too (at most inference.depth): a level
    whose nodes the profile expects to be accepted too rarely is not worth its forward. Prompt lookup
    alone keeps its budget; a fused engine moves its planner to the new budget and cost. `cost_source`
    says where draft_cost came from in the report ("measured", or an earlier report's path).
    `acceptance_scale`: the profile's depths scaled to the acceptance seen on calibration prompts
    (`cost.fit_acceptance`) before the choice; None keeps the profile as measured."""
    if setup.mode == "lookup":
        return
    spec = setup.engine.spec
    accuracies = setup.accuracies if acceptance_scale is None else scale_accuracies(setup.accuracies, acceptance_scale)
    cands = tuple(n for n in BUDGETS if n <= max_budget)
    from headway.inference.drafters import MedusaDrafter  # its heads run once per step, whatever the depth

    per_level = spec.kind == "dynamic" and not isinstance(_trained(setup), MedusaDrafter)
    measured_depth = setup.info.setdefault("draft_cost_depth", spec.max_depth)  # the tree the cost was measured with
    forward = draft_cost / measured_depth if per_level else 0.0
    fixed = 0.0 if per_level else draft_cost
    _, table = choose_budget(curve, accuracies, setup.depth, cands, draft_cost=fixed, forward_cost=forward)
    best = best_row(table)
    budget, depth = best["nodes"], best["depth"]
    if spec.kind == "static":
        setup.engine.spec = TreeSpec("static", build_tree(accuracies, budget, max_depth=setup.depth))
    else:
        setup.engine.spec = TreeSpec("dynamic", depth=depth, top_k=spec.top_k, budget=budget)
    if setup.mode == "fused":
        fused = setup.engine.drafter
        if acceptance_scale is not None:  # its node values and resized static trees: from the fitted profile too
            fused.accuracies = fused.planner.accuracies = accuracies
            fused._static.clear()
        fused.planner.set_budget(budget, setup.engine.spec.max_depth)
        fused.planner.set_cost(curve, draft_cost)
    setup.info.update(
        {
            "tree": setup.engine.spec.describe(),
            "budget": budget,
            "budget_table": table,
            "draft_cost_s": draft_cost,
            "budget_source": setup.info.setdefault("prior_budget_source", setup.info["budget_source"])  # retuned again: not appended twice
            + (" and a measured" if cost_source == "measured" else f" and {cost_source}'s")
            + f" draft cost of {1000 * draft_cost:.1f} ms/step"
            + (f" ({1000 * forward:.1f} ms per tree level: depth {depth})" if per_level else "")
            + ("" if acceptance_scale is None else f", its depths' acceptance scaled by {acceptance_scale:.3f}**depth"),
            "acceptance_scale": acceptance_scale,
        }
    )


def _trained(setup: EngineSetup):
    d = setup.engine.drafter
    return d.trained if isinstance(d, FusedDrafter) else d
