"""The default mix: self-written prompts (Magpie), context-bearing prompts, and no evaluation question in training."""

from __future__ import annotations

import itertools
import json
import random
import re

import pytest
import torch

import headway.data.magpie as magpie
from headway.config import Config, DataConfig, GenerationConfig, SourceConfig, load_config
from headway.data.chat import first_turn_ids
from headway.data.context import (
    QA,
    SUMMARIZE,
    TRANSLATE,
    check_context_source,
    context_prompts,
    load_passages,
)
from headway.data.generate import Answer
from headway.data.magpie import PromptWriter, user_turn_prefix
from headway.data.overlap import EvalOverlap, eval_turns
from headway.data.sources import load_conversations, source_identity, source_name, source_turns

SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
MT_BENCH_Q = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions."


# ---------------------------------------------------------------- the user-turn prefix


def test_user_turn_prefix_on_the_real_template(smol_tok):
    prefix, closing = user_turn_prefix(smol_tok)
    assert prefix == SMOL_SYSTEM + "<|im_start|>user\n", "the template's default system turn is kept"
    assert closing == "<|im_end|>\n"
    # The prefix, a user text and the closing text are exactly what the answering prompt renders.
    rendered = smol_tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True)
    assert rendered == prefix + "Hi there" + closing + "<|im_start|>assistant\n"
    assert smol_tok(prefix, add_special_tokens=False)["input_ids"] == first_turn_ids(smol_tok, "Hi there")[: len(smol_tok(prefix)["input_ids"])]

    steered, _ = user_turn_prefix(smol_tok, system="Users ask about maths.")
    assert steered == "<|im_start|>system\nUsers ask about maths.<|im_end|>\n<|im_start|>user\n", "a task replaces the default system turn"
    history = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    follow, _ = user_turn_prefix(smol_tok, history)
    assert follow == SMOL_SYSTEM + "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n<|im_start|>user\n"


# ---------------------------------------------------------------- the writer, with a scripted generator


POOL = [
    "How do I bake sourdough bread at home?",
    "how do I bake SOURDOUGH bread at home",  # a near-duplicate of the first: normalised, they are equal
    "Hi",  # too short
    "Write a cover letter for a junior accountant position at a small firm.",
    "What is the tallest mountain in Africa?",
    MT_BENCH_Q,  # planted: an evaluation question
    "Can you suggest three names for a bakery?",
    "Explain photosynthesis to a ten year old.",
    "What should I pack for a week of hiking in Scotland?",
    "Tell me a joke about computers.",
] + [f"Give me {n} ideas for a birthday party." for n in ("two", "three", "four", "five", "six", "seven", "eight")]
UNFINISHED = "this one never stops"


class FakeStream:
    """Stands in for answer_stream: each turn gets a pick from POOL seeded by the turn's seed (or a text
    that never ends). Up to `rows` turns are in flight and answered last first, as rows finishing out of
    order would be.

    sequential: POOL in order instead (by the order turns are read), the text that never ends fourth,
    so every filter is met early.
    """

    def __init__(self, tok, sequential=False, rows=3):
        self.tok, self.sequential, self.rows = tok, sequential, rows
        self.calls, self.answered, self.prompts, self.answers = 0, 0, [], {}

    def __call__(self, model, turns, max_new_tokens, eos_ids, on_answer, sampling=None, batch_size=64):
        self.calls += 1
        order = POOL[:3] + [UNFINISHED] + POOL[3:]
        stream = enumerate(turns)
        while batch := list(itertools.islice(stream, self.rows)):
            texts = []
            for _, turn in batch:
                self.prompts.append(turn.ids)
                pick = (
                    order[(len(self.prompts) - 1) % len(order)]
                    if self.sequential
                    else random.Random(turn.seed).choice(POOL + [UNFINISHED])
                )
                texts.append(pick)
            for (i, turn), text in reversed(list(zip(batch, texts, strict=True))):
                self.answered += 1
                ids = self.tok(text, add_special_tokens=False)["input_ids"]
                answer = Answer(ids, False) if text == UNFINISHED else Answer(ids + [2], True)
                self.answers[tuple(turn.ids)] = answer
                on_answer(i, answer)


def _writer(tmp_path, tok, sources=(), **gen):
    model = torch.nn.Linear(1, 1)  # never called: FakeStream answers
    model.generation_config = type("G", (), {"eos_token_id": 2})()
    data = DataConfig(output_dir=str(tmp_path), sources=list(sources), generation=GenerationConfig(**gen), seed=0)
    return PromptWriter(model, tok, tmp_path / "self_written", data, log=lambda *_: None)


def test_written_prompts_are_filtered_deduplicated_and_cached(tmp_path, smol_tok, monkeypatch):
    fake = FakeStream(smol_tok, sequential=True)
    monkeypatch.setattr(magpie, "answer_stream", fake)
    src = SourceConfig(domain="chat", kind="self_written", num_prompts=6, min_words=3, max_words=30)
    writer = _writer(tmp_path, smol_tok)
    prompts = [c.turns[0] for c in writer(src, "chat", 6)]
    assert len(prompts) == 6 and all(len(c.turns) == 1 and c.first_answer is None for c in writer(src, "chat", 6))
    keys = [" ".join(re.findall(r"\w+", p.lower())) for p in prompts]
    assert len(set(keys)) == len(keys), "no duplicates, even after normalising case and punctuation"
    assert MT_BENCH_Q not in prompts and "Hi" not in prompts and UNFINISHED not in prompts
    assert all(p in POOL for p in prompts)
    stats = json.loads((tmp_path / "self_written" / "chat.json").read_text())["rejected"]
    assert stats["not ended within max_tokens"] > 0 and stats["fewer than min_words=3 words"] > 0
    assert "shares a 13-word window with an evaluation question" in stats
    assert sum(stats.values()) + len(prompts) == fake.answered, (
        "every candidate written was judged: none in excess"
    )
    # Every candidate saw only the template's user-turn prefix.
    prefix_ids = smol_tok(SMOL_SYSTEM + "<|im_start|>user\n", add_special_tokens=False)["input_ids"]
    assert all(p == prefix_ids for p in fake.prompts)
    calls = fake.calls
    again = _writer(tmp_path, smol_tok)(src, "chat", 6)
    assert fake.calls == calls and [c.turns[0] for c in again] == prompts, "a rerun reads the cache, writes nothing"


@pytest.mark.parametrize("turns", [1, 2])
def test_the_prompts_kept_do_not_depend_on_the_order_rows_finish_in(tmp_path, smol_tok, monkeypatch, turns):
    src = SourceConfig(
        domain="chat", kind="self_written", num_prompts=7, turns=turns, min_words=3, max_words=30
    )
    written = []
    for rows in (1, 4):
        monkeypatch.setattr(magpie, "answer_stream", FakeStream(smol_tok, rows=rows))
        written.append(_writer(tmp_path / str(rows), smol_tok)(src, "chat", 7))
    assert written[0] == written[1] and len(written[0]) == 7


def test_the_mix_s_sources_share_a_stream_and_write_what_each_would_alone(tmp_path, smol_tok, monkeypatch):
    chat = SourceConfig(domain="chat", kind="self_written", name="chat", num_prompts=5, turns=2, min_words=3, max_words=30)
    asks = SourceConfig(domain="qa", kind="self_written", name="asks", num_prompts=4, min_words=3, max_words=30, task="Ask.")
    alone = {}
    for src in (chat, asks):
        monkeypatch.setattr(magpie, "answer_stream", FakeStream(smol_tok))
        alone[src.name] = _writer(tmp_path / src.name, smol_tok)(src, src.name, src.num_prompts)
    fake = FakeStream(smol_tok, rows=8)
    monkeypatch.setattr(magpie, "answer_stream", fake)
    writer = _writer(tmp_path / "mix", smol_tok, sources=[chat, asks])
    assert writer(asks, "asks", 4) == alone["asks"], "a source keeps what it would alone"
    assert (tmp_path / "mix" / "self_written" / "chat.json").is_file(), "the mix's other source was written with it"
    streams = fake.calls
    assert writer(chat, "chat", 5) == alone["chat"] and fake.calls == streams, "... and is read back, not written again"
    steered = smol_tok(user_turn_prefix(smol_tok, system="Ask.")[0], add_special_tokens=False)["input_ids"]
    assert steered in fake.prompts[:8] and any(p != steered for p in fake.prompts[:8]), "the first stream mixes both"


@pytest.mark.parametrize("turns", [1, 2])
def test_interrupted_writing_resumes_to_the_same_prompts(tmp_path, smol_tok, monkeypatch, turns):
    monkeypatch.setattr(magpie, "SAVE_EVERY", 2)
    src = SourceConfig(
        domain="chat", kind="self_written", num_prompts=5, turns=turns, min_words=3, max_words=30
    )
    uninterrupted = FakeStream(smol_tok)
    monkeypatch.setattr(magpie, "answer_stream", uninterrupted)
    reference = _writer(tmp_path / "ref", smol_tok)(src, "chat", 5)

    fake = FakeStream(smol_tok)
    die_at = uninterrupted.answered - 1  # one turn: among the first turns; two: among the follow-ups

    def dies(model, turns, max_new_tokens, eos_ids, on_answer, *a, **k):
        def answer_or_die(i, answer):
            if fake.answered >= die_at:
                raise KeyboardInterrupt
            on_answer(i, answer)

        return fake(model, turns, max_new_tokens, eos_ids, answer_or_die, *a, **k)

    monkeypatch.setattr(magpie, "answer_stream", dies)
    with pytest.raises(KeyboardInterrupt):
        _writer(tmp_path, smol_tok)(src, "chat", 5)
    progress = json.loads((tmp_path / "self_written" / "chat.progress.json").read_text())
    fresh = FakeStream(smol_tok)
    monkeypatch.setattr(magpie, "answer_stream", fresh)
    assert _writer(tmp_path, smol_tok)(src, "chat", 5) == reference
    if turns == 1:
        assert progress["next"] > 0 and fresh.answered == uninterrupted.answered - progress["next"], (
            "the candidates judged before the last save are not written again"
        )
    else:
        prefix_ids = smol_tok(SMOL_SYSTEM + "<|im_start|>user\n", add_special_tokens=False)["input_ids"]
        redone = [smol_tok.decode(p) for p in fresh.prompts]
        assert fresh.prompts and prefix_ids not in fresh.prompts, "no first turn is written again"
        assert not any(p.endswith("<|im_start|>assistant\n") for p in redone), (
            "no conversation is answered again"
        )
    assert not (tmp_path / "self_written" / "chat.progress.json").exists()


def test_writing_interrupted_while_answering_resumes_to_the_same_answers(tmp_path, smol_tok, monkeypatch):
    monkeypatch.setattr(magpie, "SAVE_EVERY", 2)
    src = SourceConfig(domain="chat", kind="self_written", num_prompts=5, turns=2, min_words=3, max_words=30)
    monkeypatch.setattr(magpie, "answer_stream", FakeStream(smol_tok))
    reference = _writer(tmp_path / "ref", smol_tok)(src, "chat", 5)

    fake, asked = FakeStream(smol_tok), []

    def dies(model, turns, *a, **k):
        def pull(turns=turns):
            for t in turns:
                if smol_tok.decode(t.ids).endswith("<|im_start|>assistant\n"):  # an answer, not a user turn
                    asked.append(t)
                    if len(asked) == 4:
                        raise KeyboardInterrupt
                yield t

        return fake(model, pull(), *a, **k)

    monkeypatch.setattr(magpie, "answer_stream", dies)
    with pytest.raises(KeyboardInterrupt):
        _writer(tmp_path, smol_tok)(src, "chat", 5)
    progress = json.loads((tmp_path / "self_written" / "chat.progress.json").read_text())
    assert 0 < sum(len(c) > 1 for c in progress["chats"]) < 5, "died among the answers, some of them saved"
    monkeypatch.setattr(magpie, "answer_stream", FakeStream(smol_tok))
    # The fake's answers follow each turn's seed: the kept answers match only if seeds follow the conversation.
    assert _writer(tmp_path, smol_tok)(src, "chat", 5) == reference


def test_follow_up_turns_are_written_after_the_targets_answer(tmp_path, smol_tok, monkeypatch):
    fake = FakeStream(smol_tok)
    monkeypatch.setattr(magpie, "answer_stream", fake)
    src = SourceConfig(domain="chat", kind="self_written", num_prompts=4, turns=2, min_words=3, max_words=30)
    written = _writer(tmp_path, smol_tok, max_new_tokens=20)(src, "chat", 4)
    convs = [c.turns for c in written]
    assert len(convs) == 4 and sum(len(c) == 2 for c in convs) >= 3
    turns = [t for c in convs for t in c]
    assert len({" ".join(re.findall(r"\w+", t.lower())) for t in turns}) == len(turns), (
        "follow-ups are deduplicated too"
    )
    # The follow-up writer saw the conversation: first turn, the (fake) answer, then an open user turn.
    follow_prompts = [
        smol_tok.decode(p) for p in fake.prompts if smol_tok.decode(p).count("<|im_start|>user") == 2
    ]
    assert follow_prompts and all(p.endswith("<|im_end|>\n<|im_start|>user\n") for p in follow_prompts)
    assert any(f"user\n{convs[0][0]}<|im_end|>\n<|im_start|>assistant\n" in p for p in follow_prompts)
    # The answer each follow-up was written after is kept, as the distiller would see it: its first-turn ids.
    for c in written:
        answer = fake.answers[tuple(first_turn_ids(smol_tok, c.turns[0]))]
        if len(c.turns) == 2:
            assert c.first_answer == {"tokens": answer.tokens, "finished": answer.finished}
        else:
            assert c.first_answer is None, "no next turn follows it: the distiller answers the first turn itself"


def test_kept_first_answers_reach_the_distillers_conversations(tmp_path, smol_tok, monkeypatch):
    monkeypatch.setattr(magpie, "answer_stream", FakeStream(smol_tok))
    src = SourceConfig(domain="chat", kind="self_written", num_prompts=4, turns=2, min_words=3, max_words=30, name="chat")
    writer = _writer(tmp_path, smol_tok)
    written = {tuple(c.turns): c.first_answer for c in writer(src, "chat", 4)}
    convs, _ = load_conversations(DataConfig(sources=[src]), writer)
    assert {tuple(c.turns): c.first_answer for c in convs} == written
    assert any(a is not None for a in written.values())
    one_turn, _ = load_conversations(DataConfig(sources=[src], generation=GenerationConfig(max_turns=1)), writer)
    assert all(c.first_answer is None for c in one_turn), "a conversation cut to one turn answers it itself"


@pytest.mark.real_target
def test_the_real_target_writes_clean_user_turns(tmp_path, smol_tok, smol_fp32):
    src = SourceConfig(domain="chat", kind="self_written", num_prompts=2, max_tokens=40, min_words=2, max_words=60)
    writer = PromptWriter(smol_fp32, smol_tok, tmp_path, DataConfig(seed=0), log=lambda *_: None)
    convs = writer(src, "chat", 2)
    assert len(convs) == 2, writer.skipped
    for (text,) in (c.turns for c in convs):
        assert text == text.strip() and "<|im" not in text and 2 <= len(text.split()) <= 60


# ---------------------------------------------------------------- context-bearing prompts


def _filled(templates, prompt: str, **known) -> str:
    """The {text} a prompt was made with, given the template set and the other fields' values."""
    for t in templates:
        pattern = re.escape(t)
        for k, v in known.items():
            pattern = pattern.replace(re.escape("{" + k + "}"), re.escape(v))
        m = re.fullmatch(pattern.replace(re.escape("{text}"), "(.+)"), prompt, re.S)
        if m:
            return m.group(1)
    raise AssertionError(f"no template makes {prompt[:100]!r}")


def test_translation_prompts_carry_a_span_of_the_source_paragraph():
    src = SourceConfig(domain="translation", kind="context", task="translate", languages=["de-en", "en-fr"],
                       path="data/prompts/passages/python_docs_fr.jsonl", min_words=5, max_words=80)  # fmt: skip
    english = [r["en"] for r in load_passages(src.path)]
    prompts = context_prompts(src, seed=0, name="t")
    assert prompts == context_prompts(src, seed=0, name="t") != context_prompts(src, seed=1, name="t")
    assert prompts and not any("German" in p for p in prompts), "rows without German text give no de-en prompt"
    for p in prompts[:100]:
        text = _filled(TRANSLATE, p, src="English", tgt="French")
        assert 5 <= len(text.split()) <= 80 and any(text in e for e in english)


def _runs(rows: list[dict]) -> list[tuple[str, str]]:
    """(heading, text) of each run of paragraphs under one heading of one document."""
    out: list[tuple[str, str, str]] = []
    for r in rows:
        if out and out[-1][:2] == (r["doc"], r["section"]):
            out[-1] = (r["doc"], r["section"], out[-1][2] + " " + r["en"])
        else:
            out.append((r["doc"], r["section"], r["en"]))
    return [(h, t) for _, h, t in out]


def test_summaries_and_passage_questions_are_assembled_from_one_document():
    path = "data/prompts/passages/python_docs_es.jsonl"
    rows = load_passages(path)
    docs = {}
    for r in rows:
        docs[r["doc"]] = docs.get(r["doc"], "") + r["en"] + "\n\n"
    summ = SourceConfig(domain="summarization", kind="context", task="summarize", path=path, min_words=150, max_words=450)
    prompts = context_prompts(summ, 0, "s")
    assert len(prompts) > 100
    for p in prompts:
        text = _filled(SUMMARIZE, p)
        assert 150 <= len(text.split()) <= 450
        assert any(text in d for d in docs.values()), "consecutive paragraphs of one document"

    qa = SourceConfig(domain="rag", kind="context", task="qa", path=path, passages=3, min_words=20, max_words=150)
    prompts = context_prompts(qa, 0, "q")
    assert len(prompts) > 200
    runs = _runs(rows)
    n_faq = 0
    for p in prompts[:80]:
        lines = p.split("\n")
        question = lines[-2 if lines[-1] == "Answer:" else -1].removeprefix("Question: ")
        heading = question if question.endswith("?") and not question.startswith("What do the passages say") else None
        heading = heading or question.removeprefix("What do the passages say about ").removesuffix("?")
        gold = [t for h, t in runs if h == heading and t in p]
        assert gold, f"the passages hold the text under {heading!r}"
        body = p[: p.rfind(question)]
        assert sum(body.count(t) for h, t in runs if len(t.split()) >= 20 and t in body) >= 1
        n_faq += question == heading
    assert n_faq > 20, "the FAQs' own questions are asked as they stand"


def test_context_source_errors_name_the_key():
    bad = SourceConfig(domain="t", kind="context", task="translate", path="data/prompts/passages/vite_docs_de.jsonl")
    with pytest.raises(ValueError, match="needs languages"):
        check_context_source(bad, "x")
    bad.languages = ["de-xx"]
    with pytest.raises(ValueError, match="'de-xx'"):
        check_context_source(bad, "x")
    with pytest.raises(ValueError, match="task: one of translate, summarize, qa"):
        check_context_source(SourceConfig(domain="t", kind="context", task="poem", path="p"), "x")
    with pytest.raises(ValueError, match="self_written needs num_prompts"):
        source_turns(SourceConfig(domain="c", kind="self_written"), "c", None, 0, None)
    with pytest.raises(ValueError, match="takes no path"):
        source_turns(SourceConfig(domain="c", kind="self_written", path="x.jsonl", num_prompts=3), "c", 3, 0, None)


def test_data_folders_made_before_the_new_fields_keep_their_identity():
    src = SourceConfig(domain="math", path="data/prompts/gsm8k/train.jsonl", num_prompts=9)
    assert source_identity(src) == {"path": src.path, "domain": "math", "num_prompts": 9, "split": "train", "format": "auto", "name": None}
    written = SourceConfig(domain="chat", kind="self_written", num_prompts=9, task="Ask things.")
    assert {"kind": "self_written", "task": "Ask things."}.items() <= source_identity(written).items()


# ---------------------------------------------------------------- never from the evaluation sets


def _windows(text: str, n: int = 13) -> set[str]:
    w = re.sub(r"[^\w\s]|_", " ", text.lower()).split()
    return {" ".join(w[i : i + n]) for i in range(len(w) - n + 1)}


def test_overlap_finds_13_word_windows_after_normalising():
    index = EvalOverlap([MT_BENCH_Q])
    words = MT_BENCH_Q.split()
    assert index.hits("Please: " + " ".join(words[2:15]).upper() + "!!! thanks")
    assert not index.hits(" ".join(words[2:14])), "12 words are not a window"
    assert index.hits("Before. " + MT_BENCH_Q.replace(",", " ;") + " After.")
    short = EvalOverlap(["Who played Anna in Once Upon a Time?"])
    assert short.hits("Question: who played anna in once upon a time") and not short.hits("who played anna")


def test_the_loader_drops_prompts_that_contain_an_evaluation_question(tmp_path):
    rows = [{"question": "What is 2 + 2?"}, {"question": f"Context first. {MT_BENCH_Q} Then more."}, {"question": "Name a fruit."}]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs, skipped = load_conversations(DataConfig(sources=[SourceConfig(path=str(path), domain="chat", name="p")]))
    assert sorted(c.turns[0] for c in convs) == sorted([rows[0]["question"], rows[2]["question"]])
    assert skipped == {"p: shares a 13-word window with an evaluation question": 1}


def test_no_prompt_of_the_default_mix_shares_a_window_with_the_evaluation_sets():
    """Every static and context prompt of the default mix, checked raw (before the loader's filter).

    Self-written prompts do not exist until the target writes them; the loader's filter (tested above)
    drops any that overlap, and the writer rejects them while writing.
    """
    cfg: Config = load_config("configs/smollm2-135m/data.yaml")
    questions = eval_turns()
    assert len(questions) == 480 + 80 + 80 + 80  # Spec-Bench (MT-bench rows have 2 turns) and MT-bench
    eval_windows = set().union(*(_windows(q) for q in questions))
    domains, checked = set(), 0
    for src in cfg.data.sources:
        domains.add(src.domain)
        if src.kind == "self_written":
            continue
        name = source_name(src)
        for turns in source_turns(src, name, src.num_prompts, cfg.data.seed, None):
            for t in turns:
                assert not (_windows(t) & eval_windows), f"{name}: {t[:200]!r}"
                checked += 1
    assert checked > 15_000
    for template in TRANSLATE + SUMMARIZE + QA:
        assert not (_windows(template) & eval_windows)
    assert {"chat", "writing", "roleplay", "qa", "rag", "translation", "summarization", "math", "code"} <= domains
    assert any(s.kind == "self_written" and s.turns > 1 for s in cfg.data.sources), "multi-turn conversations"
    gsm8k = [s.path for s in cfg.data.sources if s.path and "gsm8k" in s.path]
    assert gsm8k == ["data/prompts/gsm8k/train.jsonl"], "GSM8K test holds Spec-Bench's math questions"
