"""The distiller's conversations as generator jobs, and the shards they complete.

    shard = ShardWork(k, n_conversations, on_complete)
    job = ConversationJob(conv, first_ids, tok, settings, shard)   # a headway.data.generate.Job
    backend.run(jobs)        # shard.on_complete(shard) once its last conversation is done

A conversation is answered turn by turn, earlier answers in context: each next turn's ids are the ids
so far (the generated ids verbatim) plus the template text that follows the last answer
(headway.data.chat.next_turn_ids). A turn that cannot be built, or would not fit the model's positions,
ends the conversation there (counted in the shard's `skipped`). The row's loss mask is 1 exactly on
the generated ids. A conversation that carries the target's own answer to its first turn (written while
its next user turn was, headway.data.magpie) starts at its second turn, that answer fed as given.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from headway.data.chat import next_turn_ids
from headway.data.generate import Answer, Turn
from headway.data.sources import Conversation


@dataclass(frozen=True)
class TurnSettings:
    max_new_tokens: int
    max_context: int  # the model's positions
    seed: int  # data.seed


@dataclass
class ShardWork:
    """One resumable shard: its conversations' rows (in order) and features, complete when all are done."""

    index: int
    size: int
    on_complete: Callable[[ShardWork], None]
    rows: list[dict | None] = field(default_factory=list)
    features: list[dict[str, torch.Tensor] | None] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    gen_tokens: int = 0
    done: int = 0

    def __post_init__(self):
        self.rows = [None] * self.size
        self.features = [None] * self.size

    def finish(self, slot: int, row: dict, features: dict[str, torch.Tensor] | None) -> None:
        self.rows[slot], self.features[slot] = row, features
        self.done += 1
        if self.done == self.size:
            self.on_complete(self)


class ConversationJob:
    def __init__(self, conv: Conversation, first_ids: list[int], tok, settings: TurnSettings, shard: ShardWork, slot: int):
        self.conv, self.tok, self.settings, self.shard, self.slot = conv, tok, settings, shard, slot
        self.first_ids = first_ids
        self._restart()
        if conv.first_answer is not None:  # the target answered this context already: feed, do not generate
            given = Answer(list(conv.first_answer["tokens"]), conv.first_answer["finished"])
            if self._take(given)[0] is None:  # no next turn to generate after it: answer the first turn here
                self._restart()

    def _restart(self) -> None:
        self.context = self.first_ids  # the ids the current turn answers
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.messages = [{"role": "user", "content": self.conv.turns[0]}]
        self.turns = 0  # answered so far
        self.finished = True

    def _turn(self) -> Turn:
        """The current turn, seeded by the conversation and turn alone (never by its batch)."""
        return Turn(self.context, zlib.crc32(f"{self.settings.seed}:{self.conv.prompt_id}:{self.turns}".encode()))

    def first_turn(self) -> Turn:
        return self._turn()

    def answered(self, answer: Answer) -> Turn | None:
        self.shard.gen_tokens += len(answer.tokens)
        turn, why = self._take(answer)
        if why is not None:
            self.shard.skipped[why] += 1
        return turn

    def _take(self, answer: Answer) -> tuple[Turn | None, str | None]:
        """Append the answer; the next turn (None when the conversation ends there), and why it ended early."""
        self.mask += [0] * (len(self.context) - len(self.ids)) + [1] * len(answer.tokens)
        self.ids = self.context + answer.tokens
        self.finished &= answer.finished
        self.turns += 1
        text = self.tok.decode(answer.tokens[:-1] if answer.finished else answer.tokens, skip_special_tokens=False)
        self.messages.append({"role": "assistant", "content": text})
        if self.turns >= len(self.conv.turns):
            return None, None
        self.messages.append({"role": "user", "content": self.conv.turns[self.turns]})
        ctx = next_turn_ids(self.tok, self.messages, self.ids, answer.finished)
        if ctx is None:
            return None, "later turn dropped: chat template does not render the answer verbatim"
        if len(ctx) + self.settings.max_new_tokens > self.settings.max_context:
            return None, "later turn dropped: context would exceed the model's max positions"
        self.context = ctx
        return self._turn(), None

    def done(self, features: dict[str, torch.Tensor] | None) -> None:
        c = self.conv
        row = {
            "input_ids": self.ids,
            "loss_mask": self.mask,
            "domain": c.domain,
            "source": c.source,
            "prompt_id": c.prompt_id,
            "num_turns": self.turns,
            "finished": self.finished,
        }
        self.shard.finish(self.slot, row, features)


class ShardClock:
    """Seconds per shard when shards overlap (continuous batching runs into the next shard before one
    ends): each shard is charged the wall time since the previous shard finished, so they sum to the run."""

    def __init__(self):
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        return seconds
