"""Shared setup of the fp32 losslessness tests on the real SmolLM2 (tests/test_lossless_*.py).

20 Spec-Bench prompts over all six domains (first turns), plain greedy answers from HF
`generate` at batch 1 as the reference; the engine must reproduce them token for token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headway.data.chat import first_turn_ids
from headway.heads.vocab import DraftVocab
from headway.inference.allocation import NodePlanner
from headway.inference.drafters import FusedDrafter, LookupDrafter
from headway.inference.engine import SpecEngine
from headway.inference.gpu_check import echo_drafter  # noqa: F401 (re-exported for the tests)
from headway.inference.questions import load_questions
from headway.inference.trees import DEFAULT_ACCURACIES, DRAFTER_DEFAULT_ACCURACIES, TreeSpec, default_tree

ROOT = Path(__file__).resolve().parents[1]
MAX_NEW = 16
PER_DOMAIN = {"multi_turn": 4, "translation": 4, "summarization": 3, "qa": 3, "math_reasoning": 3, "rag": 3}
EOS = 2
# The trees the trained-drafter modules verify (the scripted drafter's are deeper).
SPECS = {
    "static": TreeSpec("static", default_tree(10, depth=4)),
    "dynamic": TreeSpec("dynamic", depth=4, top_k=4, budget=10),
}


def recipe_vocab(size: int = 8192) -> DraftVocab:
    """A reduced draft vocabulary of the low BPE ids, the common tokens, as the SmolLM2 recipes keep
    (EAGLE-3: 8,192 ids; Medusa-1: 4,096)."""
    return DraftVocab(torch.arange(size, dtype=torch.int64), 49152)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small ops on 2 threads stall badly when other processes share the cores; 1 thread is steady.
    Import this fixture into a test module to use it there."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def prompts(tok) -> list[list[int]]:
    """The shortest first turns of each domain (summarization and RAG prompts run to 1,600 tokens;
    prefill time is not what these tests measure), interleaved so batches mix domains."""
    by_domain: dict[str, list[list[int]]] = {}
    for q in load_questions(ROOT / "data/prompts/spec_bench/question.jsonl"):
        by_domain.setdefault(q.domain, []).append(first_turn_ids(tok, q.turns[0]))
    assert set(by_domain) == set(PER_DOMAIN)
    picked = {d: sorted(v, key=len)[: PER_DOMAIN[d]] for d, v in by_domain.items()}
    out = []
    while any(picked.values()):
        for d in PER_DOMAIN:
            if picked[d]:
                out.append(picked[d].pop(0))
    assert len(out) == 20
    return out


def reference_case(model, tok) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts and their plain greedy answers, at one thread as the modules run (the `lossless_case`
    fixture in conftest.py computes this once for every module)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ids = prompts(tok)
        return ids, plain_greedy(model, ids)
    finally:
        torch.set_num_threads(n)


@torch.inference_mode()
def plain_greedy(model, ids_list: list[list[int]]) -> list[list[int]]:
    refs = []
    for ids in ids_list:
        x = torch.tensor([ids])
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            eos_token_id=EOS,
            pad_token_id=EOS,
        )
        toks = out[0, len(ids) :].tolist()
        refs.append(toks[: toks.index(EOS) + 1] if EOS in toks else toks)
    return refs


def check_lossless(model, drafter, spec, ids_list, refs, batch: int, *, min_accepted: int) -> int:
    """Runs the engine over all prompts in batches; asserts equality, and that at least `min_accepted`
    draft tokens were accepted (a drafter that is never right would leave acceptance untested)."""
    engine = SpecEngine(model, drafter, spec, eos_ids={EOS})
    accepted = 0
    scripted = getattr(drafter, "trained", drafter)  # a fused drafter's own drafter
    for i in range(0, len(ids_list), batch):
        if hasattr(scripted, "start"):
            scripted.start(i)
        out = engine.generate(ids_list[i : i + batch], MAX_NEW)
        for j, toks in enumerate(out.tokens):
            assert toks == refs[i + j], (
                f"prompt {i + j} (batch {batch}): speculative {toks} != plain {refs[i + j]}"
            )
        accepted += sum(map(sum, out.accepted))
    assert accepted >= min_accepted, f"only {accepted} draft tokens accepted (batch {batch}), expected >= {min_accepted}"
    return accepted


def fused(drafter, spec) -> FusedDrafter:
    """`drafter`'s trees with prompt-lookup candidates merged in; the trained share resized per step."""
    acc = DEFAULT_ACCURACIES if spec.kind == "static" else DRAFTER_DEFAULT_ACCURACIES
    lookup = LookupDrafter(max_ngram=3, min_ngram=1, max_tokens=6, num_candidates=3)
    planner = NodePlanner(acc, spec.num_nodes, spec.max_depth, lookup.max_tokens)
    return FusedDrafter(drafter, lookup, planner, acc)


def check_fused(drafter: FusedDrafter) -> None:
    """Lookup nodes were verified beside the drafter's and some of their tokens accepted (not a vacuous test)."""
    t = drafter.totals
    assert t["lookup_nodes"] > 0 and t["lookup_tokens"] > 0, t


class ScriptedDrafter:
    """A drafter that knows plain greedy's continuation and proposes it with errors: cheap to run,
    often right (long accepted paths, ragged rows), sometimes wrong (rejections at every depth).

    Along the tree, a node whose path so far is correct gives the true next token a high logit,
    except with probability `error` per node; everything else is noise. Works for static (ranks)
    and dynamic trees through the same growth functions as real drafters.
    """

    def __init__(self, sequences: list[list[int]], vocab_size: int, error: float = 0.25, seed: int = 0):
        self.sequences, self.vocab_size, self.error = sequences, vocab_size, error
        self.gen = torch.Generator().manual_seed(seed)
        self.rows: list[int] | None = None
        self.offset = 0

    def feature_spec(self):
        from headway.features import FeatureSpec

        return FeatureSpec()

    def reset(self):
        self.rows, self.root_pos = None, None

    def start(self, first_prompt_index: int):
        self.offset = first_prompt_index  # batch row r is prompt offset + r

    def observe(self, acc):
        if self.rows is None:
            self.rows = [self.offset + r for r in range(acc.tokens.shape[0])]
        self.root_pos = acc.positions.masked_fill(~acc.valid, -1).max(-1).values + 1

    def select_rows(self, keep):
        self.rows = [self.rows[i] for i in keep.tolist()]
        self.root_pos = self.root_pos[keep]

    def _true(self, row: int, pos: int) -> int:
        seq = self.sequences[self.rows[row]]
        return seq[pos] if pos < len(seq) else -1

    def draft(self, root, spec, sampling, generator):
        from headway.inference.grow import grow_dynamic, grow_static

        B = root.shape[0]
        correct = [[True] * B]  # per expanded node (0: the root), per row: is its path the true one?

        def expand(tokens, parents, d):
            logits = torch.randn(B, tokens.shape[1], self.vocab_size, generator=self.gen)
            for f in range(tokens.shape[1]):
                col = []
                for b in range(B):
                    pos = int(self.root_pos[b]) + d  # the node's own position
                    ok = d == 0 or (
                        correct[int(parents[b, f])][b] and int(tokens[b, f]) == self._true(b, pos)
                    )
                    col.append(ok)
                    nxt = self._true(b, pos + 1)
                    if ok and nxt >= 0 and float(torch.rand(1, generator=self.gen)) > self.error:
                        logits[b, f, nxt] = 10.0
                if d:
                    correct.append(col)
            return logits

        if spec.kind == "static":
            return grow_static(expand, root, spec.tree, sampling, generator)
        return grow_dynamic(expand, root, spec.depth, spec.top_k, spec.budget)
