#!/usr/bin/env bash
# The test suite: creates or reuses .venv, installs headway, prepares the target, runs pytest.
#   ./scripts/test.sh                 # everything
#   ./scripts/test.sh -k config -x    # extra arguments go to pytest
source "$(dirname "$0")/_env.sh"
echo "== preparing the target"
python scripts/prepare_target.py
echo "== running the tests"
python -m pytest -q --durations=15 "$@"   # the 15 slowest tests, to see where the time goes
