"""Where an EAGLE-3 draft call's time goes: self CPU time of the ops inside EagleTreeDrafter.draft.

    python docs/results/2026-12-05-smollm2/draft_profile/prof_draft.py   # from the repo root; output: profile.txt

The first Spec-Bench question of three domains, 96 new tokens each, with the recipe's auto tree budget;
torch.profiler with record_shapes (it inflates small ops), matmuls keyed by their input shapes.
"""

from collections import defaultdict

from torch.profiler import ProfilerActivity, profile, record_function

from headway.config import load_config
from headway.inference.build import build_engine
from headway.inference.questions import load_questions
from headway.target import load_target

cfg = load_config("configs/smollm2-135m/eagle3.yaml")
target, tok = load_target(cfg.target)
setup = build_engine(cfg, "runs/smollm2-135m/eagle3", target, tok)
eng = setup.engine
print(setup.info.get("tree"), setup.info.get("budget"))
prompts = []
for q in load_questions(cfg.eval.questions, per_domain=1)[:3]:
    ids = tok.apply_chat_template([{"role": "user", "content": q.turns[0]}], add_generation_prompt=True)
    prompts.append(ids if isinstance(ids, list) else ids["input_ids"])
eng.generate([prompts[0]], max_new_tokens=32)  # warm-up

draft = eng.drafter.draft


def labelled_draft(*args, **kwargs):
    with record_function("DRAFT"):
        return draft(*args, **kwargs)


eng.drafter.draft = labelled_draft
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for ids in prompts:
        out = eng.generate([ids], max_new_tokens=96)
print(out.timings)

totals: dict[str, list] = defaultdict(lambda: [0.0, 0])


def walk(event) -> None:
    key = event.name + (str(event.input_shapes) if event.name == "aten::mm" else "")
    totals[key][0] += event.self_cpu_time_total
    totals[key][1] += 1
    for child in event.cpu_children:
        walk(child)


calls = 0
for event in prof.events():
    if event.name == "DRAFT":
        calls += 1
        walk(event)
total = sum(v[0] for v in totals.values())
print("draft calls", calls, "total ms", total / 1000, "per call", total / 1000 / calls)
for key, (us, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"{key[:110]:110s} {us / 1000:8.1f} ms {n:6d} calls  {us / 1000 / calls:.2f} ms/draft")
