"""Token ids of a conversation under the target's chat template, answer tokens kept exactly as generated.

Re-tokenising a decoded answer need not give back the ids the target produced, so later turns
are built as: the ids so far (answers verbatim) + the template text that follows the last answer.
"""

from __future__ import annotations


def first_turn_ids(tok, user_text: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True)
    # The template already writes any BOS it wants; the tokenizer must not add another.
    return tok(text, add_special_tokens=False)["input_ids"]


def next_turn_ids(tok, messages: list[dict], prev_ids: list[int], last_answer_ended: bool) -> list[int] | None:
    """Ids for the turn after `messages` (which end with a user turn), extending `prev_ids`.

    `messages[-2]` is the assistant answer whose ids end `prev_ids`; `last_answer_ended` says
    whether those ids already include the stop token the template writes after the answer.
    Returns None if the template does not render the answer text verbatim (it must, to align).
    """
    before = tok.apply_chat_template(messages[:-1], tokenize=False)
    full = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    answer = messages[-2]["content"]
    end = before.rfind(answer)
    if end < 0:  # templates that trim the content (Llama-3's) render it stripped
        answer = answer.strip()
        end = before.rfind(answer)
    if not answer or end < 0 or not full.startswith(before[: end + len(answer)]):
        return None
    rest = full[end + len(answer) :]
    eos = tok.eos_token or ""
    if last_answer_ended and eos and rest.startswith(eos):
        rest = rest[len(eos) :]  # the target generated it: it is in prev_ids already
    return prev_ids + tok(rest, add_special_tokens=False)["input_ids"]
