"""Greedy generation through `llama-server`: token ids in, token ids and llama.cpp's timings out.

    with LlamaServer(llama, "target.gguf", threads=2) as srv:
        out = srv.complete(prompt_ids, n_predict=64)   # exactly 64 new tokens (EOS is masked)
        out.tokens, out.timings["predicted_per_second"], out.timings.get("draft_n_accepted")

The prompt goes in as token ids (rendered by headway's chat template), so llama.cpp's own tokenizer
and template never enter a comparison. Greedy is `top_k: 1` with the `top_k` sampler alone; EOS is
masked (`ignore_eos`) so every run yields the same count, as headway's references do (pass
`ignore_eos=False` to stop there). `extra_args` adds server flags, e.g. `["-md", "draft.gguf",
"--spec-type", "draft-eagle3"]`; with `--metrics` among them, `spec_counters()` reads the server's
speculative counters (drafted, accepted, verification steps, accepted per draft position), whose
difference over one request is that request's.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from headway.llamacpp import LlamaCpp


@dataclass(frozen=True)
class Completion:
    tokens: list[int]
    timings: dict  # prompt_n, predicted_n, predicted_per_second, ... and draft_n / draft_n_accepted
    probs: list[dict] = field(default_factory=list)  # with n_probs: per token, its top_logprobs [{id, logprob}]


class LlamaServer:
    def __init__(
        self,
        llama: LlamaCpp,
        model: str | Path,
        threads: int = 2,
        ctx_size: int = 4096,
        extra_args: tuple[str, ...] | list[str] = (),
        startup_timeout: float = 120.0,
    ):
        self.cmd = [
            str(llama.binary("llama-server")), "-m", str(model), "-t", str(threads), "-tb", str(threads),
            "-c", str(ctx_size), "-np", "1", "--host", "127.0.0.1", "--no-webui", *map(str, extra_args),
        ]  # fmt: skip
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> LlamaServer:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([*self.cmd, "--port", str(port)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {' '.join(self.cmd)}\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise TimeoutError(f"llama-server not ready after {self.startup_timeout:.0f} s: {' '.join(self.cmd)}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self, chars: int = 4000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:]

    def complete(self, prompt_ids: list[int], n_predict: int, **fields) -> Completion:
        """Greedy continuation of `prompt_ids`; `fields` go into the request (e.g. `speculative.n_max`)."""
        body = {
            "prompt": list(prompt_ids),
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "samplers": ["top_k"],
            "ignore_eos": True,
            "cache_prompt": False,
            "return_tokens": True,
            **fields,
        }
        req = urllib.request.Request(
            self.url + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"llama-server /completion failed ({e.code}): {e.read().decode()[:2000]}") from e
        return Completion(list(out["tokens"]), dict(out["timings"]), out.get("completion_probabilities", []))

    def spec_counters(self) -> SpecCounters:
        """The server's speculative counters so far (started with `--metrics`)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return parse_spec_counters(r.read().decode())


SPEC_COUNTERS = {
    "llamacpp:spec_decode_num_draft_tokens_total": "drafted",
    "llamacpp:spec_decode_num_accepted_tokens_total": "accepted",
    "llamacpp:spec_decode_num_drafts_total": "steps",  # verification steps that carried a draft
}
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecCounters:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    per_position: tuple[int, ...] = ()  # accepted drafts at draft position 0, 1, ...

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.per_position), len(other.per_position))
        a = self.per_position + (0,) * (n - len(self.per_position))
        b = other.per_position + (0,) * (n - len(other.per_position))
        return SpecCounters(
            self.drafted - other.drafted,
            self.accepted - other.accepted,
            self.steps - other.steps,
            tuple(x - y for x, y in zip(a, b, strict=True)),
        )


def parse_spec_counters(text: str) -> SpecCounters:
    """The speculative counters of llama-server's Prometheus `/metrics` text (zeros when none are listed)."""
    values, positions = {}, {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if name in SPEC_COUNTERS:
            values[SPEC_COUNTERS[name]] = int(float(value))
        elif name.startswith(PER_POSITION + "{"):
            positions[int(name.split('"')[1])] = int(float(value))
    per_position = tuple(positions.get(i, 0) for i in range(len(positions)))
    return SpecCounters(**values, per_position=per_position)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
