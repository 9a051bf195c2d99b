"""Evaluation questions in the Spec-Bench format (`question_id`, `category`, `turns`), grouped by domain.

    qs = load_questions("data/prompts/spec_bench/question.jsonl", per_domain=10)
    qs, skipped = skip_long_questions(qs, prompt_len, max_new_tokens=128, context=8192)   # skipped: per domain

MT-bench's eight sub-categories (writing, roleplay, reasoning, math, coding, extraction, stem,
humanities) form one domain, `multi_turn`; with `per_domain` they are taken round-robin across the
sub-categories (the file lists ten writing rows first). Every other category is its own domain.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
MULTI_TURN = "multi_turn"


@dataclass(frozen=True)
class Question:
    question_id: int | str
    domain: str
    category: str
    turns: tuple[str, ...]


def load_questions(path: str | Path, per_domain: int | None = None) -> list[Question]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"questions file not found: {path}")
    by_domain: dict[str, dict[str, list[Question]]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON: {e}") from e
        for key in ("question_id", "category", "turns"):
            if key not in row:
                raise ValueError(
                    f"{path}:{n}: missing key {key!r} (Spec-Bench rows have question_id, category, turns)"
                )
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"{path}:{n}: 'turns' must be a non-empty list of non-empty strings")
        cat = str(row["category"])
        domain = MULTI_TURN if cat in MT_BENCH else cat
        q = Question(row["question_id"], domain, cat, tuple(turns))
        by_domain.setdefault(domain, {}).setdefault(cat, []).append(q)
    if not by_domain:
        raise ValueError(f"{path}: no questions")
    out = []
    for cats in by_domain.values():
        # Round-robin over sub-categories (one sub-category for ordinary domains), in file order.
        queues = [list(v) for v in cats.values()]
        taken = []
        while any(queues) and (per_domain is None or len(taken) < per_domain):
            for q in queues:
                if q and (per_domain is None or len(taken) < per_domain):
                    taken.append(q.pop(0))
        out += taken
    return out


def skip_long_questions(
    questions: list[Question], prompt_len: Callable[[Question], int], max_new_tokens: int, context: int
) -> tuple[list[Question], Counter]:
    """The questions whose first turn + max_new_tokens fits the target's context, and per domain how many did
    not: like data generation, a prompt is skipped and counted, never truncated (nor run past the positions
    the target knows, which would cost minutes for garbage)."""
    kept, skipped = [], Counter()
    for q in questions:
        if prompt_len(q) + max_new_tokens > context:
            skipped[q.domain] += 1
        else:
            kept.append(q)
    return kept, skipped
