"""Context-bearing prompts: a passage plus an instruction to translate it, summarise it or answer from it.

    - {kind: context, task: translate, path: data/prompts/passages/vite_docs_de.jsonl, languages: [de-en], domain: translation}
    - {kind: context, task: summarize, path: data/prompts/passages/python_docs_es.jsonl, domain: summarization}
    - {kind: context, task: qa, path: data/prompts/passages/python_docs_es.jsonl, passages: 3, domain: qa}

The answers to such prompts repeat much of the prompt, which is what a drafter must learn to copy (and
what prompt lookup wins on). A passage file holds one paragraph per row, in document order:
{"doc": ..., "section": <the heading above it>, "en": ..., "de": ...}; data/passage_build.py makes them.
Every prompt is built deterministically from the file, the source's settings and data.seed.
"""

from __future__ import annotations

import json
import random
import re

from headway.config import SourceConfig
from headway.paths import resolve_path

LANGUAGES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese"}
TASKS = ("translate", "summarize", "qa")

TRANSLATE = (
    "Translate {src} to {tgt}: {text}",  # Spec-Bench's wording
    "Translate the following {src} text into {tgt}.\n\n{text}",
    "{text}\n\nTranslate this into {tgt}.",
    "Can you translate this from {src} to {tgt}?\n{text}",
    "Please give me the {tgt} version of this {src} passage:\n\n{text}",
)
SUMMARIZE = (
    "Summarize: {text}",  # Spec-Bench's wording
    "Summarize the following text in a few sentences.\n\n{text}",
    "{text}\n\nTL;DR:",
    "Write a short summary of this article:\n{text}",
    "Give me the key points of the passage below as a bulleted list.\n\n{text}",
    "Read the text and summarize it in one paragraph.\n\n{text}",
)
QA = (
    "{passages}\n{question}",  # Spec-Bench's retrieval layout: passages, then the question
    "Answer the question using the passages below.\n\n{passages}\n\nQuestion: {question}",
    "Context:\n{passages}\n\nQuestion: {question}\nAnswer:",
    "Read the following documents and answer the question.\n\n{passages}\n\n{question}",
)
ABOUT_SECTION = "What do the passages say about {section}?"  # sections whose heading is not a question
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[¿¡]?[A-ZÀ-ÖØ-Þ])")


def load_passages(path: str) -> list[dict]:
    p = resolve_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"passage file not found: {p} (data.sources entry of kind context)")
    rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"passage file {p} is empty")
    return rows


def check_context_source(src: SourceConfig, where: str) -> None:
    if src.task not in TASKS:
        raise ValueError(f"{where}: kind context needs task: one of {', '.join(TASKS)} (got {src.task!r})")
    if not src.path:
        raise ValueError(f"{where}: kind context needs path: a passage file (see data/prompts/passages/)")
    for pair in src.languages if src.task == "translate" else []:
        a, _, b = pair.partition("-")
        if a not in LANGUAGES or b not in LANGUAGES or a == b:
            raise ValueError(f"{where}: language pair {pair!r} is not of the form src-tgt with codes {sorted(LANGUAGES)}")
    if src.task == "translate" and not src.languages:
        raise ValueError(f"{where}: task translate needs languages: a list of pairs such as [de-en, en-fr]")
    if src.task == "qa" and src.passages < 1:
        raise ValueError(f"{where}: passages must be at least 1 (got {src.passages})")


def context_prompts(src: SourceConfig, seed: int, name: str) -> list[str]:
    """Every prompt the passage file yields for this source, in a fixed order."""
    check_context_source(src, f"data.sources entry {name!r}")
    rows = load_passages(src.path)
    rng = random.Random(f"{seed}:{name}")
    build = {"translate": _translate, "summarize": _summarize, "qa": _qa}[src.task]
    return build(rows, src, rng)


def _fits(text: str, src: SourceConfig) -> bool:
    return src.min_words <= len(text.split()) <= src.max_words


def _translate(rows: list[dict], src: SourceConfig, rng: random.Random) -> list[str]:
    """One prompt per paragraph: a span of one to three of its sentences, pairs taken in turn."""
    out = []
    for i, row in enumerate(rows):
        a, _, b = src.languages[i % len(src.languages)].partition("-")
        if not row.get(a):
            continue
        sentences = _SENTENCE_END.split(row[a])
        k = rng.randint(1, min(3, len(sentences)))
        start = rng.randrange(len(sentences) - k + 1)
        text = " ".join(sentences[start : start + k])
        if _fits(text, src):
            template = rng.choice(TRANSLATE)
            out.append(template.format(src=LANGUAGES[a], tgt=LANGUAGES[b], text=text))
    return out


def _text_language(src: SourceConfig) -> str:
    return src.languages[0] if src.languages else "en"


def _sections(rows: list[dict], lang: str) -> list[tuple[str, str, list[str]]]:
    """(doc, heading, paragraphs) of each run of rows under one heading."""
    out: list[tuple[str, str, list[str]]] = []
    for row in rows:
        if not row.get(lang):
            continue
        if out and out[-1][:2] == (row["doc"], row.get("section", "")):
            out[-1][2].append(row[lang])
        else:
            out.append((row["doc"], row.get("section", ""), [row[lang]]))
    return out


def _summarize(rows: list[dict], src: SourceConfig, rng: random.Random) -> list[str]:
    """Consecutive paragraphs of one document, cut into non-overlapping passages of min..max words."""
    out, doc, chunk = [], None, []

    def close():
        text = "\n\n".join(chunk)
        if chunk and _fits(text, src):
            out.append(rng.choice(SUMMARIZE).format(text=text))

    lang = _text_language(src)
    for row in rows:
        text = row.get(lang)
        if not text:
            continue
        if row["doc"] != doc or len(" ".join(chunk + [text]).split()) > src.max_words:
            close()
            doc, chunk = row["doc"], []
        chunk.append(text)
        if len(" ".join(chunk).split()) >= src.min_words and rng.random() < 0.5:
            close()  # vary the length between min_words and max_words
            chunk = []
    close()
    return out


def _qa(rows: list[dict], src: SourceConfig, rng: random.Random) -> list[str]:
    """One prompt per section: its text among other sections' texts, then a question it answers.

    A heading that is a question (the FAQs) is asked as it stands; any other heading becomes
    "What do the passages say about <heading>?".
    """
    sections = [(d, h, " ".join(p)) for d, h, p in _sections(rows, _text_language(src)) if h]
    sections = [s for s in sections if _fits(s[2], src)]
    out = []
    for _, heading, gold in sections:
        question = heading if heading.endswith("?") else ABOUT_SECTION.format(section=heading)
        others = [j for j in range(len(sections)) if sections[j][1] != heading]
        picked = [sections[j][2] for j in rng.sample(others, min(src.passages - 1, len(others)))]
        picked.insert(rng.randrange(len(picked) + 1), gold)
        out.append(rng.choice(QA).format(passages="\n".join(picked), question=question))
    return out
