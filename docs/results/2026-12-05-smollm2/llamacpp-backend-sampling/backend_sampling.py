"""llama.cpp draft flags against the plain drafter (issue 16): does a flag make the EAGLE-3 draft pay more?

    python docs/results/2026-12-05-smollm2/llamacpp-backend-sampling/backend_sampling.py   # from the repo root
    python docs/results/2026-12-05-smollm2/llamacpp-backend-sampling/backend_sampling.py --spec-draft-p-min 0.3

plain f16, the headway drafter (q8_0, one token per step) and the same with the flags given (default:
--spec-draft-backend-sampling), Spec-Bench 3 per domain, 128 tokens, two threads per server, interleaved
per prompt (inference/llamacpp_eval.py).
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.inference.llamacpp_eval import DRAFTER, LlamaConfig, LlamaRunner, configs_for, read_manifest
from headway.inference.questions import load_questions
from headway.llamacpp import ensure_llamacpp
from headway.target import load_tokenizer

FLAGS = sys.argv[1:] or ["--spec-draft-backend-sampling"]
EXPORT = Path("exports/smollm2-eagle3-llamacpp")
manifest = read_manifest(EXPORT)
base = {c.name: c for c in configs_for(EXPORT, "f16", (), (), None, ("f16",))}
configs = [
    base["plain-f16"],
    base["eagle3-f16"],
    LlamaConfig("eagle3-f16 " + " ".join(FLAGS), "f16", DRAFTER, (*base["eagle3-f16"].args, *FLAGS)),
]
target_dir = Path(manifest["target_folder"])
tok = load_tokenizer(TargetConfig(name=str(target_dir)))
gen = json.loads((target_dir / "generation_config.json").read_text()).get("eos_token_id")
eos = {tok.eos_token_id} | (set(gen) if isinstance(gen, list) else {gen})
questions = load_questions("data/prompts/spec_bench/question.jsonl", 3)
records = []
with LlamaRunner(ensure_llamacpp(), EXPORT, configs, tok, eos, 2, 8192) as runner:
    runner.warm_up(first_turn_ids(tok, "Say hello."))
    for i, q in enumerate(questions):
        records += runner.run_question(q, i, 128)
agg = defaultdict(lambda: [0, 0.0, 0, 0, 0])
for r in records:
    a = agg[r.config]
    a[0] += len(r.tokens)
    a[1] += r.predicted_ms
    a[2] += r.drafted
    a[3] += r.accepted
    a[4] += r.draft_steps
plain = agg["plain-f16"][0] / agg["plain-f16"][1]
for name, (n, ms, drafted, accepted, _steps) in agg.items():
    rate = n / ms * 1000
    print(f"{name:45s} {rate:6.1f} tokens/s  {rate / 1000 / plain:.3f}x  accepted {accepted}/{drafted}")
print(json.dumps({k: v for k, v in agg.items()}))
