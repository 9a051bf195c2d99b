"""Pre-packed linear weights for CPU inference: oneDNN's kernel without a per-call reorder.

    pack_linears(model)      # frozen model on a CPU: every nn.Linear keeps a packed copy of its weight

What is packed depends on the CPU (`packing_available`): bf16 weights where oneDNN has bf16 kernels
(AVX-512 or AMX), fp32 weights where it has none (an AVX2-only CPU, where `target.dtype: auto` is fp32).

`F.linear` on a bf16 CPU tensor reorders (packs) the whole weight into oneDNN's blocked layout on every
call; for the small row counts of decoding that reorder is most of the call. On the 2-core Xeon here
(model 167, AMX) at a quiet hour a pre-packed call took a third to a half of the time for 1-25 rows
(SmolLM2's 49,152 x 576 lm_head: 4.0-6.8 ms -> 1.4-2.6 ms) and up to 30% less at 128-2,048 rows; at a
busy hour (memory bandwidth halved) 1.1-1.8x faster (`docs/results/2026-12-06-smollm2/packed-weights/`). The weight is packed for a
64-row batch: then every row count from 1 to 79 gives `F.linear`'s result to the bit (tested), so
batch-1 decoding is unchanged; at some larger counts (96, 300, 512 ... for some shapes) oneDNN blocks
differently and bf16 rounding can differ, as it does between any two batch shapes (the data generator's
bf16 answers: 426 of 512 equal to the token, `docs/results/2026-12-06-smollm2/packed-weights/`). Equal
to F.linear is all bf16 packing keeps: F.linear's bf16 kernel itself gives a row bits that depend on how
many rows come with it (on the AMX Xeon from 33 rows on, 52 or 68 for some shapes; packed the same:
`docs/results/2026-12-07-smollm2/xeon/bf16_row_dependence.txt`), so bits independent of the row count
are asserted for fp32 packing only.

fp32 `F.linear` is MKL's sgemm, which packs nothing per call; but on a 2-core AVX2 AMD EPYC oneDNN's
packed fp32 kernel was 1.5-2.5x faster at 17 rows (the lm_head over 1 row: 9.5 -> 4.5 ms; over 17:
26.1 -> 10.5 ms; dtype_bench.txt in `docs/results/2026-12-06-smollm2/avx2/`). Its results differ from MKL's in the last
bits, but they do not depend on the row count (1-99 rows give each row the same bits: measured; 1-79 tested), so a
packed fp32 target verifies a tree with the numbers it decodes one token with. Where bf16 kernels exist,
fp32 is not the default dtype and fp32 packing was not measured: it stays off there.
torch.compile's CPU "freezing" packs a compiled graph the same way; this keeps the eager transformers
model as it is.

A packed layer falls back to `F.linear` whenever the packed copy may not apply: autograd wants the
op (the input or the weight requires grad), the input's dtype or device is not the weight's, or the
weight changed after packing (its version counter moved: an optimizer step, `load_state_dict`; or its
storage did: `.to()` another device or dtype).
The packed copy is a plain attribute: not in `state_dict`, not saved.
"""

from __future__ import annotations

import torch
from torch import nn

PACK_ROWS = 64  # the batch-size hint oneDNN packs for; 64 keeps F.linear's results for 1-79 rows (tested)


def packing_available(weight: torch.Tensor) -> bool:
    """bf16 on a CPU with oneDNN bf16 kernels, fp32 on one without (see the module docstring)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return cpu_has_bf16_kernels()
    return weight.dtype == torch.float32 and not cpu_has_bf16_kernels()


def cpu_has_bf16_kernels() -> bool:
    """Whether oneDNN has bf16 kernels on this CPU (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX). Without them
    (an AVX2-only CPU) it refuses to pack a bf16 weight, and torch's fallback bf16 matmul is several times
    slower than fp32."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def weight_stamp(w: torch.Tensor) -> tuple[int, int]:
    """What moves when a weight changes: its version counter (an optimizer step, `load_state_dict`) and its
    storage (`.to()` another device or dtype)."""
    return w._version, w.data_ptr()


def copy_applies(x: torch.Tensor, w: torch.Tensor, stamp: tuple[int, int]) -> bool:
    """Whether a copy of `w` made when its `weight_stamp` was `stamp` may stand in for it in a linear over
    `x`: the weight has not changed since, and autograd does not want the op. PackedLinear and
    headway.int8.Int8Linear both ask this before using their copy."""
    return weight_stamp(w) == stamp and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if x.dtype != w.dtype or x.device != w.device or not copy_applies(x, w, self._packed_stamp):
        return nn.functional.linear(x, w, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight, self.bias, "none", [], "")


class PackedLinear(nn.Linear):
    """nn.Linear whose inference forward reads a pre-packed copy of the weight (see the module docstring)."""

    forward = _packed_forward

    def repack(self) -> None:
        with torch.no_grad():
            self._packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS)
        self._packed_stamp = weight_stamp(self.weight)


def pack_linears(model: nn.Module) -> int:
    """Give every CPU nn.Linear of `model` whose dtype `packing_available` admits a packed weight; returns
    how many were packed (0 for a CUDA model, or one in the dtype this CPU does not pack)."""
    n = 0
    for module in model.modules():
        if type(module) in (nn.Linear, PackedLinear) and packing_available(module.weight):
            module.__class__ = PackedLinear  # already packed: packed again, from the weight as it is now
            module.repack()
            n += 1
    return n
