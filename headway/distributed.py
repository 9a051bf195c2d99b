"""accelerate's process state, with the CPU case made to work under `accelerate launch`.

On a machine without an accelerator, accelerate forms the gloo process group only when told
cpu=True; otherwise every launched process believes it is alone and they all do the same work.
"""

from __future__ import annotations

import torch


def wants_cpu(device_spec: str = "auto") -> bool:
    if device_spec != "auto":
        return torch.device(device_spec).type == "cpu"
    return not torch.cuda.is_available() and not (
        getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    )


def process_state(device_spec: str = "auto"):
    from accelerate import PartialState

    return PartialState(cpu=wants_cpu(device_spec))
