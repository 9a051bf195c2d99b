"""Timing helpers: wall time (and peak memory) of one call, on CPU or CUDA.

    with timed(device) as m: ...    # m.seconds, with the device's queued work finished at both ends
    with measure(device) as m: ...  # m.seconds and m.peak_bytes (samples RSS on CPU: benchmarks only)
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch


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


def hardware(device: torch.device) -> str:
    """What the timings ran on, for reports: figures from different machines do not compare (a CPU with
    AMX verifies 16 tokens for the cost of one; one without pays 1.45x)."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    model, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        import platform

        model = platform.processor() or platform.machine() or model
    extras = [name for flag, name in (("avx512f", "AVX-512"), ("amx_tile", "AMX")) if flag in flags]
    return ", ".join([model, f"{torch.get_num_threads()} threads", *extras])


def mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"
