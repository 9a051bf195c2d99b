"""Keep freed CPU memory in the process instead of handing it back to the OS page by page; report the peak.

    from headway.memory import keep_freed_cpu_memory, peak_memory, release_if_above
    keep_freed_cpu_memory()     # once, early in a CPU run; True where it took effect (Linux, glibc)
    bound = CreepBound()        # after each step: bound.after_step() hands the heap's free pages back (malloc_trim)
                                # once resident memory has crept 2 GB past what the first steps settled at
    peak_memory(device)         # {"rss": GB resident at most so far, "cuda": GB allocated at most on device}

glibc serves every block above its mmap threshold (at most 32 MiB) with a fresh mmap and unmaps it on
free, so a training step that allocates the same large activations every step faults all their pages
in again, and the kernel zeroes each one. On the SmolLM2 EAGLE-3 recipe (batch 8, up to 1,024 tokens,
7 unrolled steps) that was 307 million minor page faults and 12% of the run's CPU time in the kernel;
with this, 60 steps took 171 s instead of 205 s (system time 6 s instead of 50), same losses.
Here blocks come from the heap (`M_MMAP_MAX` 0) and freed memory at its top is kept (a high
`M_TRIM_THRESHOLD`), so the next step reuses pages already mapped. The cost is that the process holds
on to its peak memory instead of returning it between steps, and the heap fragments: measured on the
EAGLE-3 recipe's largest possible batch (8 rows of 1,024 tokens, 512 of them generated), 6.5 GB peak
resident against 5.3 GB without it, for 85 s of CPU time over 6 steps against 135 s. Kept alone, the
heap also fragments across the steps' differing shapes and resident memory creeps up with the step
count (Medusa-1 on the quickstart data: 5.3 GB after 80 steps, 8.8 GB after 300, 13.2 GB after 954;
3.4 GB without keeping, but 75% slower), so the training loop calls `release_freed_cpu_memory`
(glibc's `malloc_trim`, which returns free pages inside the heap too) after any step that leaves memory
resident past a `CreepBound`: `CREEP_MARGIN_GB` above the most the first `SETTLE_STEPS` steps left, and at
least `TRIM_ABOVE_GB`. The bound is relative because a fixed one below a recipe's working set (EAGLE-3 keeps
about 4.3 GB) would trim after every step and bring every fault back. The peak then
grows with batch x max_seq_len only, never with the dataset (heads/soft_ce.py, heads/eagle_attention.py,
data/feature_cache.py ShardFile). Elsewhere (macOS, musl, Windows) it does nothing. GLIBC_TUNABLES does the same from the shell:
`GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
M_MMAP_MAX = -4
_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes a C int: keep up to 2 GiB of free heap top

TRIM_ABOVE_GB = 4.0  # never release below this many resident GB (train/loop.py)
CREEP_MARGIN_GB = 2.0  # release once resident memory is this far past the settled level
SETTLE_STEPS = 3  # steps whose resident memory sets the settled level

_applied: bool | None = None


def keep_freed_cpu_memory() -> bool:
    """Tell glibc's malloc to serve large blocks from the heap and keep freed memory; True if it did."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        _ = libc.gnu_get_libc_version  # only glibc has it (musl's mallopt is a no-op)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    return _applied


def release_freed_cpu_memory() -> bool:
    """Return the heap's free pages to the OS (glibc `malloc_trim(0)`); a no-op unless keeping took effect."""
    if not _applied:
        return False
    return bool(_malloc_trim()(0))


@functools.cache
def _malloc_trim():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc.malloc_trim


def resident_gb() -> float | None:
    """This process's anonymous resident memory (its heap) now, in GB (Linux; None elsewhere).

    Resident file pages (the shared libraries) are left out: they come and go with the page cache, so
    another process's memory use would otherwise move the bounds below."""
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
            pages = int(fields[1]) - int(fields[2])  # resident - resident shared (file-backed)
    except (OSError, ValueError, IndexError):
        return None
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 1e9


def release_if_above(limit_gb: float = TRIM_ABOVE_GB) -> bool:
    """`release_freed_cpu_memory` when keeping took effect and more than `limit_gb` is resident."""
    if not _applied:
        return False
    rss = resident_gb()
    return rss is not None and rss > limit_gb and release_freed_cpu_memory()


class CreepBound:
    """Release kept memory after a step only when fragmentation has made it creep past the settled level.

    The settled level is the most resident memory any of the first `settle_steps` steps left behind (the
    kept working set); a later step that leaves more than `margin_gb` above it, and above `floor_gb`,
    triggers `release_freed_cpu_memory`. Steady steps keep their pages, so their faults stay gone.
    """

    def __init__(self, floor_gb: float = TRIM_ABOVE_GB, margin_gb: float = CREEP_MARGIN_GB, settle_steps: int = SETTLE_STEPS):
        self.floor_gb, self.margin_gb, self.settle_steps = floor_gb, margin_gb, settle_steps
        self.settled_gb = 0.0
        self.steps = 0
        self.releases = 0

    @property
    def limit_gb(self) -> float:
        return max(self.floor_gb, self.settled_gb + self.margin_gb)

    def after_step(self) -> bool:
        """Call once per step; True when this call released memory."""
        if not _applied:
            return False
        self.steps += 1
        if self.steps <= self.settle_steps:
            self.settled_gb = max(self.settled_gb, resident_gb() or 0.0)
            return False
        released = release_if_above(self.limit_gb)
        self.releases += released
        return released


def peak_memory(device=None) -> dict[str, float]:
    """This process's peak memory so far in GB (1e9 bytes): resident set, and CUDA allocated on `device`."""
    out = {}
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["rss"] = round(rss * (1 if sys.platform == "darwin" else 1024) / 1e9, 3)  # macOS: bytes; Linux: KiB
    except ImportError:  # Windows
        pass
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        out["cuda"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 3)
    return out


def format_peak(peak: dict[str, float]) -> str:
    parts = [f"{peak['rss']:.2f} GB resident"] if "rss" in peak else []
    parts += [f"{peak['cuda']:.2f} GB CUDA allocated"] if "cuda" in peak else []
    return "peak memory: " + (", ".join(parts) or "not measured on this platform")
