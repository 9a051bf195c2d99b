"""Prompts the target writes itself ("Magpie": Xu et al., 2024, arXiv:2406.08464).

Shown only its chat template up to where a user turn's text begins, an instruction-tuned model writes a
plausible user turn, ending it with the template's end-of-turn token. A user with no prompt data at all
can so still train a drafter:

    - {kind: self_written, domain: writing, num_prompts: 400, task: "Users ask for help writing stories and emails."}
    - {kind: self_written, domain: chat, num_prompts: 300, turns: 2}   # a follow-up after the target's own answer

`task` goes in the system turn while the target writes (the template's default system turn otherwise);
the answers are generated later with the template's default, as at evaluation. With `turns: 2` the
target answers its first turn (greedy or sampled as data.generation says) and then writes the next user
turn with that answer in view; the distiller answers both turns again, turn by turn. Written turns are
stripped, length-filtered (min_words..max_words), deduplicated after normalising case and punctuation,
and checked against the evaluation questions.

The result is cached in <data.output_dir>/self_written/<source>.json, progress saved after every
batch: the folder's identity already holds the source settings and the target, so an interrupted run
resumes where it stopped and a rerun writes nothing again.
"""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter
from pathlib import Path

from headway.config import DataConfig, SourceConfig
from headway.data.generate import generate_batch
from headway.data.overlap import eval_overlap, words
from headway.target import stop_token_ids

SENTINEL = "\ue000headway-user-turn\ue000"  # private-use characters: no template writes them
ROWS = 128  # rows per generate call: fixed, so the written prompts do not depend on generation.batch_size;
# large, so the continuous-batching generator keeps a batch of 64 full instead of draining every call
MAX_TRIES = 4  # candidates written per wanted prompt before a source gives up
FOLLOW_UP_TRIES = 3


def user_turn_prefix(tok, history: list[dict] = (), system: str | None = None) -> tuple[str, str]:
    """The template text up to where the next user turn's content begins, and the text that closes that turn.

    Rendered with a sentinel user message and cut at it, so whatever the template writes first (a BOS,
    a default system turn such as SmolLM2's) is kept exactly.
    """
    messages = ([{"role": "system", "content": system}] if system else []) + list(history)
    messages.append({"role": "user", "content": SENTINEL})
    try:
        text = tok.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # templates that refuse a system turn, or a given role order
        raise ValueError(f"the chat template cannot render {[m['role'] for m in messages]}: {e}") from e
    if text.count(SENTINEL) != 1:
        raise ValueError("the chat template does not render a user turn's text verbatim: self_written prompts need it")
    before, _, after = text.partition(SENTINEL)
    return before, after


class TurnFilter:
    """Why a written turn is unusable (None: usable); `keep` remembers a turn, to refuse its duplicates."""

    def __init__(self, src: SourceConfig):
        self.src, self.seen, self.overlap = src, set(), eval_overlap()

    def reason(self, text: str | None) -> str | None:
        if text is None:
            return "not ended within max_tokens"
        n = len(text.split())
        if n < self.src.min_words:
            return f"fewer than min_words={self.src.min_words} words"
        if n > self.src.max_words:
            return f"more than max_words={self.src.max_words} words"
        key = " ".join(words(text))
        if key in self.seen:
            return "duplicate (after normalising case and punctuation)"
        if self.overlap.hits(text):
            return "shares a 13-word window with an evaluation question"
        return None

    def keep(self, text: str) -> None:
        self.seen.add(" ".join(words(text)))


class PromptWriter:
    """Writes (or reads back from its cache) the conversations of self_written sources.

    Called by headway.data.sources.load_conversations as writer(src, name, n).
    """

    def __init__(self, model, tok, cache_dir: Path, data: DataConfig, log=print):
        self.model, self.tok, self.cache_dir, self.data, self.log = model, tok, Path(cache_dir), data, log
        self.answer_stops = stop_token_ids(model, tok)
        self.skipped: Counter = Counter()  # rejected written turns, by source and reason

    def __call__(self, src: SourceConfig, name: str, n: int) -> list[list[str]]:
        done = self.cache_dir / f"{name}.json"
        if not done.is_file():
            self._write(src, name, n, done)
        result = json.loads(done.read_text())
        self.skipped.update({f"{name}: written turn dropped, {k}": v for k, v in result["rejected"].items()})
        if len(result["conversations"]) < n:
            self.skipped[f"{name}: fewer prompts written than num_prompts"] += n - len(result["conversations"])
        return result["conversations"]

    # ------------------------------------------------------------ writing

    def _write(self, src: SourceConfig, name: str, n: int, done: Path) -> None:
        progress_path = self.cache_dir / f"{name}.progress.json"
        state = {"calls": 0, "first": [], "rejected": {}, "conversations": []}
        if progress_path.is_file():
            state = json.loads(progress_path.read_text())
            self.log(f"{name}: resuming self-written prompts ({len(state['first'])} of {n} first turns written)")
        rejected, turns = Counter(state["rejected"]), TurnFilter(src)
        for t in state["first"]:
            turns.keep(t)
        prefix, closing = user_turn_prefix(self.tok, system=src.task)
        prefix_ids = self.tok(prefix, add_special_tokens=False)["input_ids"]
        max_calls = math.ceil(MAX_TRIES * n / ROWS)
        while len(state["first"]) < n and state["calls"] < max_calls:
            seed = self._seed(name, "first", state["calls"])
            for text in self._sample([prefix_ids] * ROWS, closing, src, seed):
                why = turns.reason(text)
                rejected.update([why] if why else [])
                if not why and len(state["first"]) < n:
                    state["first"].append(text)
                    turns.keep(text)
            state["calls"] += 1
            state["rejected"] = dict(rejected)
            _save(progress_path, state)
            self.log(f"{name}: {len(state['first'])} of {n} first turns written ({sum(rejected.values())} dropped)")
        if src.turns > 1:
            self._follow_ups(src, name, state, turns, rejected, progress_path)
        convs = state["conversations"] if src.turns > 1 else [[t] for t in state["first"]]
        _save(done, {"conversations": convs, "rejected": dict(rejected)})
        progress_path.unlink(missing_ok=True)
        self.log(f"{name}: {len(convs)} self-written conversations ({sum(rejected.values())} written turns dropped)")

    def _follow_ups(self, src, name, state, turns: TurnFilter, rejected: Counter, progress_path: Path) -> None:
        """Answer each conversation, then let the target write the next user turn; ROWS conversations a step."""
        for t in (t for c in state["conversations"] for t in c[1:]):
            turns.keep(t)
        for b in range(len(state["conversations"]), len(state["first"]), ROWS):
            chats = [[{"role": "user", "content": t}] for t in state["first"][b : b + ROWS]]
            for turn in range(1, src.turns):
                live = [c for c in chats if c[-1]["role"] == "user"]  # the last follow-up was written
                for c, answer in zip(live, self._answer(live, self._seed(name, f"answer{turn}", b)), strict=True):
                    c.append({"role": "assistant", "content": answer})
                for c, text in zip(live, self._follow_up_turns(live, src, name, f"{turn}:{b}", turns, rejected), strict=True):
                    if text is not None:
                        c.append({"role": "user", "content": text})
            state["conversations"] += [[m["content"] for m in c if m["role"] == "user"] for c in chats]
            state["rejected"] = dict(rejected)
            _save(progress_path, state)
            self.log(f"{name}: {len(state['conversations'])} of {len(state['first'])} conversations followed up")

    def _answer(self, chats: list[list[dict]], seed: int) -> list[str]:
        """The target's answer to each conversation (ending with a user turn), as data.generation says."""
        gen = self.data.generation
        ids = [
            self.tok(self.tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
            for m in chats
        ]
        out = generate_batch(
            self.model, ids, gen.max_new_tokens, self.answer_stops, self.tok.pad_token_id, gen.temperature, gen.top_p, seed=seed,
            batch_size=gen.batch_size,
        )
        return [self.tok.decode(_without_stop(a, self.answer_stops), skip_special_tokens=True).strip() for a in out]

    def _follow_up_turns(self, chats, src, name, step: str, turns: TurnFilter, rejected: Counter) -> list[str | None]:
        """The next user turn of each conversation (ending with an answer); None where no try was usable."""
        prefixes = [user_turn_prefix(self.tok, c, src.task) for c in chats]
        ids = [self.tok(p, add_special_tokens=False)["input_ids"] for p, _ in prefixes]
        written: list[str | None] = [None] * len(chats)
        for attempt in range(FOLLOW_UP_TRIES):
            todo = [i for i, w in enumerate(written) if w is None]
            if not todo:
                break
            texts = self._sample([ids[i] for i in todo], prefixes[0][1], src, self._seed(name, f"turn{step}", attempt))
            for i, text in zip(todo, texts, strict=True):
                why = turns.reason(text)
                rejected.update([why] if why else [])
                if not why:
                    written[i] = text
                    turns.keep(text)
        return written

    def _sample(self, prompts: list[list[int]], closing: str, src: SourceConfig, seed: int) -> list[str | None]:
        """Sampled user turns, cut at the end-of-turn; None for one not ended within src.max_tokens."""
        stops = set(self.answer_stops)
        closing_ids = self.tok(closing, add_special_tokens=False)["input_ids"]
        if closing_ids and closing_ids[0] in set(self.tok.all_special_ids):
            stops.add(closing_ids[0])  # the token that ends a user turn (<|im_end|>, <|eot_id|>, ...)
        out = generate_batch(
            self.model, prompts, src.max_tokens, stops, self.tok.pad_token_id, src.temperature, src.top_p, seed=seed,
            batch_size=self.data.generation.batch_size,  # per-prompt seeds: the batch size changes no sample
        )
        markers = [m for m in [*self.tok.all_special_tokens, closing.strip()] if m]
        texts = []
        for a in out:
            text = self.tok.decode(_without_stop(a, stops), skip_special_tokens=False)
            cut = min((i for i in (text.find(m) for m in markers) if i >= 0), default=-1)
            texts.append(text[:cut].strip() if cut >= 0 else text.strip() if a.finished else None)
        return texts

    def _seed(self, name: str, stage: str, step: int) -> int:
        return zlib.crc32(f"{self.data.seed}:{name}:{stage}:{step}".encode())


def _without_stop(answer, stops: set[int]) -> list[int]:
    return answer.tokens[:-1] if answer.finished and answer.tokens and answer.tokens[-1] in stops else answer.tokens


def _save(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False))
    tmp.replace(path)  # atomic: a killed run never leaves half a file
