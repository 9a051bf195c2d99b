"""Where the generator's time goes on the real mix (file + passage sources), batch 64, features on."""
import random, sys, time
import torch
from headway.config import load_config
from headway.data.chat import first_turn_ids
from headway.data.generate import Generator, generate_batch
from headway.data.sources import load_conversations
from headway.data.distill import data_feature_spec
from headway.target import load_target, stop_token_ids

cfg = load_config("configs/smollm2-135m/data.yaml")
model, tok = load_target(cfg.target)
eos = stop_token_ids(model, tok)
convs, _ = load_conversations(cfg.data)
prompts = [first_turn_ids(tok, c.turns[0]) for c in convs]
prompts = [p for p in prompts if len(p) <= 768]
random.Random(0).shuffle(prompts)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 192
MAXNEW = int(sys.argv[2]) if len(sys.argv) > 2 else 128
capture = data_feature_spec(cfg.data.features, model.config.num_hidden_layers) if "nofeat" not in sys.argv else None
batch = prompts[:N]
print("prompt tokens mean", sum(map(len, batch)) / N)
T = {"prefill": [0.0, 0, 0], "decode": [0.0, 0, 0]}
orig = Generator._feed
def timed_feed(self, cache, rows, idx):
    t = time.perf_counter()
    out = orig(self, cache, rows, idx)
    kind = "decode" if idx is None else "prefill"
    T[kind][0] += time.perf_counter() - t
    T[kind][1] += 1
    return out
Generator._feed = timed_feed
import headway.data.generate as G
generate_batch(model, prompts[-4:], 8, eos)
for k in T: T[k] = [0.0, 0, 0]
t0 = time.perf_counter()
with torch.inference_mode():
    if capture is None:
        ans = generate_batch(model, batch, MAXNEW, eos, batch_size=64)
    else:
        got = []
        gen = G.make_generator(model, 64, MAXNEW, eos, None, capture, None)
        jobs = [G._OneAnswer(i, G.Turn(list(p), 0), lambda i, a: None) for i, p in enumerate(batch)]
        ans = None
        gen.run(jobs)
wall = time.perf_counter() - t0
print(f"wall {wall:.1f}s; prefill {T['prefill'][0]:.1f}s in {T['prefill'][1]} forwards; decode {T['decode'][0]:.1f}s in {T['decode'][1]} steps ({1000*T['decode'][0]/max(1,T['decode'][1]):.1f} ms/step); other {wall-T['prefill'][0]-T['decode'][0]:.1f}s")
