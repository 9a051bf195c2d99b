"""Replays prompt-lookup strategies on fixed greedy answers: tau and tau per unit of verify cost.

    python replay_lookup.py gen data/prompts/spec_bench/question.jsonl 6 plain6.json   # 6 per domain, 128 tokens
    python replay_lookup.py sim plain6.json

An experiment of 2026-12-01 (not a maintained tool): it re-implements the lookup rule of
inference/drafters/lookup.py in plain Python so variants can be compared on the same text; COST is the
verify-cost curve of the 2026-12-01 EAGLE-3 report (2-core CPU without AMX).
"""
import json
import sys

import torch

from headway.config import TargetConfig
from headway.data.chat import first_turn_ids
from headway.inference.questions import load_questions
from headway.target import load_target

COST = {1: 1.0, 2: 1.04, 4: 1.09, 8: 1.23, 12: 1.35, 16: 1.45, 24: 1.67, 32: 1.90}
def cost(n):
    ks = sorted(COST)
    for a, b in zip(ks, ks[1:], strict=False):
        if a <= n <= b:
            return COST[a] + (COST[b] - COST[a]) * (n - a) / (b - a)
    return COST[32]

def gen(path, out):
    model, tok = load_target(TargetConfig(name="smollm2-135m-instruct", dtype="bfloat16"))
    qs = load_questions(path, per_domain=int(sys.argv[3]))
    res = []
    for q in qs:
        ids = first_turn_ids(tok, q.turns[0])
        x = torch.tensor([ids])
        with torch.no_grad():
            y = model.generate(x, max_new_tokens=128, do_sample=False)
        res.append({"domain": q.category, "prompt": ids, "answer": y[0, len(ids):].tolist()})
        print(q.category, len(res), flush=True)
    json.dump(res, open(out, "w"))

if __name__ == "__main__" and sys.argv[1] == "gen":
    gen(sys.argv[2], sys.argv[4])

def index(seq, nmax):
    starts = {}
    for end in range(1, len(seq) + 1):
        for n in range(1, min(nmax, end) + 1):
            starts.setdefault(tuple(seq[end - n:end]), []).append(end)
    return starts

def candidates(hist, starts_upto, nmin, nmax, L, k, order, adaptive):
    """hist: tokens incl. root. Returns list of (n, cont)."""
    T = len(hist)
    out, seen = [], set()
    for n in range(min(nmax, T - 1), nmin - 1, -1):
        key = tuple(hist[T - n:])
        occ = [s for s in starts_upto.get(key, []) if s < T]
        if not occ:
            continue
        occ = occ[::-1] if order == "recent" else occ
        for s in occ[:4 * k]:
            length = adaptive.get(n, L) if adaptive else L
            cont = hist[s:s + length]
            for i in range(s + len(cont), s + length):
                cont.append(cont[i - T] if i - T < len(cont) else hist[-1])
            t = tuple(cont)
            if any(x[:len(t)] == t for x in seen):
                continue
            seen.add(t)
            out.append((n, cont))
            if len(out) == k:
                return out
        if order == "first_n_only" and out:
            return out
    return out

def nodes(cands):
    trie = set()
    for _, c in cands:
        for i in range(1, len(c) + 1):
            trie.add(tuple(c[:i]))
    return len(trie)

def simulate(rows, **kw):
    per_dom = {}
    for r in rows:
        seq = r["prompt"] + r["answer"]
        starts = index(seq, kw["nmax"])
        P, A = len(r["prompt"]), r["answer"]
        t = 0  # answer tokens emitted; the first answer token comes from prefill
        t = 1
        steps = c = 0
        while t < len(A):
            hist = seq[:P + t]  # root = A[t-1]
            cands = candidates(hist, starts, kw["nmin"], kw["nmax"], kw["L"], kw["k"], kw["order"], kw.get("adaptive"))
            best = 0
            for _, cont in cands:
                m = 0
                while m < len(cont) and t + m < len(A) and cont[m] == A[t + m]:
                    m += 1
                best = max(best, m)
            steps += 1
            c += cost(1 + nodes(cands))
            t += best + 1
        d = per_dom.setdefault(r["domain"], [0, 0, 0.0])
        d[0] += len(A) - 1
        d[1] += steps
        d[2] += c
    out = {}
    for dom, (tok, st, c) in sorted(per_dom.items()):
        out[dom] = (tok / st, tok / c)
    T, S, C = (sum(v[i] for v in per_dom.values()) for i in range(3))
    out["all"] = (T / S, T / C)
    return out

if __name__ == "__main__" and sys.argv[1] == "sim":
    rows = json.load(open(sys.argv[2]))
    configs = {
        "ours (recent, n1-4, L10, k3)": dict(order="recent", nmin=1, nmax=4, L=10, k=3),
        "earliest n1-4 L10 k3": dict(order="earliest", nmin=1, nmax=4, L=10, k=3),
        "HF-like (earliest, n1-2, L10, k1)": dict(order="earliest", nmin=1, nmax=2, L=10, k=1, ),
        "recent n1-2 L10 k1": dict(order="recent", nmin=1, nmax=2, L=10, k=1),
        "recent n1-4 L10 k1": dict(order="recent", nmin=1, nmax=4, L=10, k=1),
        "earliest n1-4 L10 k1": dict(order="earliest", nmin=1, nmax=4, L=10, k=1),
        "recent n2-4 L10 k3": dict(order="recent", nmin=2, nmax=4, L=10, k=3),
        "recent n1-4 k3 adaptive(1:3,2:6)": dict(order="recent", nmin=1, nmax=4, L=10, k=3, adaptive={1: 3, 2: 6}),
        "recent n1-4 k1 adaptive(1:3,2:6)": dict(order="recent", nmin=1, nmax=4, L=10, k=1, adaptive={1: 3, 2: 6}),
        "recent n1-4 L16 k1": dict(order="recent", nmin=1, nmax=4, L=16, k=1),
        "recent n1-4 k2": dict(order="recent", nmin=1, nmax=4, L=10, k=2),
    }
    for name, kw in configs.items():
        r = simulate(rows, **kw)
        print(f"{name:40s} " + "  ".join(f"{d[:5]} {t:.2f}/{s:.2f}" for d, (t, s) in r.items()))
