"""Local prompt files (.json, .jsonl), checked before anything is written, with errors naming the file and line.

    validate_sources(cfg.data)       # every local source of a data config: found, parsable, not empty
    rows = load_json_rows(path)      # a datasets.Dataset of the file's rows; a bad file names itself

`datasets` reports an empty file as a bare StopIteration and a parse error deep inside its own traceback;
here an empty file, the first line of a JSONL file that is not a JSON object, or the parse position in a
JSON file is one sentence. Data generation calls validate_sources before it writes meta.json, so the
corrected rerun into the same folder is not refused. Other source kinds (dataset ids) are read as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from headway.config import DataConfig
from headway.paths import resolve_path

LOCAL_SUFFIXES = (".json", ".jsonl")


class PromptFileError(ValueError):
    """A prompt file that cannot be read as rows: it names the file and where."""


def _check_lines(path: Path, text: str) -> int:
    """JSON Lines: each non-blank line one JSON object; returns how many."""
    n = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(
                f"{path}, line {lineno}: not valid JSON ({e.msg} at column {e.colno})"
            ) from None
        if not isinstance(row, dict):
            raise PromptFileError(
                f"{path}, line {lineno}: expected a JSON object per line, got {type(row).__name__}"
            )
        n += 1
    return n


def _check_document(path: Path, text: str) -> int:
    """One JSON document: a list of objects (or a mapping of columns); JSON Lines in a .json file also pass."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # several top-level values: JSON Lines, which `datasets` reads too
            return _check_lines(path, text)
        raise PromptFileError(f"{path}, line {e.lineno} column {e.colno}: not valid JSON ({e.msg})") from None
    if isinstance(data, dict):
        return len(data)
    if not isinstance(data, list):
        raise PromptFileError(f"{path}: expected a list of JSON objects, got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise PromptFileError(
                f"{path}: item {i} of the list is a {type(row).__name__}, not a JSON object"
            )
    return len(data)


def check_prompt_file(path: str | Path) -> None:
    """Refuse a missing, unreadable, malformed or empty local prompt file, naming it (and the line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if (
        not text.strip()
        or (_check_lines(path, text) if path.suffix == ".jsonl" else _check_document(path, text)) == 0
    ):
        raise PromptFileError(f"{path} is empty: a prompt file needs at least one row")


def load_json_rows(path: str | Path):
    """The rows of a checked local prompt file as a datasets.Dataset."""
    from datasets import load_dataset

    check_prompt_file(path)
    try:
        return load_dataset("json", data_files=str(path), split="train")
    except Exception as e:  # e.g. a column whose type changes between rows
        raise PromptFileError(f"{path}: `datasets` could not read it ({type(e).__name__}: {e})") from e


def validate_sources(cfg: DataConfig) -> None:
    """Check every local .json/.jsonl source of `cfg` before anything is loaded or written."""
    if not cfg.sources:
        raise ValueError("data.sources is empty: name at least one prompt file or dataset")
    for src in cfg.sources:
        if not src.path:  # self_written and context sources read no prompt file
            continue
        path = resolve_path(src.path)
        if path.suffix not in LOCAL_SUFFIXES:
            continue
        if not path.is_file():
            raise FileNotFoundError(
                f"prompt source not found: {path} (data.sources entry with domain {src.domain!r})"
            )
        check_prompt_file(path)
