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
step()  # warm-up: the heap grows to the peak
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
# The kept heap fragments and still grows now and then (measured: the last growth anywhere from step 2 to
# step 9, by 60-100 MiB, depending on where the blocks land), so count many steps, not two settled ones.
for _ in range(10):
    step()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _probe(code: str) -> dict:
    """Run a probe in a fresh interpreter; skip where keeping freed memory takes no effect (not glibc)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode and "AssertionError" in out.stderr:
        pytest.skip("not glibc: keep_freed_cpu_memory is a no-op here")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is being tuned")
def test_freed_memory_is_reused_without_page_faults():
    default, kept = _faults("default"), _faults("keep")
    if not kept["applied"]:
        pytest.skip("not glibc: keep_freed_cpu_memory is a no-op here")
    # Ten steps of 235 MiB are 601,600 pages: glibc's default unmaps each block on free and faults it in again
    # (measured 576,000); kept, 19,000-82,000 over twelve runs.
    assert default["faults"] > 100_000, default
    assert kept["faults"] < default["faults"] / 4, (default, kept)



RELEASE_PROBE = """
import json, torch
from headway.memory import keep_freed_cpu_memory, release_if_above, resident_gb
assert keep_freed_cpu_memory()
xs = [torch.empty(mib * 2**18, dtype=torch.float32).fill_(1.0) for mib in (100, 200, 300)]
pin = torch.ones(1)  # allocated last: sits above the freed blocks, so plain top-trimming cannot return them
del xs
kept = resident_gb()
below = release_if_above(kept + 1.0)  # under the bound: nothing released
after_below = resident_gb()
released = release_if_above(0.0)
print(json.dumps({"kept": kept, "below": below, "after_below": after_below, "released": released, "after": resident_gb()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is being tuned")
def test_kept_memory_is_released_past_the_bound():
    r = _probe(RELEASE_PROBE)
    # 600 MiB freed but kept: resident until released, then handed back
    assert not r["below"] and r["after_below"] > r["kept"] - 0.1, r
    assert r["released"] and r["after"] < r["kept"] - 0.5, r


CREEP_PROBE = """
import json, torch
from headway.memory import CreepBound, keep_freed_cpu_memory, resident_gb
assert keep_freed_cpu_memory()
bound = CreepBound(floor_gb=0.0, margin_gb=0.6, settle_steps=2)
def step(mib):
    xs = [torch.empty(mib * 2**18, dtype=torch.float32).fill_(1.0), torch.ones(1)]  # the pin keeps blocks from the top
    pins.append(xs.pop())
    del xs
    return bound.after_step()
pins = []
settle = [step(200), step(200)]  # sets the settled level: 200 MiB kept
# Fits in what is kept, yet the heap still fragments (small mallocs land in the split hole): measured over 52
# runs, the three steps left 0 to 314 MB above the settled level, which is what margin_gb must cover.
steady = [step(150) for _ in range(3)]  # nothing to release
grown = [step(1200) for _ in range(2)]  # the kept heap creeps past settled + 0.6 GB
print(json.dumps({"settle": settle, "steady": steady, "grown": grown, "settled": bound.settled_gb,
                  "releases": bound.releases, "after": resident_gb()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc is what is being tuned")
def test_creep_bound_releases_only_past_the_settled_level():
    r = _probe(CREEP_PROBE)
    assert r["settle"] == [False, False] and r["steady"] == [False] * 3, r  # the working set stays kept
    assert r["grown"][0] and r["releases"] >= 1, r  # crept about 1 GB past the settled level: released
    assert r["after"] < r["settled"] + 0.6, r
