"""Read a GGUF file's header: its metadata and its tensors' names, shapes and types (no tensor data).

    info = read_gguf("draft.gguf")
    info.metadata["general.architecture"]        # "eagle3"
    info.metadata["eagle3.target_layers"]        # [2, 15, 27]
    info.tensors["fc.weight"]                    # ((1728, 576), "F16"): shape as GGUF lists it, type

The format (GGUF v3): magic "GGUF", version, tensor count, metadata count, the key/value pairs, then
one entry per tensor. Read here so the export can check what llama.cpp's converter wrote without
importing the converter's `gguf` package from the build cache.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
# value type -> struct format (8: string, 9: array are read apart)
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
TENSOR_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 24: "I8", 26: "I32",
                27: "I64", 28: "F64", 30: "BF16"}  # fmt: skip


@dataclass(frozen=True)
class GgufInfo:
    version: int
    metadata: dict
    tensors: dict[str, tuple[tuple[int, ...], str]]

    def type_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, kind in self.tensors.values():
            out[kind] = out.get(kind, 0) + 1
        return out


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise ValueError("GGUF header ends early")
    return struct.unpack(fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "<Q")).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int):
    if kind == 8:
        return _string(f)
    if kind == 9:
        item, n = _read(f, "<I"), _read(f, "<Q")
        return [_value(f, item) for _ in range(n)]
    if kind not in _SCALARS:
        raise ValueError(f"unknown GGUF value type {kind}")
    return _read(f, _SCALARS[kind])


def read_gguf(path: str | Path, skip_arrays_over: int = 1024) -> GgufInfo:
    """The header of `path`; arrays longer than `skip_arrays_over` (the tokenizer's) are left out as their length."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
        version, n_tensors, n_kv = _read(f, "<I"), _read(f, "<Q"), _read(f, "<Q")
        metadata = {}
        for _ in range(n_kv):
            key, kind = _string(f), _read(f, "<I")
            if kind == 9:
                item, n = _read(f, "<I"), _read(f, "<Q")
                values = [_value(f, item) for _ in range(n)]
                metadata[key] = values if n <= skip_arrays_over else f"<array of {n}>"
            else:
                metadata[key] = _value(f, kind)
        tensors = {}
        for _ in range(n_tensors):
            name, dims = _string(f), _read(f, "<I")
            shape = tuple(_read(f, "<Q") for _ in range(dims))
            kind = _read(f, "<I")
            _read(f, "<Q")  # data offset
            tensors[name] = (shape, TENSOR_TYPES.get(kind, str(kind)))
    return GgufInfo(version, metadata, tensors)
