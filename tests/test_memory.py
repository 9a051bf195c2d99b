"""keep_freed_cpu_memory: a large block freed and allocated again must not fault its pages in again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Run in a fresh interpreter: mallopt changes the whole process, and the other tests must see the default.
PROBE = """
import json, resource, sys, torch
from headway.memory import keep_freed_cpu_memory
applied = keep_freed_cpu_memory() if sys.argv[1] == "keep" else False
def step():  # what a training step does: large activations of several sizes, written, then freed
    xs = [torch.empty(mib * 2**18, dtype=torch.float32).fill_(1.0) for mib in (10, 40, 100, 25, 60)]
    del xs
for _ in range(3):  # warm-up: the heap grows to the peak and its free blocks settle
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    step()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is being tuned")
def test_freed_memory_is_reused_without_page_faults():
    default, kept = _faults("default"), _faults("keep")
    if not kept["applied"]:
        pytest.skip("not glibc: keep_freed_cpu_memory is a no-op here")
    # Two steps of 235 MiB are 120,320 pages: glibc's default unmaps each block on free and faults it in again.
    assert default["faults"] > 10_000, default
    assert kept["faults"] < default["faults"] / 4, (default, kept)

