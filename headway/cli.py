"""How every command-line entry ends: one `error: ...` line for what the user can fix, a traceback for bugs.

    if __name__ == "__main__":
        sys.exit(run_main(main))          # main(argv: list[str]) -> int

Expected errors are bad input and refusals: config errors, missing or malformed files, outputs made with
other settings, a non-finite loss (ValueError, the file-system errors of a missing or wrong path, and
UserError). They print one line on stderr and exit 1; `HEADWAY_DEBUG=1`, or `--debug` anywhere on the
command line, raises them with their traceback instead. Any other exception is a bug and keeps its
traceback. Usage errors stay argparse's (exit 2). Ctrl-C prints one line and exits 130: what a command
had saved stays (generation and training resume from it on a rerun).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

DEBUG_ENV = "HEADWAY_DEBUG"
DEBUG_FLAG = "--debug"


class UserError(RuntimeError):
    """A refusal the user can act on (settings that do not match an existing output, a stopped run)."""


EXPECTED = (UserError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def debug_requested(argv: list[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run_main(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Run `main(argv)` (default: sys.argv[1:] without --debug); an expected error becomes `error: ...`, exit 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(argv)
    try:
        return main([a for a in argv if a != DEBUG_FLAG]) or 0
    except EXPECTED as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted: what was saved is kept (rerun the same command to resume generation or training)", file=sys.stderr)
        return 130
