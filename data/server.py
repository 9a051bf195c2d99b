"""Answers from a serving engine: token ids in, the target's own token ids back (never re-tokenised text).

    data:
      generation: {backend: server, server_url: "http://127.0.0.1:8000", server_api: openai, batch_size: 64}

    server = TokenServer.from_config(cfg)          # the target's config and generation config, no weights
    ServerGenerator(server, 64, 256, {2}).run(jobs)  # the same jobs as the local generator (data/generate.py)

`batch_size` requests are in flight at once (threads); the server batches them. Every job callback runs
under one lock, so the distiller's bookkeeping needs no threading of its own. The prompt goes as a list
of token ids, so the loss mask stays exact. What each API is relied on for:

- `openai` (`POST /v1/completions`; vLLM, SGLang, llama-server): `prompt` as a list of ids (the OpenAI
  spec allows it), `max_tokens`, `temperature`, `top_p`, `seed`, `stop_token_ids` (vLLM/SGLang
  extension). The generated ids are read from `choices[0].token_ids` when the server returns them (vLLM
  with `"return_token_ids": true`, sent with every request; vLLM >= 0.10.2), else from
  `choices[0].logprobs.content[i].id` (llama-server, which fills it when `logprobs` is asked, also sent),
  else from `logprobs.tokens` written as "token_id:N" (vLLM started with `--return-tokens-as-token-ids`).
  A server that returns none of these is refused with a message naming them.
- `llamacpp` (llama-server's own `POST /completion`): `return_tokens: true` returns the ids, the
  stopping EOS included; `stop_type` says why it stopped. Greedy is `top_k: 1` alone, as
  headway/llamacpp_server.py does; sampling runs llama.cpp's temperature then top-p samplers only.

An answer counts as finished when its last id is one of the target's stop ids; a server that reports a
stop without returning the stop id gets it appended when the target has exactly one. Sampling is seeded
per turn (`seed`), as the local generator is. Hidden states never come back from a server: data.features
must stay empty, and offline training extracts them once (scripts/cache_features.py).
Only llama-server is tested here (tests/test_generate_server.py, both APIs).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from headway.cli import UserError
from headway.data.generate import Answer, Job
from headway.sampling import SamplingParams


@dataclass
class TokenServer:
    """Where the server is, and the target's config (positions) and generation config (stop ids)."""

    url: str
    api: str = "openai"
    model_name: str | None = None
    config: object = None
    generation_config: object = None
    timeout: float = 600.0

    @classmethod
    def from_config(cls, cfg) -> TokenServer:
        from transformers import AutoConfig, GenerationConfig

        from headway.target import pick_device, pick_dtype, resolve_target

        g = cfg.data.generation
        if not g.server_url:
            raise UserError("data.generation.backend is server but data.generation.server_url is not set")
        folder = resolve_target(cfg.target.name)
        config = AutoConfig.from_pretrained(folder)
        # The dtype training loads the target in here: the fingerprint then matches the trainer's.
        config.dtype = pick_dtype(cfg.target.dtype, pick_device(cfg.target.device))
        try:
            gen_config = GenerationConfig.from_pretrained(folder)
        except OSError:
            gen_config = None
        return cls(g.server_url.rstrip("/"), g.server_api, g.server_model, config, gen_config)

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.url}{path} failed ({e.code}): {e.read().decode(errors='replace')[:2000]}") from e
        except urllib.error.URLError as e:
            raise RuntimeError(f"cannot reach the generation server at {self.url} ({e.reason}): is it running?") from e

    def complete(self, ids: list[int], max_new_tokens: int, eos_ids: set[int], sampling: SamplingParams, seed: int) -> Answer:
        if self.api == "llamacpp":
            tokens, stopped = self._llamacpp(ids, max_new_tokens, sampling, seed)
        else:
            tokens, stopped = self._openai(ids, max_new_tokens, eos_ids, sampling, seed)
        tokens = tokens[:max_new_tokens]
        if stopped and (not tokens or tokens[-1] not in eos_ids) and len(tokens) < max_new_tokens and len(eos_ids) == 1:
            tokens.append(next(iter(eos_ids)))  # the server stopped at EOS without returning its id
        return Answer(tokens, finished=bool(tokens) and tokens[-1] in eos_ids)

    def _sampling(self, sampling: SamplingParams, seed: int) -> dict:
        if sampling.greedy:
            return {"temperature": 0.0, "top_k": 1}
        out = {"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": seed}
        return out | ({"top_k": sampling.top_k} if sampling.top_k else {})

    def _llamacpp(self, ids, max_new_tokens, sampling, seed) -> tuple[list[int], bool]:
        body = {"prompt": list(ids), "n_predict": max_new_tokens, "return_tokens": True, "cache_prompt": True}
        body.update(self._sampling(sampling, seed))
        chain = ["top_k"] if sampling.greedy or sampling.top_k else []
        body.update({"samplers": chain + ([] if sampling.greedy else ["temperature", "top_p"]), "min_p": 0.0})
        out = self.post("/completion", body)
        if "tokens" not in out:
            raise RuntimeError(f"{self.url}/completion returned no `tokens` (return_tokens unsupported?): keys {sorted(out)}")
        return list(out["tokens"]), out.get("stop_type") == "eos"

    def _openai(self, ids, max_new_tokens, eos_ids, sampling, seed) -> tuple[list[int], bool]:
        body = {
            "prompt": list(ids),
            "max_tokens": max_new_tokens,
            "stop_token_ids": sorted(eos_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
            "logprobs": 1,
        }
        if self.model_name:
            body["model"] = self.model_name
        body.update(self._sampling(sampling, seed))
        choice = self.post("/v1/completions", body)["choices"][0]
        return _choice_token_ids(choice, self.url), choice.get("finish_reason") == "stop"


def _choice_token_ids(choice: dict, url: str) -> list[int]:
    if choice.get("token_ids") is not None:  # vLLM, return_token_ids
        return list(choice["token_ids"])
    logprobs = choice.get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if content and all("id" in c for c in content):  # llama-server
        return [int(c["id"]) for c in content]
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):  # vLLM --return-tokens-as-token-ids
        return [int(t.removeprefix("token_id:")) for t in tokens]
    if not choice.get("text"):
        return []
    raise RuntimeError(
        f"{url}/v1/completions returned text but no token ids: headway reads choices[0].token_ids "
        "(vLLM: return_token_ids), logprobs.content[i].id (llama-server) or logprobs.tokens as 'token_id:N' "
        "(vLLM --return-tokens-as-token-ids); re-tokenised text would misalign the loss mask"
    )


class ServerGenerator:
    """The local `Generator`'s interface over a `TokenServer`: `batch_size` conversations in flight."""

    def __init__(self, server: TokenServer, batch_size: int, max_new_tokens: int, eos_ids: set[int], sampling=None, on_answer=None):
        self.server, self.batch_size, self.max_new_tokens = server, batch_size, max_new_tokens
        self.eos, self.sampling, self.on_answer = set(eos_ids), sampling or SamplingParams(), on_answer

    def run(self, jobs: Iterable[Job]) -> None:
        queue, lock, errors = iter(jobs), threading.Lock(), []

        def work() -> None:
            try:
                while not errors:
                    with lock:
                        job = next(queue, None)
                        turn = None if job is None else job.first_turn()
                    if job is None:
                        return
                    while turn is not None and not errors:
                        answer = self.server.complete(turn.ids, self.max_new_tokens, self.eos, self.sampling, turn.seed)
                        with lock:
                            if self.on_answer is not None:
                                self.on_answer(answer)
                            turn = job.answered(answer)
                    with lock:
                        if not errors:
                            job.done(None)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(self.batch_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
