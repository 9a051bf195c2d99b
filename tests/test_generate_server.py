"""The server backend: llama-server answers the distiller's conversations from token ids and returns the
target's own ids, so the rows (ids and loss mask) equal the local fp32 generator's.

An f16 GGUF converted from the prepared SmolLM2 gives fp32 greedy tokens (tests/test_llamacpp_run.py);
llama-server runs one thread (two stall badly on a shared CPU).
"""

from __future__ import annotations

import json

import pytest
from lossless_common import one_thread  # noqa: F401  (small ops: one thread is steadier on a shared CPU)

from headway.config import Config, DataConfig, GenerationConfig, SourceConfig
from headway.data.dataset import load_distilled, load_meta
from headway.data.distill import distill

pytestmark = [pytest.mark.slow, pytest.mark.real_target]

PROMPTS = [
    {"turns": ["Say hi.", "Now say bye."]},
    {"turns": ["What is 2+2?"]},
    {"turns": ["Name a colour.", "And another one?"]},
]


@pytest.fixture(scope="module")
def server(smol_path, tmp_path_factory):
    from headway.llamacpp import ensure_llamacpp
    from headway.llamacpp_server import LlamaServer

    llama = ensure_llamacpp(log=lambda m: print(m, flush=True))
    gguf = llama.convert(smol_path, tmp_path_factory.mktemp("gguf") / "smollm2-f16.gguf", outtype="f16")
    with LlamaServer(llama, gguf, threads=1) as srv:
        yield srv


def _cfg(tmp_path, name: str, **gen) -> Config:
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    g = GenerationConfig(max_new_tokens=24, batch_size=2, shard_size=2, max_prompt_tokens=200, **gen)
    data = DataConfig(output_dir=str(tmp_path / name), sources=[SourceConfig(path=str(src), domain="chat")], generation=g)
    return Config(data=data)


def _rows(out) -> dict:
    ds = load_distilled(out)
    return {r["prompt_id"]: (r["input_ids"], r["loss_mask"], r["num_turns"], r["finished"]) for s in ds.values() for r in s}


@pytest.mark.parametrize("api", ["llamacpp", "openai"])
def test_server_rows_equal_local_fp32_rows(server, api, tmp_path, smol_tok, smol_fp32):
    quiet = dict(log=lambda *_: None)
    local = _cfg(tmp_path, "local")
    distill(local, model=smol_fp32, tok=smol_tok, **quiet)
    served = _cfg(tmp_path, "served", backend="server", server_url=server.url, server_api=api)
    summary = distill(served, **quiet)  # no model: the backend loads only the tokenizer and config
    assert summary["examples"] == len(PROMPTS)
    want, got = _rows(local.data.output_dir), _rows(served.data.output_dir)
    assert got == want, "the server's token ids, not re-tokenised text"
    assert sum(n for _, _, n, _ in got.values()) == 5 and any(f for *_, f in got.values()), "two-turn rows, an EOS"
    ident = load_meta(served.data.output_dir)["identity"]
    assert ident["generation"]["backend"] == "server" and "server_url" not in ident["generation"]
