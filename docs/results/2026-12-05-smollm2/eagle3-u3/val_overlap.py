"""How much of the validation answers' text the training split already holds (can validation top-1 be memorised?).

    python docs/results/2026-12-05-smollm2/eagle3-u3/val_overlap.py runs/smollm2-135m/data

For each validation row, the share of its answer tokens (loss-mask positions) that end a 16-token window
(context included) also found anywhere in a training row, per domain.
"""

import sys
from collections import defaultdict

from headway.data.dataset import load_distilled

N = 16
ds = load_distilled(sys.argv[1])


def windows(ids):
    return {hash(tuple(ids[i - N : i])) for i in range(N, len(ids) + 1)}


seen = set()
for row in ds["train"].select_columns(["input_ids"]):
    seen |= windows(row["input_ids"])
hit, total = defaultdict(int), defaultdict(int)
for row in ds["validation"].select_columns(["input_ids", "loss_mask", "domain"]):  # load_distilled requires them
    ids, mask, dom = row["input_ids"], row["loss_mask"], row["domain"]
    for i in range(N, len(ids) + 1):
        if not mask[i - 1]:  # the window ends on a prompt token
            continue
        total[dom] += 1
        hit[dom] += hash(tuple(ids[i - N : i])) in seen
for dom in sorted(total):
    print(f"{dom:15s} {hit[dom] / total[dom]:.3f} of {total[dom]} answer tokens end a 16-token window seen in training")
print(f"{'all':15s} {sum(hit.values()) / sum(total.values()):.3f} of {sum(total.values())}")
