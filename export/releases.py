"""Engine release ranges: what each range of vLLM / SGLang releases loads, and what it refuses.

    release = release_for("vllm")            # the newest checked range (vLLM 0.33)
    release = release_for("vllm", "0.30.1")  # the range holding 0.30.1 (vLLM 0.12-0.32)
    check_release(release, "medusa", dims, where)   # ExportError naming the release and the reason

The key tables (export/engine_keys.py) hold per (engine, method) what every range loads alike; a range
adds what changed between releases. Checked against the loaders' source (read, not copied):
- vLLM <= 0.11 Medusa (vllm/model_executor/models/medusa.py @ 09cddad8f032): lm_heads sized by
  `truncated_vocab_size`, a `token_map` scatters their logits to target ids; reduced vocabularies load.
- vLLM 0.12-0.32 Medusa (issue 16's check of v0.32.0): lm_heads sized by the full `vocab_size`, the
  loader asserts the row count, so reduced-vocabulary heads fail to load.
- vLLM 0.33 (v0.33.0 vllm/config/speculative.py): no "medusa" method at all; 0.32.0 is the last with it.
  Its weight loader raises on a name the model does not have (except `.bias`); earlier ranges, and
  SGLang 0.5.23's EAGLE-3 loader, skip such names without a word.
- vLLM EAGLE-3 (llama_eagle3.py @ 583507d13075 and v0.31+): `t2d` is never loaded; `d2t` is optional
  (without it draft id = target id); from 0.31 no `draft_id_to_target_id` exists when
  draft_vocab_size == vocab_size, so a `d2t` there raises. Export leaves both out in that case, which
  every range loads. The top-level `eagle_aux_hidden_state_layer_ids` are hidden_states indices.
- SGLang 0.5.23 EAGLE-3 (python/sglang/srt/models/llama_eagle3.py @ d737979cbd17 and v0.5.23): reads only
  `eagle_config.eagle_aux_hidden_state_layer_ids`, adds 1 and captures the input of that layer, so the
  last layer's output (hidden_states[L]) cannot be captured; `--dtype auto` turns a float32 draft into
  float16. No Medusa.
"""

from __future__ import annotations

from dataclasses import dataclass

from headway.export.engine_keys import EXPORT_BLOCK, Dims, ExportError, Source

_VLLM = "vllm-project/vllm"
_SGL = "sgl-project/sglang"
Version = tuple[int, ...]


@dataclass(frozen=True)
class Release:
    """A range of one engine's releases that load headway's folders alike."""

    engine: str  # vllm | sglang
    name: str  # what --engine-version shows and accepts, e.g. "0.12-0.32"
    first: Version | None  # oldest release covered (None: every older one)
    last: Version  # newest release covered, compared on as many parts as it has
    methods: tuple[str, ...]  # draft methods it serves
    medusa_reduced_vocab: bool = False  # loads Medusa heads with truncated_vocab_size < vocab_size
    unknown_weights: str = "skipped without an error"  # what the loader does with a name it lacks
    sources: tuple[Source, ...] = ()

    @property
    def label(self) -> str:
        return f"{'vLLM' if self.engine == 'vllm' else 'SGLang'} {self.name}"

    def covers(self, version: Version) -> bool:
        above = self.first is None or version >= self.first
        return above and version[: len(self.last)] <= self.last


RELEASES: tuple[Release, ...] = (
    Release(
        "vllm",
        "<=0.11",
        None,
        (0, 11),
        ("medusa", "eagle1", "eagle3"),
        medusa_reduced_vocab=True,
        sources=(
            Source(_VLLM, "vllm/model_executor/models/medusa.py", "09cddad8f0324594022359cd2b07e962a14b895f"),
        ),
    ),
    Release(
        "vllm",
        "0.12-0.32",
        (0, 12),
        (0, 32),
        ("medusa", "eagle1", "eagle3"),
        sources=(Source(_VLLM, "vllm/model_executor/models/medusa.py", "v0.32.0"),),
    ),
    Release(
        "vllm",
        "0.33",
        (0, 33),
        (0, 33),
        ("eagle1", "eagle3"),
        unknown_weights="refused: the loader raises (names ending in .bias excepted)",
        sources=(
            Source(_VLLM, "vllm/config/speculative.py", "v0.33.0"),
            Source(_VLLM, "vllm/model_executor/models/llama_eagle3.py", "v0.33.0"),
        ),
    ),
    Release(
        "sglang",
        "0.5.23",
        (0, 5, 23),
        (0, 5, 23),
        ("eagle1", "eagle3"),
        sources=(Source(_SGL, "python/sglang/srt/models/llama_eagle3.py", "v0.5.23"),),
    ),
)


def parse_version(text: str) -> Version:
    try:
        return tuple(int(p) for p in text.strip().removeprefix("v").split("."))
    except ValueError:
        raise ExportError(f"--engine-version {text!r}: not a version such as 0.32.0") from None


def releases_of(engine: str) -> list[Release]:
    return [r for r in RELEASES if r.engine == engine]


def release_for(engine: str, version: str | None = None) -> Release:
    """The checked range holding `version` (a release such as 0.30.1, or a range name); None: the newest."""
    ranges = releases_of(engine)
    if not ranges:
        raise ExportError(f"no checked releases of engine {engine!r}")
    if version is None:
        return ranges[-1]
    named = [r for r in ranges if r.name == version]
    if named:
        return named[0]
    v = parse_version(version)
    found = [r for r in ranges if r.covers(v)]
    if not found:
        known = ", ".join(r.name for r in ranges)
        raise ExportError(
            f"--engine-version {version}: no checked {ranges[0].label.split()[0]} release range holds it "
            f"(checked: {known}); its loader was not read, so nothing is promised to load there"
        )
    return found[0]


def check_release(release: Release, method: str, dims: Dims, where: str) -> None:
    """What the release cannot load at all, as an ExportError naming release and reason."""
    if method not in release.methods:
        if release.engine == "vllm" and method == "medusa":
            raise ExportError(
                f"{where}: {release.label} has no Medusa method (its speculative config allows no 'medusa'); "
                "vLLM 0.32.0 is the last release with Medusa: export with --engine-version 0.32 and serve "
                "with vllm<=0.32.0, or train an EAGLE-3 drafter"
            )
        raise ExportError(
            f"{where}: {release.label} has no {method} drafter; it serves {', '.join(release.methods)}"
        )
    if method == "medusa" and dims.draft_vocab < dims.vocab and not release.medusa_reduced_vocab:
        raise ExportError(
            f"{where}: {release.label} sizes each Medusa lm_heads.i by the full vocab_size ({dims.vocab}) and "
            f"asserts the row count, so heads over a {dims.draft_vocab}-token draft vocabulary fail to load; "
            "only vLLM <= 0.11 loads them (--engine-version 0.11). Full-vocabulary heads cannot be written "
            "exactly: a zero row for a token outside the draft vocabulary scores 0, not -inf, and would be "
            "drafted wherever every draft logit is negative. Retrain with medusa.draft_vocab_size=null"
        )


def release_of_folder(config: dict, engine: str, method: str, dims: Dims, where: str) -> Release:
    """The range a folder is checked for: the one its `headway_export` block names, else the newest
    checked range of `engine` that loads it (else the newest, whose refusal names the reason)."""
    block = config.get(EXPORT_BLOCK) or {}
    if block.get("engine") == engine and block.get("engine_version"):
        return release_for(engine, block["engine_version"])
    for release in reversed(releases_of(engine)):
        try:
            check_release(release, method, dims, where)
            return release
        except ExportError:
            continue
    return release_for(engine)
