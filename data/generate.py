"""Continuous batching for self-distillation: `batch_size` rows stay busy until the prompts run out.

    gen = Generator(model, batch_size=32, max_new_tokens=256, eos_ids={2})
    gen.run(jobs)                  # jobs: `Job`s (a conversation each), answered turn by turn
    generate_batch(model, prompts, 64, {2}, pad_id)   # one answer per prompt (benchmarks, tests)
    answer_stream(model, turns, 64, {2}, on_answer)   # the same over a lazy iterable (Magpie's writer)

Each row of the batch holds one conversation. When its answer ends (EOS or max_new_tokens) the row
hands it to its job, which returns the next turn (the ids so far, answers verbatim, plus the next
user turn) or None. The row then continues in place, prefilling only the new tokens (the history's
keys and values are in its slots already), or takes the next job from the queue: rows do not wait for
the slowest answer of a batch, and no turn recomputes its history. Free rows are refilled a few at a
time (once batch_size // REFILL_FRACTION are free), so that one prefill forward takes several prompts.

The KV cache is a preallocated `SlotCache` (headway/kv.py): row r's tokens sit in slots 0..len_r - 1
(slot = position), an additive float mask marks each row's valid slots, a decode step writes one slot
per row in place (no torch.cat of the whole cache each step) and attends group by group (rows in
groups of GROUP_ROWS, each group's buffers as wide as its longest row; `decode_attention`). Every
SORT_EVERY decode steps the rows are sorted by length when that cuts the slots a step reads by more
than SORT_GAIN, so short rows stop paying for long ones. New prompts and next turns are prefilled right-padded, grouped by length; their
padding writes garbage past the row's length, masked and later overwritten. Logits are computed only
at each row's last position (the decoder, then lm_head on those hidden states).

A finished row keeps its first KEEP_SLOTS tokens' keys and values where they are (and their features):
the row's next prompt starts past the tokens it shares with them, at least MIN_REUSE. Chat prompts all
begin with the template's system turn (24 of SmolLM2's tokens, about a sixth of the default mix's prompt
tokens), and a Magpie writer's prompts are identical, so most prefills skip their first tokens. A
token's keys depend only on the tokens before it, so the kept keys are those a fresh prefill would write
(up to rounding: the prompt's later tokens read them through a gathered copy; answers and features are
tested against a fresh forward in fp32).

Greedy output equals `model.generate` on the prompt alone in fp32 (tested). In bf16 a batched forward
rounds differently from a batch-1 one, so a token at a near-tie can differ. Sampling draws from a
generator seeded per turn (`Turn.seed`): a row's samples do not depend on which rows share its batch.

Features: with a `FeatureSpec`, the generator keeps those hidden states at every position it feeds
(prompt positions from prefills, generated ones from decode steps; the last generated token is fed
once more for its features, its logits unused) and hands each finished job its features, {feature_key:
[len, h]}, equal to those of a fresh forward over the finished sequence (tested).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from headway.features import FeatureSpec, LayerCapture, feature_key
from headway.kv import GROUP_ROWS, SlotCache, cache_kwarg, decode_attention, decode_reads
from headway.sampling import SamplingParams, sample_rows, warp

PREFILL_PADDING = 1.25  # a prefill group's padded tokens may exceed its real tokens by this factor
PREFILL_TOKENS = 2048  # at most this many (padded) tokens per prefill forward (HF prefill is fastest near 2,048: prefill_chunks.py)
SORT_EVERY = 16  # decode steps between checks whether sorting the rows into groups pays
SORT_GAIN = 0.15  # sort when it cuts a decode step's slot reads by more than this
REFILL_FRACTION = 8  # refill once batch_size // this many rows are free: prefill several prompts per forward
KEEP_SLOTS = 128  # a finished row keeps its first tokens' keys in its slots (and their features) for the next prompt
MIN_REUSE = 8  # ... which reuses them from this many shared tokens (a prefill past slot 0 gathers its keys: a copy)


@dataclass
class Answer:
    tokens: list[int]  # generated ids, the stopping EOS included when one was produced
    finished: bool  # False: stopped at max_new_tokens


@dataclass
class Turn:
    ids: list[int]  # the whole context: earlier turns (answers verbatim), this user turn, the generation prompt
    seed: int = 0  # seeds this turn's sampling (greedy ignores it)


class Job(Protocol):
    """One conversation, answered turn by turn."""

    def first_turn(self) -> Turn: ...

    def answered(self, answer: Answer) -> Turn | None:
        """The answer to the last turn; returns the next turn, or None when the conversation is over."""

    def done(self, features: dict[str, torch.Tensor] | None) -> None:
        """The conversation is over; features at every position of its last context + answer (or None)."""


@dataclass
class _Row:
    job: Job
    pending: list[int]  # what the next forward feeds
    gen: torch.Generator | None
    fed: list[int] = field(default_factory=list)  # tokens whose keys and values are in the row's slots
    answer: list[int] = field(default_factory=list)
    feats: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    closing: bool = False  # feeding its last token for that token's features only


@dataclass
class _Kept:
    """What a finished conversation leaves in its row's slots 0..len(tokens) - 1 for the row's next one."""

    tokens: list[int]
    feats: dict[str, torch.Tensor]  # feature key -> [len(tokens), h], on the model's device (empty: no capture)


class Generator:
    def __init__(
        self,
        model,
        batch_size: int,
        max_new_tokens: int,
        eos_ids: set[int],
        sampling: SamplingParams | None = None,
        capture: FeatureSpec | None = None,
        on_answer=None,
    ):
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError(f"batch_size and max_new_tokens must be at least 1, got {batch_size} and {max_new_tokens}")
        if capture is not None and capture.logits:
            raise ValueError("the generator keeps hidden states, not logits (V floats per token)")
        self.model, self.decoder, self.lm_head = model, model.get_decoder(), model.get_output_embeddings()
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        # A prefill forward over one short prompt runs at about half the tokens/s of one over several
        # (session seven, model-167 CPU), so free rows wait (fed a dummy token) until a few can be refilled
        # together; the decode steps they sit out cost less than the prefill forwards they save.
        self.refill_rows = max(1, batch_size // REFILL_FRACTION)
        self.eos = set(eos_ids)
        self.sampling = sampling or SamplingParams()
        self.capture = capture
        self.on_answer = on_answer  # called with each Answer (progress bars)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.reused_tokens = 0  # prompt tokens whose keys (and features) a row kept from its last conversation
        self._kept: list[_Kept | None] = []

    # ------------------------------------------------------------ the loop

    @torch.inference_mode()
    def run(self, jobs: Iterable[Job]) -> None:
        queue: Iterator[Job] | None = iter(jobs)
        rows: list[_Row | None] = [None] * self.batch_size
        self._kept = [None] * self.batch_size  # per row: what its last conversation left in its slots
        cache = SlotCache(self.batch_size, capacity=0, group_rows=GROUP_ROWS)
        since_sort = 0
        with decode_attention(self.model) as cache.grouped:
            while True:
                free = [i for i, r in enumerate(rows) if r is None]
                if queue is not None and free and (len(free) >= self.refill_rows or len(free) == len(rows)):
                    for i in free:
                        job = next(queue, None)
                        if job is None:
                            queue = None
                            break
                        rows[i], self._kept[i] = self._start(job, job.first_turn(), kept=self._kept[i]), None
                if queue is None and None in rows:  # nothing left to refill with: drop the empty rows
                    keep = [i for i, r in enumerate(rows) if r is not None]
                    if not keep:
                        return
                    cache.select(torch.tensor(keep, device=self.device))
                    rows, self._kept = [rows[i] for i in keep], [self._kept[i] for i in keep]
                prefill = [i for i, r in enumerate(rows) if r is not None and len(r.pending) > 1]
                for group in _prefill_groups(prefill, [len(rows[i].pending) for i in prefill]):
                    self._advance(rows, group, self._feed(cache, rows, group))
                if all(r is None or len(r.pending) == 1 for r in rows):  # None: a free row waiting for a refill
                    since_sort += 1
                    order = _regroup_order([self._start_slot(i, r) + 1 for i, r in enumerate(rows)], cache.group_rows) if since_sort >= SORT_EVERY else None
                    if order is not None:  # rows of similar length share a group: decode reads less padding
                        cache.select(torch.tensor(order, device=self.device))
                        rows, self._kept, since_sort = [rows[i] for i in order], [self._kept[i] for i in order], 0
                    everyone = list(range(len(rows)))
                    self._advance(rows, everyone, self._feed(cache, rows, None))

    def _start(self, job: Job, turn: Turn, row: _Row | None = None, kept: _Kept | None = None) -> _Row:
        """The row for this turn: `row` continued (a next turn), or a new row, which starts past the
        tokens it shares with what its slots `kept` from their last conversation (the chat template's
        system turn, a Magpie writer's whole prompt): those keys are already in place."""
        if not turn.ids:
            raise ValueError("a turn's context is empty: every prompt needs at least one token")
        gen = None
        if not self.sampling.greedy:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(turn.seed)
        if row is not None and turn.ids[: len(row.fed)] == row.fed and len(turn.ids) > len(row.fed):
            row.pending, row.gen, row.answer = turn.ids[len(row.fed) :], gen, []  # the next turn extends the row
            return row
        ids = list(turn.ids)
        n = 0 if kept is None else _shared(kept.tokens, ids, len(ids) - 1)  # at least one token to feed
        if n < MIN_REUSE:
            return _Row(job, ids, gen)
        self.reused_tokens += n
        return _Row(job, ids[n:], gen, fed=ids[:n], feats={key: [t[:n]] for key, t in kept.feats.items()})

    def _start_slot(self, i: int, row: _Row | None) -> int:
        """Where row i's next forward writes: past its fed tokens, or, while free, past what it keeps."""
        if row is not None:
            return len(row.fed)
        kept = self._kept[i]
        return 0 if kept is None else len(kept.tokens)

    def _finish(self, rows: list[_Row | None], i: int, features: dict[str, torch.Tensor] | None) -> None:
        """Row i's conversation is over: hand over its features, keep its first slots for the next one."""
        row = rows[i]
        row.job.done(None if features is None else {key: t.cpu() for key, t in features.items()})
        n = min(len(row.fed), KEEP_SLOTS)
        self._kept[i] = _Kept(row.fed[:n], {key: t[:n].clone() for key, t in (features or {}).items()})
        rows[i] = None

    def _feed(self, cache: SlotCache, rows: list[_Row], idx: list[int] | None) -> torch.Tensor:
        """One forward over rows idx (None: every row, one token each); returns logits [R, V] (model dtype) at
        each row's last fed position."""
        sel = rows if idx is None else [rows[i] for i in idx]
        dev = self.device
        # A free row (None) feeds a dummy token into the slot past what it keeps; its next prompt overwrites it.
        pending = [r.pending if r is not None else [0] for r in sel]
        n = max(len(p) for p in pending)
        ids = torch.tensor([p + p[-1:] * (n - len(p)) for p in pending], device=dev)
        starts = torch.tensor([self._start_slot(i, r) for i, r in zip(idx or range(len(rows)), sel, strict=True)], device=dev)
        lengths = torch.tensor([len(p) for p in pending], device=dev)
        width = cache.plan(None if idx is None else torch.tensor(idx, device=dev), starts, n)
        pos = starts[:, None] + torch.arange(n, device=dev)
        allowed = torch.arange(width, device=dev)[None, None, :] <= pos[:, :, None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=dev).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        layers = self.capture.layers if self.capture else ()
        with LayerCapture(self.decoder, layers) as captured:
            hidden = self.decoder(
                input_ids=ids, attention_mask=mask[:, None], position_ids=pos, use_cache=True,
                **cache_kwarg(self.decoder, cache),
            ).last_hidden_state
        feats = {feature_key("layer", i): captured[i] for i in layers}
        if self.capture is not None and self.capture.final_normed:
            feats[feature_key("final_normed")] = hidden
        for j, r in enumerate(sel):
            if r is None:  # a free row: its dummy token leaves nothing behind
                continue
            for key, t in feats.items():
                r.feats.setdefault(key, []).append(t[j, : len(r.pending)].clone())
            r.fed += r.pending
            r.pending = []
        last = hidden[torch.arange(len(sel), device=dev), lengths - 1]
        return self.lm_head(last)  # greedy takes the argmax as is; sampling warps in fp32

    def _advance(self, rows: list[_Row | None], idx: list[int], logits: torch.Tensor) -> None:
        """Each row of idx takes its next token from its logits row; finished rows hand over or leave."""
        if self.sampling.greedy:
            tokens = logits.argmax(-1).tolist()
        else:
            drawing = [j for j, i in enumerate(idx) if rows[i] is not None and not rows[i].closing]  # a closing row feeds, draws nothing
            tokens = [-1] * len(idx)
            if drawing:
                probs = warp(logits[drawing].float(), self.sampling)
                for j, t in zip(drawing, sample_rows(probs, [rows[idx[j]].gen for j in drawing]), strict=True):
                    tokens[j] = t
        for i, t in zip(idx, tokens, strict=True):
            row = rows[i]
            if row is None:  # a free row's dummy token
                continue
            if row.closing:  # its last token's features are in: the conversation is over
                self._finish(rows, i, {key: torch.cat(chunks) for key, chunks in row.feats.items()})
                continue
            row.answer.append(t)
            row.pending = [t]
            if t not in self.eos and len(row.answer) < self.max_new_tokens:
                continue
            answer = Answer(row.answer, finished=t in self.eos)
            if self.on_answer is not None:
                self.on_answer(answer)
            nxt = row.job.answered(answer)
            if nxt is not None:
                rows[i] = self._start(row.job, nxt, row)
            elif self.capture is not None:
                row.closing = True  # one more forward: the features of its last token
            else:
                self._finish(rows, i, None)


def _shared(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens a and b share, at most `limit`."""
    n = min(len(a), len(b), limit)
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


def _regroup_order(lengths: list[int], group_rows: int) -> list[int] | None:
    """Rows sorted by length, when that cuts a decode step's reads by more than SORT_GAIN (regrouping
    copies every row's keys and values once, about one decode step's reads); else None."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    now, sorted_ = decode_reads(lengths, group_rows), decode_reads([lengths[i] for i in order], group_rows)
    return order if now > (1 + SORT_GAIN) * sorted_ else None


def _prefill_groups(idx: list[int], lengths: list[int]) -> list[list[int]]:
    """Rows to prefill, in forwards of similar lengths: padding stays within PREFILL_PADDING of the real
    tokens and a forward within PREFILL_TOKENS (a longer single prompt goes alone)."""
    order = sorted(range(len(idx)), key=lambda k: lengths[k])
    groups: list[list[int]] = []
    real = 0
    for k in order:
        g = groups[-1] if groups else None
        # sorted ascending: the newcomer is the group's longest, so the padded size is count * its length
        if g is not None and (len(g) + 1) * lengths[k] <= min(PREFILL_PADDING * (real + lengths[k]), PREFILL_TOKENS):
            g.append(idx[k])
            real += lengths[k]
        else:
            groups.append([idx[k]])
            real = lengths[k]
    return groups


# ---------------------------------------------------------------- one answer per prompt


@dataclass
class _OneAnswer:
    index: int
    turn: Turn
    on_answer: Callable[[int, Answer], None]

    def first_turn(self) -> Turn:
        return self.turn

    def answered(self, answer: Answer) -> None:
        self.on_answer(self.index, answer)

    def done(self, features) -> None:
        pass


def answer_stream(
    model,
    turns: Iterable[Turn],
    max_new_tokens: int,
    eos_ids: set[int],
    on_answer: Callable[[int, Answer], None],
    sampling: SamplingParams | None = None,
    batch_size: int = 64,
) -> None:
    """One answer per turn; `on_answer(i, answer)` as turn i's answer ends (in finishing order, not i's).

    `turns` is read lazily, one turn whenever a row is free, so a caller can decide from the answers so
    far whether to ask for more (Magpie's writer stops once it has enough usable prompts); once it is
    exhausted, the rows still busy finish and the call returns.
    """
    jobs = (_OneAnswer(i, t, on_answer) for i, t in enumerate(turns))
    make_generator(model, batch_size, max_new_tokens, eos_ids, sampling).run(jobs)


def generate_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_ids: set[int],
    pad_id: int | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    batch_size: int | None = None,
) -> list[Answer]:
    """One answer per prompt (continuous batching over all of them); prompt i samples with a seed made
    from (seed, i). `model`: the target, or a generation server (see `make_generator`). `pad_id` is
    unused (rows are padded with their own tokens), kept for callers."""
    answers: list[Answer | None] = [None] * len(prompts)
    turns = (Turn(list(p), zlib.crc32(f"{seed or 0}:{i}".encode())) for i, p in enumerate(prompts))
    sampling = SamplingParams(temperature=temperature, top_p=top_p)
    answer_stream(model, turns, max_new_tokens, eos_ids, answers.__setitem__, sampling, batch_size or len(prompts))
    return answers


def make_generator(model, batch_size: int, max_new_tokens: int, eos_ids: set[int], sampling=None, capture=None, on_answer=None):
    """The generator for `model`: the local `Generator`, or a `ServerGenerator` when `model` is a
    headway.data.server.TokenServer (the server backend stands in for the target)."""
    from headway.data.server import ServerGenerator, TokenServer

    if isinstance(model, TokenServer):
        if capture is not None:
            raise ValueError("a generation server returns no hidden states: data.features needs the local backend")
        return ServerGenerator(model, batch_size, max_new_tokens, eos_ids, sampling, on_answer)
    return Generator(model, batch_size, max_new_tokens, eos_ids, sampling, capture, on_answer)
