"""Which room may import which: nothing runs back up a floor (docs/architecture.md's table)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("data", "heads", "train", "inference", "export")
# room -> the rooms it must never import (the core, `headway`, may be imported by all)
FORBIDDEN = {
    "headway": set(ROOMS),
    "data": {"heads", "train", "inference", "export"},
    "heads": {"data", "train", "inference", "export"},
    "export": {"data", "train", "inference"},
}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "headway":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "headway"


def imports_of(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_no_room_imports_a_room_above_it(room):
    files = sorted((ROOT / room).rglob("*.py"))
    assert files, f"no modules under {room}/"
    bad = [
        f"{f.relative_to(ROOT)}:{line} imports {mod}"
        for f in files
        for line, mod in imports_of(f)
        if room_of(mod) in FORBIDDEN[room]
    ]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_forbidden_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from headway.heads.eagle import x\n")
    assert [room_of(m) for _, m in imports_of(f)] == ["heads"]
