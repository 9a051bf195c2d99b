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
fixed-size call, and the first turns of all the mix's self_written sources share one stream (a 2-core
Zen 4 wrote the quickstart's five sources in 97-103 s, against 144-148 s one source after another).
Candidates carry their own seeds and are judged in each source's index order, so what is kept does not
depend on the batch size, on the other sources, or on which rows finish first.

The result is cached in <data.output_dir>/self_written/<source>.json, progress saved every SAVE_EVERY
judged turns: the folder's identity already holds the source settings and the target, so an
interrupted run resumes where it stopped and a rerun writes nothing again.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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
        done = self._done(name)
        if not done.is_file():
            # The mix's other unwritten self_written sources are written with it: their first turns share one stream.
            self.write([(src, name, n), *(w for w in self.pending() if w[1] != name)])
        result = json.loads(done.read_text())
        self.skipped.update({f"{name}: written turn dropped, {k}": v for k, v in result["rejected"].items()})
        convs = result["conversations"]
        if len(convs) < n:
            self.skipped[f"{name}: fewer prompts written than num_prompts"] += n - len(convs)
        answers = result.get("first_answers", [None] * len(convs))  # a folder from before: none kept
        return [Written(turns, a) for turns, a in zip(convs, answers, strict=True)]

    def pending(self) -> list[tuple[SourceConfig, str, int]]:
        """(source, name, prompts wanted) of each self_written source of the mix not written yet."""
        from headway.data.sources import prompts_wanted, source_name

        wanted = [(src, source_name(src), prompts_wanted(self.data, src)) for src in self.data.sources]
        return [
            (src, name, n)
            for src, name, n in wanted
            if src.kind == "self_written" and not src.path and n and not self._done(name).is_file()
        ]

    def _done(self, name: str) -> Path:
        return self.cache_dir / f"{name}.json"

    # ------------------------------------------------------------ writing

    def write(self, wanted: list[tuple[SourceConfig, str, int]]) -> None:
        """Writes and caches the conversations of each (source, name, prompts wanted): every source's first
        turns in one stream, then each multi-turn source's answers and follow-ups."""
        sources = [self._open(src, name, n) for src, name, n in wanted]
        self._first_turns(sources)
        for s in sources:
            result = {"conversations": [[t] for t in s.state["first"]]}
            if s.src.turns > 1:
                self._follow_ups(s.src, s.name, s.state, s.turns, s.rejected, s.save)
                chats = s.state["chats"]
                result["conversations"] = [[m["content"] for m in c if m["role"] == "user"] for c in chats]
                # The first answer, where a next turn follows it: the distiller feeds it instead of answering again.
                result["first_answers"] = [c[1]["answer"] if len(c) > 2 else None for c in chats]
            _save(self._done(s.name), {**result, "rejected": dict(s.rejected)})
            s.save.path.unlink(missing_ok=True)
            dropped = sum(s.rejected.values())
            self.log(f"{s.name}: {len(result['conversations'])} self-written conversations ({dropped} written turns dropped)")

    def _open(self, src: SourceConfig, name: str, n: int) -> _Source:
        """The source's writing state: fresh, or read back from its progress file."""
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
        prefix, closing = user_turn_prefix(self.tok, system=src.task)
        prefix_ids = self.tok(prefix, add_special_tokens=False)["input_ids"]
        return _Source(src, name, n, state, turns, rejected, _Saver(progress_path, state, rejected), prefix_ids, closing)

    def _first_turns(self, sources: list[_Source]) -> None:
        """Candidate first turns of every source streamed through the generator until each has n usable.

        Candidate c of a source is sampled with its own seed and judged in that source's index order,
        whatever order the rows finish in, so the prompts kept depend neither on the batch size, nor on
        the sources sharing the stream, nor on where a run was resumed. Sources sampled alike share one
        stream, so the batch drains once for all of them, not once per source. A row that frees takes
        the next candidate of the first source still wanting one (rows keep its system turn's keys).
        A source has at most its missing prompts in flight (each could be the last one needed), so no
        candidate is written in excess; one that fails after the stream ran dry costs another round.
        """
        while short := [s for s in sources if s.short()]:
            streams: dict[tuple, list[_Source]] = {}
            for s in short:
                streams.setdefault((s.src.temperature, s.src.top_p, s.src.max_tokens, s.closing), []).append(s)
            for (*_, closing), group in streams.items():
                rounds = [_FirstTurnRound(s, self._seed, self.log) for s in group]
                issued: list[tuple[_FirstTurnRound, int]] = []

                def candidates(rounds=rounds, issued=issued):
                    while (r := next((r for r in rounds if r.wants()), None)) is not None:
                        turn, c = r.issue()
                        issued.append((r, c))
                        yield turn

                def judge(i: int, text: str | None, issued=issued) -> None:
                    r, c = issued[i]
                    r.judged(c, text)

                self._sample(candidates(), closing, group[0].src, judge)
                for s in group:
                    s.save()

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


@dataclass
class _Source:
    """A self_written source being written: what it wants, its progress (saved by `save`), its filter."""

    src: SourceConfig
    name: str
    n: int
    state: dict  # next: candidates judged; first: usable first turns; then chats, tries (multi-turn)
    turns: TurnFilter
    rejected: Counter
    save: _Saver
    prefix_ids: list[int]  # the template up to a user turn's text (with the source's task as system turn)
    closing: str  # the template's text closing a user turn

    @property
    def limit(self) -> int:
        """Candidates written before the source gives up."""
        return MAX_TRIES * self.n

    def short(self) -> bool:
        """Fewer usable first turns than wanted, and candidates left to try."""
        return len(self.state["first"]) < self.n and self.state["next"] < self.limit


class _FirstTurnRound:
    """One source's candidates in one first-turn stream: issued while they may be needed, judged in order."""

    def __init__(self, source: _Source, seed: Callable[[str, str, int], int], log):
        self.source, self.seed, self.log = source, seed, log
        self.order = _InOrder(self._take, self._checkpoint, start=source.state["next"])
        self.next = source.state["next"]  # the next candidate to issue

    def wants(self) -> bool:
        s = self.source
        missing = s.n - len(s.state["first"])
        in_flight = self.next - self.order.next
        return self.next < s.limit and in_flight < missing

    def issue(self) -> tuple[Turn, int]:
        c, self.next = self.next, self.next + 1
        return Turn(self.source.prefix_ids, self.seed(self.source.name, "first", c)), c

    def judged(self, c: int, text: str | None) -> None:
        self.order(c, text)

    def _take(self, c: int, text: str | None) -> None:
        s = self.source
        if len(s.state["first"]) >= s.n:
            return  # written after the source had enough: not judged
        s.state["next"] = c + 1
        if s.turns.admit(text, s.rejected):
            s.state["first"].append(text)

    def _checkpoint(self) -> None:
        s = self.source
        s.save()
        self.log(f"{s.name}: {len(s.state['first'])} of {s.n} first turns written ({sum(s.rejected.values())} dropped)")


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
