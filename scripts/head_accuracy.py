"""Per-head top-1..top-10 accuracy of trained Medusa heads on the validation split (what a static tree is built from).

    python scripts/head_accuracy.py --checkpoint runs/smollm2-135m/medusa
    python scripts/head_accuracy.py --checkpoint DIR --config configs/smollm2-135m/medusa.yaml --max-rows 200

Head k at position t is scored on y[t+k+1] wherever tokens t+1..t+k+1 are all target-generated (the
training rule); a label outside the draft vocabulary counts as a miss. The target and the data come
from the run's run_config.json unless --config says otherwise. Writes DIR/head_accuracy.json:
{"accuracy": [[top1..top10] per head], "positions": [...], "per_domain": {domain: {...}}, ...}.
"""

import sys

from headway.inference.head_accuracy import main

if __name__ == "__main__":
    sys.exit(main())
