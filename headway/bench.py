"""Timing helpers: wall time (and peak memory) of one call, on CPU or CUDA.

    with timed(device) as m: ...    # m.seconds, with the device's queued work finished at both ends
    with measure(device) as m: ...  # m.seconds and m.peak_bytes (samples RSS on CPU: benchmarks only)
    per_call_us(lambda: f(x), n=100)  # a CPU micro-benchmark: mean microseconds per call after a warm-up
    totals = interleaved(runs, items, run)  # A/B: each item through every run back to back, order rotated
    print(*ab_table(totals, arms, kinds, "weights"), sep="\n")  # tokens/s per run; last arm over first
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headway.packed import cpu_has_bf16_kernels


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Measurement:
    seconds: float = 0.0
    peak_bytes: int = 0  # CUDA: peak allocated; CPU: peak resident set growth during the call


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(device: torch.device):
    """`with timed(dev) as m: ...` fills m.seconds: the block's wall time, device work included."""
    m = Measurement()
    sync(device)
    t0 = time.perf_counter()
    yield m
    sync(device)
    m.seconds = time.perf_counter() - t0


def per_call_us(f: Callable[[], object], n: int = 100, warmup: int = 3) -> float:
    """Mean wall microseconds of `f()` over n calls, after `warmup` untimed ones (CPU kernels)."""
    for _ in range(warmup):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return 1e6 * (time.perf_counter() - t0) / n


@contextmanager
def measure(device: torch.device):
    """`with measure(dev) as m: ...` fills m.seconds and m.peak_bytes."""
    m = Measurement()
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        t0 = time.perf_counter()
        yield m
        sync(device)
        m.seconds = time.perf_counter() - t0
        m.peak_bytes = torch.cuda.max_memory_allocated(device) - base
        return
    base = peak = _rss_bytes() if os.path.exists("/proc/self/statm") else 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.wait(0.005):
            peak = max(peak, _rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    if base:
        sampler.start()
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        m.seconds = time.perf_counter() - t0
        stop.set()
        if base:
            sampler.join()
            m.peak_bytes = max(0, peak - base)


def cpu_info() -> tuple[str, list[str]]:
    """(model name, instruction-set flags) of this CPU, from /proc/cpuinfo ("flags" on x86, "Features" on
    ARM); elsewhere platform's names, split like flags."""
    model, flags = None, None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = value.strip()
            elif key in ("flags", "Features") and flags is None:
                flags = value.split()
    except OSError:
        pass
    if flags is None:
        flags = (platform.machine() + platform.processor()).split()
    return model or platform.processor() or platform.machine() or "unknown CPU", flags


def hardware(device: torch.device) -> str:
    """What the timings ran on, for reports: figures from different machines do not compare (a CPU with
    AMX verifies 16 tokens for the cost of one; one without pays 1.45x)."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    model, flags = cpu_info()
    extras = [name for flag, name in (("avx512f", "AVX-512"), ("amx_tile", "AMX")) if flag in flags]
    if not cpu_has_bf16_kernels():
        extras.append("no oneDNN bf16 kernels")  # auto dtype fp32 (headway.target.pick_dtype)
    return ", ".join([model, f"{torch.get_num_threads()} threads", *extras])


def mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


@dataclass
class ArmTotals:
    tokens: int = 0
    seconds: float = 0.0
    answers: dict = field(default_factory=dict)  # item key -> the tokens the arm produced

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def interleaved(
    arms: Sequence[Hashable],
    items: Sequence[tuple[Hashable, object]],
    run: Callable[[Hashable, object], list[int]],
    progress: bool = True,
) -> dict[Hashable, ArmTotals]:
    """Every (key, payload) item runs through every arm back to back, the arms' order rotated by one
    per item, so the machine's drift hits all arms alike; `run(arm, payload)` returns the tokens made.
    Warm the arms up before calling (first calls pay one-off costs)."""
    totals = {arm: ArmTotals() for arm in arms}
    for i, (key, payload) in enumerate(items):
        for arm in [*arms[i % len(arms):], *arms[: i % len(arms)]]:
            t = time.perf_counter()
            tokens = run(arm, payload)
            totals[arm].seconds += time.perf_counter() - t
            totals[arm].tokens += len(tokens)
            totals[arm].answers[key] = tokens
        if progress:
            print(f"{i + 1}/{len(items)} done", flush=True)
    return totals


def ab_table(totals: dict, arms: Sequence[str], kinds: Sequence[str], label: str) -> list[str]:
    """Lines of an A/B report over `interleaved` runs keyed (arm, kind): a markdown table of tokens/s, each
    run over the first kind in the same arm, then per kind the last arm over the first and how many
    answers the two share to the token."""
    base_kind, old, new = kinds[0], arms[0], arms[-1]
    lines = [f"| {label} | method | tokens | seconds | tokens/s | over {base_kind}, same {label} |", "|---|---|---|---|---|---|"]
    for arm in arms:
        for kind in kinds:
            t = totals[(arm, kind)]
            lines.append(
                f"| {arm} | {kind} | {t.tokens} | {t.seconds:.1f} | {t.tokens_per_s:.1f} | "
                f"{t.tokens_per_s / totals[(arm, base_kind)].tokens_per_s:.3f}x |"
            )
    for kind in kinds:
        a, b = totals[(new, kind)], totals[(old, kind)]
        same = sum(a.answers.get(k) == v for k, v in b.answers.items())
        lines.append(
            f"{kind}: {new} / {old} tokens/s {a.tokens_per_s / b.tokens_per_s:.3f}x; answers identical {same}/{len(b.answers)}"
        )
    return lines
