"""Paths in recipes are relative to the checkout; the prompt files shipped with headway resolve anywhere.

    resolve_path("data/prompts/gsm8k/train.jsonl")   # ./data/prompts/... in a checkout, else the installed copy

A path that exists as written (absolute, or relative to the working directory) is used as is. A relative
`data/prompts/...` path that does not is read through `importlib.resources` from the installed
`headway.data` package, so a recipe runs from any directory and from a wheel install.
"""

from __future__ import annotations

from importlib.resources import as_file, files
from pathlib import Path

SHIPPED_PREFIX = "data/"


def resolve_path(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    text = p.as_posix()
    if text.startswith(SHIPPED_PREFIX):
        shipped = files("headway.data").joinpath(text.removeprefix(SHIPPED_PREFIX))
        if shipped.is_file():
            with as_file(shipped) as real:  # a real file for a wheel or editable install alike
                return Path(real)
    return p
