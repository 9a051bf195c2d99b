# Sourced by quickstart.sh and test.sh: create or reuse .venv and install the project into it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.headway-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "== installing headway and its dependencies into .venv"
  python -m pip install -q --upgrade pip >/dev/null
  # Without a GPU take the CPU build of torch (a plain `pip install torch` pulls the multi-GB CUDA build).
  if ! python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
      python -m pip install -q "torch>=2.4,<2.15"
    else
      python -m pip install -q "torch==2.13.0"
    fi
  fi
  python -m pip install -q -e ".[dev]"
  touch "$stamp"
fi
export TOKENIZERS_PARALLELISM=false
export WANDB_MODE=${WANDB_MODE:-offline}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-0}
