"""int8 drafter weights for CPU inference: a draft forward reads a quarter of its fp32 bytes.

    quantize_drafter(drafter, "int8")   # inference.draft_quantization; every CPU nn.Linear of a frozen
                                # drafter but those it names in `unquantized_linears` gets an int8 copy

A draft forward at batch 1 is bound by memory bandwidth: it reads every weight of the drafter (EAGLE-3
for SmolLM2: about 9M parameters per tree level, most of them the 8,192 x 576 draft lm_head) to compute
8 rows. With int8 weights (symmetric, one scale per output row) and activations quantised per call
(torch's dynamic-quantised linear: fbgemm or oneDNN) it reads a quarter of fp32's bytes. One scale per
call cannot hold inputs with outliers: EAGLE's fc, which reads the target's un-normed features, stays
as it is (heads/eagle.py says why, with numbers).

Only drafters are quantised, never the target: a draft token is a proposal that the target verifies
with its own weights, so greedy output stays the target's token for token and sampling keeps the
target's distribution (the acceptance rule divides by the q the drafter actually drafted from). What
int8 can change is which tokens are drafted, so acceptance: measure it (`scripts/evaluate.py` with
`inference.draft_quantization=int8` against `none`, or the A/B script in docs/results).

Like headway/packed.py the module stays an nn.Linear whose `weight` is kept as it was (state_dict,
dtype and device unchanged); its forward falls back to `F.linear` whenever the int8 copy may not
apply: autograd wants the op, the input is not on the CPU, or the weight changed after quantising
(its version counter or storage moved). The int8 copy is a plain attribute, never saved.
The quantised kernels are CPU only: on CUDA nothing is quantised (quantize_linears returns 0).
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import nn

from headway.packed import PackedLinear, copy_applies, weight_stamp

# Activations are quantised to 7 bits: x86 int8 kernels without VNNI (AVX2) add pairs of u8 x s8
# products in 16 bits, which 8-bit activations can overflow. torch's own dynamic qconfig for x86 does the same.
REDUCE_RANGE = True


def int8_available(weight: torch.Tensor) -> bool:
    """A floating-point CPU weight, and a torch whose dynamic int8 linear runs here."""
    return weight.device.type == "cpu" and weight.is_floating_point() and _kernel_runs()


@functools.cache
def _kernel_runs() -> bool:
    # torch marks its quantised-tensor API deprecated (pytorch#184982): a build without it quantises nothing.
    try:
        with torch.inference_mode():
            return _int8_linear(torch.ones(2, 4), _prepack(torch.ones(3, 4), None)).shape == (2, 3)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def _prepack(w: torch.Tensor, bias: torch.Tensor | None):
    """Symmetric int8 weights, one scale per output row, packed for the CPU's int8 kernel."""
    w = w.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
    zero = torch.zeros(w.shape[0], dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
        qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(qw, None if bias is None else bias.detach().float())


def _int8_linear(x: torch.Tensor, packed) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x.float(), packed, REDUCE_RANGE).to(x.dtype)


def _int8_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu" or not copy_applies(x, self.weight, self._int8_stamp):
        return nn.functional.linear(x, self.weight, self.bias)
    return _int8_linear(x, self._int8_packed)


class Int8Linear(nn.Linear):
    """nn.Linear whose inference forward reads an int8 copy of its weight (see the module docstring)."""

    forward = _int8_forward

    def quantize(self) -> None:
        self._int8_packed = _prepack(self.weight, self.bias)
        self._int8_stamp = weight_stamp(self.weight)


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Give every CPU nn.Linear of `model` an int8 copy of its weight, except those whose name ends with
    one of `skip`; returns how many (0 on CUDA). Call it before headway.packed.pack_linears: a quantised
    layer is no longer packed."""
    n = 0
    for name, module in model.named_modules():
        if name.endswith(skip):  # an empty tuple matches nothing
            continue
        if type(module) in (nn.Linear, PackedLinear, Int8Linear) and int8_available(module.weight):
            module.__class__ = Int8Linear
            module.quantize()
            n += 1
    return n


def quantize_drafter(drafter: nn.Module, kind: str = "int8") -> int:
    """inference.draft_quantization `kind` ("none" or "int8") applied to a drafter: quantize_linears, leaving
    the linears it names in `unquantized_linears` (inputs with outliers that one activation scale per call
    cannot hold). Returns how many were quantised."""
    if kind == "none":
        return 0
    return quantize_linears(drafter, tuple(getattr(drafter, "unquantized_linears", ())))
