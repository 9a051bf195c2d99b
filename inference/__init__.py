"""Tree verification: drafting interface, trees, acceptance rules, the decoding engine, reports.

    python scripts/evaluate.py --config configs/smollm2-135m/medusa.yaml --checkpoint runs/smollm2-135m/medusa
    python scripts/bench_batch.py --config configs/smollm2-135m/eagle3.yaml --checkpoint DIR --batch-sizes 1 4 8

Modules, one job each:
- `drafter`: the Protocol every head implements (observe accepted tokens + the target's features,
  draft a tree of candidates with their q); `drafters/`: Medusa, EAGLE-1/3, any small LM, layer-skip,
  prompt lookup (`lookup`), and `fused`: a trained drafter's tree with lookup candidates merged in.
- `allocation`: per step, how a fused tree's nodes are split between the two sources (online
  per-depth acceptance, the measured verify cost).
- `trees`: static trees as Medusa path lists, chains, the optimal tree for measured head accuracies.
- `layout`: a tree's tensor tables (`TreeLayout` for verification, `DraftTables` for filling a
  static tree), built once per static tree and device.
- `grow`: filling a static tree by rank, or growing an EAGLE-2 dynamic tree, from a drafter's
  next-token function.
- `acceptance`: greedy, lossless speculative sampling over a tree, Medusa's typical acceptance
  (NOT lossless).
- `engine`: prefill -> draft -> one target forward over the tree (float 4-D mask, explicit
  positions, the model's own cache) -> accept -> keep only the accepted path's KV; batches with
  ragged acceptance. Cache surgery lives in `headway.kv`, sampling in `headway.sampling`.
- `cost`: the target's measured verify-cost curve and the node budget (and, for per-level drafters,
  the depth) it implies (`tree_budget: auto`), and the accuracy profile fitted to observed acceptance.
- `calibration`: the trained drafter's draft cost and accepted length on a few generic prompts, which
  the auto budget is retuned with at start-up.
- `build`: recipe + checkpoint -> engine(s), one per drafting mode. `questions`, `report`: Spec-Bench
  domains and the report (a row per method and domain); `evaluate`: the run behind it.
- `head_accuracy`, `unrolled_accuracy`: measured per-depth accuracy profiles of Medusa and EAGLE heads.
- `exactness`: the chi-square test of lossless sampling; `gpu_check`: the check scripts/gpu_check.sh runs.
"""
