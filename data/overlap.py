"""Keep the evaluation questions out of the training prompts.

    from headway.data.overlap import eval_overlap
    if eval_overlap().hits(prompt): ...   # shares a 13-word window with a Spec-Bench or MT-bench question

Text is compared after normalising case and punctuation (words are runs of letters and digits). A
training prompt overlaps when it contains any 13 consecutive words of an evaluation turn, or the whole of
an evaluation turn of 8 to 12 words (shorter turns, such as "Now make it shorter.", are too generic to
tell anything).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from headway.paths import resolve_path

WINDOW = 13
MIN_SHORT = 8  # an evaluation turn of MIN_SHORT..WINDOW-1 words is matched whole
EVAL_QUESTION_FILES = ("data/prompts/spec_bench/question.jsonl", "data/prompts/mt_bench/question.jsonl")
_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class EvalOverlap:
    """The evaluation turns' word windows; `hits(text)` says whether a training prompt shares one."""

    def __init__(self, questions: list[str]):
        self.windows: dict[int, set[tuple[str, ...]]] = {}
        for q in questions:
            w = words(q)
            n = min(len(w), WINDOW)
            if n < MIN_SHORT:
                continue
            self.windows.setdefault(n, set()).update(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
        # Every window's first MIN_SHORT words: one lookup per position rules out almost every text.
        self.heads = {g[:MIN_SHORT] for grams in self.windows.values() for g in grams}

    def hits(self, text: str) -> bool:
        w = words(text)
        for i in range(len(w) - MIN_SHORT + 1):
            if tuple(w[i : i + MIN_SHORT]) in self.heads and any(
                tuple(w[i : i + n]) in grams for n, grams in self.windows.items() if i + n <= len(w)
            ):
                return True
        return False


def eval_turns(paths=EVAL_QUESTION_FILES) -> list[str]:
    """Every user turn of the evaluation question files (rows with a `turns` list)."""
    out = []
    for p in paths:
        path = resolve_path(p)
        if not path.is_file():
            raise FileNotFoundError(f"evaluation question file not found: {path} (needed to filter training prompts)")
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out += [t for t in json.loads(line).get("turns", []) if isinstance(t, str)]
    return out


@lru_cache(maxsize=1)
def eval_overlap() -> EvalOverlap:
    return EvalOverlap(eval_turns())
