"""llama.cpp on Spec-Bench prompts: plain, n-gram speculation, the headway drafter, and drafter + n-gram.

    configs = configs_for(export_dir, ngram=NGRAM_TYPES, combos=("ngram-simple",), variants=(DraftSettings(2, 0.6),))
    with LlamaRunner(llama, export_dir, configs, tok, eos={2}, threads=1, ctx=4096) as runner:
        records = [r for i, q in enumerate(questions) for r in runner.run_question(q, i, max_new_tokens=128)]

Every configuration is one llama-server (started once, `--metrics`, greedy, one slot), so a prompt runs
through all of them back to back, in an order rotated per prompt (machine drift hits all alike). Turns of
a multi-turn question continue each configuration's own answers, rendered with headway's chat template
(token ids in, so llama.cpp's tokenizer and template never enter). Each turn stops at EOS or
`max_new_tokens`; its record holds the tokens, llama.cpp's prompt and decode times and the
speculative counters of that request (drafted, accepted, steps with a draft, accepted per position).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from headway.export.llamacpp import MANIFEST
from headway.export.serve import DraftSettings, flash_attn_args
from headway.llamacpp import LlamaCpp
from headway.llamacpp_server import LlamaServer

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
DRAFTER = "draft-eagle3"


@dataclass(frozen=True)
class LlamaConfig:
    name: str  # plain-f16, ngram-simple, eagle3-f16, eagle3+ngram-mod, ...
    target: str  # target GGUF kind (the export's file target-<kind>.gguf)
    spec_type: str | None = None  # --spec-type; None: plain decoding
    args: tuple[str, ...] = ()  # further server flags (the draft model, draft tokens per step)

    @property
    def kind(self) -> str:
        if self.spec_type is None:
            return "plain"
        return (
            "drafter"
            if self.spec_type == DRAFTER
            else ("ngram" if DRAFTER not in self.spec_type else "combined")
        )

    def server_args(self) -> list[str]:
        return ([] if self.spec_type is None else ["--spec-type", self.spec_type]) + list(self.args)


def read_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder} has no {MANIFEST}: export the drafter with scripts/export.py --to llamacpp"
        )
    return json.loads(path.read_text())


def eos_ids(target_folder: str | Path, tok) -> set[int]:
    """The ids generation stops at: the tokenizer's EOS and the generation config's (without loading weights)."""
    ids = {tok.eos_token_id}
    gen = Path(target_folder) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(eos) if isinstance(eos, list) else {eos}
    return {i for i in ids if i is not None}


def configs_for(
    folder: str | Path,
    primary: str = "f16",
    ngram: tuple[str, ...] = NGRAM_TYPES,
    combos: tuple[str, ...] = ("ngram-simple", "ngram-mod"),
    n_max: int | None = None,
    spec_targets: tuple[str, ...] | None = None,
    p_min: float | None = None,
    variants: tuple[DraftSettings, ...] = (),
    flash_attn: str | None = None,
) -> list[LlamaConfig]:
    """Plain decoding with every target GGUF of the export; the drafter with each of `spec_targets` (default:
    every one); n-gram speculation and drafter + n-gram with the `primary` target; the drafter with other
    draft settings (`variants`, named eagle3-PRIMARY-n2-p0.6) on the primary target. The drafter's own
    settings are the export's unless `n_max` / `p_min` are given. Every server, plain ones included, runs
    with the export's flash attention setting (its serve command's -fa) unless `flash_attn` is given."""
    manifest = read_manifest(folder)
    targets = list(manifest["targets"])
    if primary not in targets:
        raise ValueError(f"target GGUF {primary!r} is not in {folder} (it has {', '.join(targets)})")
    unknown = [t for t in (*ngram, *combos) if t not in NGRAM_TYPES]
    if unknown:
        raise ValueError(f"n-gram types {unknown}: llama.cpp has {', '.join(NGRAM_TYPES)}")
    model = ("-md", str(Path(folder).resolve() / manifest["draft"]))
    own = draft_settings(manifest, n_max, p_min)
    fa = flash_attn_args(flash_attn_setting(manifest, flash_attn))
    draft = (*model, *own.args(), *fa)
    out = [LlamaConfig(f"plain-{t}", t, None, fa) for t in targets]
    out += [LlamaConfig(f"eagle3-{t}", t, DRAFTER, draft) for t in (spec_targets or targets)]
    out += [LlamaConfig(n, primary, n, fa) for n in ngram]
    out += [LlamaConfig(f"eagle3+{n}", primary, f"{DRAFTER},{n}", draft) for n in combos]
    out += [
        LlamaConfig(f"eagle3-{primary}-{v.label}", primary, DRAFTER, (*model, *v.args(), *fa))
        for v in variants
        if v != own
    ]
    return out


def draft_settings(manifest: dict, n_max: int | None = None, p_min: float | None = None) -> DraftSettings:
    """The export's draft settings (exports before p_min was written never cut drafts), or the ones given."""
    return DraftSettings(n_max or manifest["n_max"], manifest.get("p_min", 0.0) if p_min is None else p_min)


def flash_attn_setting(manifest: dict, flash_attn: str | None = None) -> str | None:
    """The -fa value the export serves with, or the one given; None (exports before it was written):
    llama.cpp's default."""
    return flash_attn or manifest.get("flash_attn")


@dataclass
class TurnRecord:
    """One turn of one question under one configuration."""

    config: str
    question_id: int | str
    domain: str
    turn: int
    prompt_tokens: int
    tokens: list[int]
    prompt_ms: float
    predicted_ms: float
    drafted: int = 0
    accepted: int = 0
    draft_steps: int = 0  # verification steps that carried a draft
    per_position: list[int] = field(default_factory=list)  # steps whose draft position i was accepted


class LlamaRunner:
    """One llama-server per configuration, alive for the whole run."""

    def __init__(
        self, llama: LlamaCpp, folder, configs: list[LlamaConfig], tok, eos: set[int], threads=1, ctx=4096
    ):
        self.llama, self.folder, self.configs, self.tok, self.eos = llama, Path(folder), configs, tok, eos
        self.threads, self.ctx = threads, ctx
        self.servers: dict[str, LlamaServer] = {}

    def __enter__(self) -> LlamaRunner:
        manifest = read_manifest(self.folder)
        try:
            for c in self.configs:
                gguf = self.folder / manifest["targets"][c.target]
                srv = LlamaServer(self.llama, gguf, self.threads, self.ctx, [*c.server_args(), "--metrics"])
                self.servers[c.name] = srv.__enter__()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for srv in self.servers.values():
            srv.__exit__(None, None, None)
        self.servers = {}

    def warm_up(self, ids: list[int], n: int = 8) -> None:
        for srv in self.servers.values():
            srv.complete(ids, n, ignore_eos=False)

    def complete(self, config: str, ids: list[int], max_new: int) -> dict:
        srv = self.servers[config]
        before = srv.spec_counters()
        out = srv.complete(ids, max_new, ignore_eos=False)
        spec = srv.spec_counters() - before
        tokens = out.tokens
        cut = next((i + 1 for i, t in enumerate(tokens) if t in self.eos), len(tokens))
        return {
            "tokens": tokens[:cut],
            "prompt_ms": float(out.timings["prompt_ms"]),
            "predicted_ms": float(out.timings["predicted_ms"]),
            "drafted": spec.drafted,
            "accepted": spec.accepted,
            "draft_steps": spec.steps,
            "per_position": list(spec.per_position),
        }

    def run_question(self, q, index: int, max_new: int) -> list[TurnRecord]:
        """Every configuration on every turn of `q`, in an order rotated by `index`."""
        from headway.inference.evaluate import turn_ids

        names = [c.name for c in self.configs]
        order = names[index % len(names) :] + names[: index % len(names)]
        state = {n: {"messages": [], "ids": None, "ended": False} for n in names}
        records = []
        for turn, text in enumerate(q.turns):
            for name in order:
                st = state[name]
                st["messages"].append({"role": "user", "content": text})
                prompt = turn_ids(self.tok, st["messages"], st["ids"], st["ended"])
                out = self.complete(name, prompt, max_new)
                toks = out["tokens"]
                records.append(TurnRecord(name, q.question_id, q.domain, turn, len(prompt), **out))
                st["ended"] = bool(toks) and toks[-1] in self.eos
                st["ids"] = prompt + toks
                answer = self.tok.decode(toks[:-1] if st["ended"] else toks, skip_special_tokens=False)
                st["messages"].append({"role": "assistant", "content": answer})
        return records
