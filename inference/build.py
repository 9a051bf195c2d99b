"""From a recipe and a checkpoint folder to a ready engine: drafter, tree, budget, sampling.

    target, tok = load_target(cfg.target)
    setup = build_engine(cfg, "runs/smollm2-135m/medusa", target, tok)   # None: untrained heads
    out = setup.engine.generate([ids], max_new_tokens=128)

The method comes from the recipe (`medusa:` or `eagle:` section); `layer_skip=N` uses the target's
first N layers as the drafter instead (self-speculation, no checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from headway.config import Config
from headway.inference.cost import choose_budget, measure_verify_cost
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
from headway.sampling import SamplingParams
from headway.target import stop_token_ids


@dataclass
class EngineSetup:
    engine: SpecEngine
    target: object  # the model the engine verifies with (Medusa-2: LoRA merged into the target)
    method: str
    info: dict = field(default_factory=dict)  # tree, budget, its source, cost curve, ... for the report
    accuracies: list[list[float]] | None = None  # what tree_budget: auto and static trees were built from
    depth: int = 0


def load_drafter(cfg: Config, checkpoint: str | None, target, layer_skip: int | None = None):
    """(drafter, target, method, max_depth, notes). Medusa-2 checkpoints merge their LoRA into the target."""
    from headway.inference.drafters import EagleTreeDrafter, MedusaDrafter, ModelDrafter
    from headway.inference.drafters import layer_skip as make_layer_skip

    inf = cfg.inference
    dtype = next(target.parameters()).dtype
    notes = []
    if layer_skip:
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
                notes.append("Medusa-2: LoRA merged into the target; outputs are the adapted model's")
        heads = heads.to(dtype=dtype).eval()
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
        return EagleTreeDrafter(d, inf.children), target, f"eagle{d.config.version}", None, notes
    raise ValueError(
        f"{cfg.source_file}: the recipe has neither a medusa: nor an eagle: section; nothing to draft with"
    )


def build_engine(
    cfg: Config,
    checkpoint: str | None,
    target,
    tokenizer,
    layer_skip: int | None = None,
    curve: dict[int, float] | None = None,
    log=print,
) -> EngineSetup:
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
            cands = tuple(
                n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 127) if n <= inf.max_budget
            )
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
    sampling = SamplingParams(inf.temperature, inf.top_p, inf.sample_top_k)
    engine = SpecEngine(
        target,
        drafter,
        spec,
        sampling,
        acceptance=inf.acceptance,
        eos_ids=stop_token_ids(target, tokenizer),  # stop where `generate` stops
        pad_id=tokenizer.pad_token_id or 0,
        typical_threshold=inf.typical_threshold,
        typical_alpha=inf.typical_alpha,
    )
    info.update({"tree": spec.describe(), "budget": budget, "budget_source": source})
    return EngineSetup(engine, target, method, info, accuracies, depth)


def retune_budget(
    setup: EngineSetup, curve: dict[int, float], draft_cost: float, max_budget: int = 127
) -> None:
    """Re-choose an auto budget now that the drafter's own cost per step is measured: a drafter that
    costs a constant per step makes verifying a few more nodes relatively cheaper."""
    spec = setup.engine.spec
    cands = tuple(n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 127) if n <= max_budget)
    budget, table = choose_budget(curve, setup.accuracies, setup.depth, cands, draft_cost=draft_cost)
    if spec.kind == "static":
        setup.engine.spec = TreeSpec("static", build_tree(setup.accuracies, budget, max_depth=setup.depth))
    else:
        setup.engine.spec = TreeSpec("dynamic", depth=spec.depth, top_k=spec.top_k, budget=budget)
    setup.info.update(
        {
            "tree": setup.engine.spec.describe(),
            "budget": budget,
            "budget_table": table,
            "draft_cost_s": draft_cost,
            "budget_source": setup.info["budget_source"]
            + f" and a measured draft cost of {1000 * draft_cost:.1f} ms/step",
        }
    )
