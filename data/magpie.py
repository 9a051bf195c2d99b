"""Prompts the target writes itself ("Magpie": Xu et al., 2024, arXiv:2406.08464).

Shown only its chat template up to where a user turn's text begins, an instruction-tuned model writes a
plausible user turn, ending it with the template's end-of-turn token. A user with no prompt data at all
can so still train a drafter:

    - {kind: self_written, domain: writing, num_prompts: 400, task: "Users ask for help writing stories and emails."}
    - {kind: self_written, domain: chat, num_prompts: 300, turns: 2}   # a follow-up after the target's own answer

`task` goes in the system turn while the target writes (the template's default system turn otherwise);
the answers are generated later with the template's default, as at evaluation. With `turns: 2` the
target answers its first turn (greedy or sampled as data.generation says) and then writes the next user
turn with that answer in view; the distiller feeds that first answer as given (its context is the one the
distiller would answer) and generates only the later turns. Written turns are
stripped, length-filtered (min_words..max_words), deduplicated after normalising case and punctuation,
and checked against the evaluation questions.

Every stage streams through the continuous-batching generator (headway.data.generate.answer_stream):
rows are refilled as candidates finish and are dropped, so a batch drains once per stage, not once per
fixed-size call. Candidates carry their own seeds and are judged in index order, so what is kept does
not depend on the batch size or on which rows finish first.

The result is cached in <data.output_dir>/self_written/<source>.json, progress saved every SAVE_EVERY
judged turns: the folder's identity already holds the source settings and the target, so an
interrupted run resumes where it stopped and a rerun writes nothing again.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from headway.config import DataConfig, SourceConfig
from headway.data.generate import Answer, Turn, answer_stream
from headway.data.overlap import eval_overlap, words
from headway.data.sources import Written
from headway.sampling import SamplingParams
from headway.target import stop_token_ids

SENTINEL = "\ue000headway-user-turn\ue000"  # private-use characters: no template writes them
SAVE_EVERY = 128  # written turns judged between progress saves (a resumed run redoes at most this many)
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
    """Why a written turn is unusable (None: usable); `keep` remembers a turn, to refuse its duplicates;
    `admit` does both, counting the reason of a turn it refuses."""

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

    def admit(self, text: str | None, rejected: Counter) -> bool:
        why = self.reason(text)
        if why:
            rejected[why] += 1
        else:
            self.keep(text)
        return why is None


class PromptWriter:
    """Writes (or reads back from its cache) the conversations of self_written sources.

    Called by headway.data.sources.load_conversations as writer(src, name, n).
    """

    def __init__(self, model, tok, cache_dir: Path, data: DataConfig, log=print):
        self.model, self.tok, self.cache_dir, self.data, self.log = model, tok, Path(cache_dir), data, log
        self.answer_stops = stop_token_ids(model, tok)
        self.skipped: Counter = Counter()  # rejected written turns, by source and reason

    def __call__(self, src: SourceConfig, name: str, n: int) -> list[Written]:
        done = self.cache_dir / f"{name}.json"
        if not done.is_file():
            self._write(src, name, n, done)
        result = json.loads(done.read_text())
        self.skipped.update({f"{name}: written turn dropped, {k}": v for k, v in result["rejected"].items()})
        convs = result["conversations"]
        if len(convs) < n:
            self.skipped[f"{name}: fewer prompts written than num_prompts"] += n - len(convs)
        answers = result.get("first_answers", [None] * len(convs))  # a folder from before: none kept
        return [Written(turns, a) for turns, a in zip(convs, answers, strict=True)]

    # ------------------------------------------------------------ writing

    def _write(self, src: SourceConfig, name: str, n: int, done: Path) -> None:
        progress_path = self.cache_dir / f"{name}.progress.json"
        state = {"next": 0, "first": [], "rejected": {}}
        if progress_path.is_file():
            state = json.loads(progress_path.read_text())
            # A folder from before streaming counted calls of 128 candidates: go on after them.
            state.setdefault("next", state.pop("calls", 0) * SAVE_EVERY)
            self.log(f"{name}: resuming self-written prompts ({len(state['first'])} of {n} first turns written)")
        rejected, turns = Counter(state["rejected"]), TurnFilter(src)
        for t in state["first"]:
            turns.keep(t)
        save = _Saver(progress_path, state, rejected)
        self._first_turns(src, name, n, state, turns, rejected, save)
        result = {"conversations": [[t] for t in state["first"]]}
        if src.turns > 1:
            self._follow_ups(src, name, state, turns, rejected, save)
            chats = state["chats"]
            result["conversations"] = [[m["content"] for m in c if m["role"] == "user"] for c in chats]
            # The first answer, where a next turn follows it: the distiller feeds it instead of answering again.
            result["first_answers"] = [c[1]["answer"] if len(c) > 2 else None for c in chats]
        _save(done, {**result, "rejected": dict(rejected)})
        progress_path.unlink(missing_ok=True)
        self.log(f"{name}: {len(result['conversations'])} self-written conversations ({sum(rejected.values())} written turns dropped)")

    def _first_turns(self, src, name, n, state, turns: TurnFilter, rejected: Counter, save: _Saver) -> None:
        """Candidate first turns streamed through the generator until n are usable.

        Candidate c is sampled with its own seed and judged in index order, whatever order the rows
        finish in, so the prompts kept do not depend on the batch size or on where a run was resumed.
        At most n - kept candidates are in flight (each could be the last one needed), so rows are
        refilled while candidates are being dropped and the batch drains once per source, not per call.
        """
        prefix, closing = user_turn_prefix(self.tok, system=src.task)
        prefix_ids = self.tok(prefix, add_special_tokens=False)["input_ids"]
        limit = MAX_TRIES * n  # candidates written before the source gives up

        def take(c: int, text: str | None) -> None:
            if len(state["first"]) >= n:
                return  # written after the source had enough: not judged
            state["next"] = c + 1
            if turns.admit(text, rejected):
                state["first"].append(text)

        def checkpoint() -> None:
            save()
            self.log(f"{name}: {len(state['first'])} of {n} first turns written ({sum(rejected.values())} dropped)")

        while len(state["first"]) < n and state["next"] < limit:
            judged = _InOrder(take, checkpoint, start=state["next"])

            def candidates(judged=judged):
                c = judged.next
                while len(state["first"]) + (c - judged.next) < n and c < limit:
                    yield Turn(prefix_ids, self._seed(name, "first", c))
                    c += 1

            self._sample(candidates(), closing, src, judged.offset(judged.next))
            save()

    def _follow_ups(self, src, name, state, turns: TurnFilter, rejected: Counter, save: _Saver) -> None:
        """Answer every conversation, then let the target write each one's next user turn, turn after turn.

        Each stage streams every conversation it still has to do through the generator; results are
        taken in conversation order and saved every SAVE_EVERY, so a resumed run redoes at most that
        many. A conversation whose follow-up fails FOLLOW_UP_TRIES times ends with the turns it has.
        """
        state.pop("conversations", None)  # a folder from before streaming: its follow-ups are redone
        chats = state.setdefault("chats", [[{"role": "user", "content": t}] for t in state["first"]])
        tries = state.setdefault("tries", [0] * len(chats))  # follow-up attempts at the current turn
        for m in (m for c in chats for m in c[1:] if m["role"] == "user"):
            turns.keep(m["content"])
        for turn in range(1, src.turns):
            asked = [i for i, c in enumerate(chats) if len(c) == 2 * turn - 1]  # its turn-th user turn is open

            def answered(k: int, text_answer: tuple[str, dict], asked=asked) -> None:
                text, answer = text_answer
                chats[asked[k]].append({"role": "assistant", "content": text, "answer": answer})
                tries[asked[k]] = 0

            self._answer(chats, asked, name, turn, _InOrder(answered, save))
            save()
            for attempt in range(FOLLOW_UP_TRIES):
                todo = [i for i, c in enumerate(chats) if len(c) == 2 * turn and tries[i] == attempt]
                if not todo:
                    continue

                def written(k: int, text: str | None, todo=todo) -> None:
                    tries[todo[k]] += 1
                    if turns.admit(text, rejected):
                        chats[todo[k]].append({"role": "user", "content": text})

                prefixes = [user_turn_prefix(self.tok, _messages(chats[i]), src.task) for i in todo]
                prompts = (
                    Turn(self.tok(p, add_special_tokens=False)["input_ids"], self._seed(name, f"turn{turn}:{attempt}", i))
                    for (p, _), i in zip(prefixes, todo, strict=True)
                )
                self._sample(prompts, prefixes[0][1], src, _InOrder(written, save))
                save()
                followed = sum(len(chats[i]) > 2 * turn for i in todo)
                self.log(f"{name}: turn {turn + 1} written for {followed} of {len(todo)} conversations (try {attempt + 1})")

    def _answer(self, chats, asked: list[int], name: str, turn: int, take: Callable[[int, tuple[str, dict]], None]) -> None:
        """The target's answer to each conversation chats[asked[k]] (ending with a user turn), as
        data.generation says: take(k, (text, {"tokens", "finished"})) as its answer ends. Seeded by the
        conversation, so a resumed run samples what an uninterrupted one would.

        A first turn's context is the distiller's (headway.data.chat.first_turn_ids), so its answer can be
        fed there instead of generated again."""
        gen = self.data.generation
        prompts = (
            Turn(
                self.tok(self.tok.apply_chat_template(_messages(chats[i]), tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"],
                self._seed(name, f"answer{turn}", i),
            )
            for i in asked
        )

        def text_of(k: int, a: Answer) -> None:
            text = self.tok.decode(_without_stop(a, self.answer_stops), skip_special_tokens=True).strip()
            take(k, (text, {"tokens": a.tokens, "finished": a.finished}))

        sampling = SamplingParams(temperature=gen.temperature, top_p=gen.top_p)
        answer_stream(self.model, prompts, gen.max_new_tokens, self.answer_stops, text_of, sampling, gen.batch_size)

    def _sample(self, prompts: Iterable[Turn], closing: str, src: SourceConfig, judge: Callable[[int, str | None], None]) -> None:
        """Sampled user turns, cut at the end-of-turn, handed to judge(i, text) as prompt i's ends; text
        is None for one not ended within src.max_tokens."""
        stops = set(self.answer_stops)
        closing_ids = self.tok(closing, add_special_tokens=False)["input_ids"]
        if closing_ids and closing_ids[0] in set(self.tok.all_special_ids):
            stops.add(closing_ids[0])  # the token that ends a user turn (<|im_end|>, <|eot_id|>, ...)
        markers = [m for m in [*self.tok.all_special_tokens, closing.strip()] if m]

        def text_of(i: int, a: Answer) -> None:
            text = self.tok.decode(_without_stop(a, stops), skip_special_tokens=False)
            cut = min((pos for pos in (text.find(m) for m in markers) if pos >= 0), default=-1)
            judge(i, text[:cut].strip() if cut >= 0 else text.strip() if a.finished else None)

        sampling = SamplingParams(temperature=src.temperature, top_p=src.top_p)
        # Per-turn seeds: the batch size changes no sample.
        answer_stream(self.model, prompts, src.max_tokens, stops, text_of, sampling, self.data.generation.batch_size)

    def _seed(self, name: str, stage: str, step: int) -> int:
        return zlib.crc32(f"{self.data.seed}:{name}:{stage}:{step}".encode())


class _InOrder:
    """Hands streamed results to `take(i, value)` in index order, whatever order they arrive in, and
    calls `checkpoint()` after every SAVE_EVERY-th index taken."""

    def __init__(self, take: Callable, checkpoint: Callable[[], None], start: int = 0):
        self.take, self.checkpoint, self.next, self.waiting = take, checkpoint, start, {}

    def __call__(self, i: int, value) -> None:
        self.waiting[i] = value
        while self.next in self.waiting:
            self.take(self.next, self.waiting.pop(self.next))
            self.next += 1
            if self.next % SAVE_EVERY == 0:
                self.checkpoint()

    def offset(self, base: int) -> Callable:
        """The same, for a stream whose item 0 is index `base`."""
        return lambda i, value: self(base + i, value)


class _Saver:
    """Writes the writer's progress (state plus the rejected counts) atomically."""

    def __init__(self, path: Path, state: dict, rejected: Counter):
        self.path, self.state, self.rejected = path, state, rejected

    def __call__(self) -> None:
        self.state["rejected"] = dict(self.rejected)
        _save(self.path, self.state)


def _messages(chat: list[dict]) -> list[dict]:
    """A chat's messages as the template takes them (without the kept answer ids)."""
    return [{"role": m["role"], "content": m["content"]} for m in chat]


def _without_stop(answer, stops: set[int]) -> list[int]:
    return answer.tokens[:-1] if answer.finished and answer.tokens and answer.tokens[-1] in stops else answer.tokens


def _save(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False))
    tmp.replace(path)  # atomic: a killed run never leaves half a file
