"""llama.cpp built from the sdist (or reused from the cache) runs the prepared SmolLM2 greedily.

The prepared checkpoint goes through llama.cpp's own converter to an f16 GGUF; llama-server continues
Spec-Bench chat prompts (token ids from headway's template) and must give headway's fp32 greedy tokens.
Measured here: f16 and f32 GGUFs equal transformers fp32 on 12 prompts x 64 tokens; the shipped Q4_1
and a q8_0 GGUF diverge after 7-64 tokens, so they are not what this compares.
The first run builds llama.cpp (about 650 CPU-seconds); later runs reuse the cache.
"""

from __future__ import annotations

import pytest
from lossless_common import EOS, MAX_NEW, plain_greedy, prompts

from headway.llamacpp import ensure_llamacpp
from headway.llamacpp_server import LlamaServer

pytestmark = [pytest.mark.slow, pytest.mark.real_target]


@pytest.fixture(scope="module")
def llama():
    return ensure_llamacpp(log=lambda m: print(m, flush=True))


def test_plain_greedy_equals_headway_fp32(llama, smol_path, smol_tok, smol_fp32, tmp_path):
    gguf = llama.convert(smol_path, tmp_path / "smollm2-f16.gguf", outtype="f16")
    ids_list = prompts(smol_tok)[:3]
    refs = plain_greedy(smol_fp32, ids_list)
    # One thread: with two, llama.cpp's thread barrier stalls badly when another process holds a core.
    with LlamaServer(llama, gguf, threads=1) as srv:
        outs = [srv.complete(ids, n_predict=MAX_NEW) for ids in ids_list]
    for ids, ref, out in zip(ids_list, refs, outs, strict=True):
        assert out.timings["predicted_n"] == MAX_NEW and out.timings["prompt_n"] == len(ids)
        got = out.tokens[: out.tokens.index(EOS) + 1] if EOS in out.tokens else out.tokens
        assert got == ref, f"llama.cpp f16 {got} != headway fp32 {ref}"
