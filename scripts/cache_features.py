"""Cache the target features an EAGLE recipe trains on, so training runs no target forward.

    python scripts/cache_features.py --config configs/smollm2-135m/eagle3.yaml
    python scripts/cache_features.py --config configs/smollm2-135m/eagle.yaml eagle.feature_cache_dir=runs/smollm2-135m/features-eagle1
    python scripts/cache_features.py --config ... --batch-size 32 --shard-rows 256 [--overwrite]

Writes eagle.feature_cache_dir (manifest.json + {train,validation}/shard-*.safetensors, with the train
split's per-dimension feature statistics). Interrupt it at any time: a rerun resumes at the first
unfinished shard. A cache made for another target, dataset, feature set or max length is refused.
Prints rows, tokens, time, and bytes on disk (total and per 1,000 sequences).
"""

import sys

from headway.train.cache_features import main

if __name__ == "__main__":
    sys.exit(main())
