#!/usr/bin/env bash
# Set up a virtual environment with the package and the demo's extra (matplotlib), then run the
# offline CPU demo: a synthetic GSM8K-format task, the shipped warm-up checkpoint of a tiny
# character-level Llama, then GRPO and VinePPO side by side from it. Nothing is downloaded at run time
# (set-up installs packages).
# Usage: bash scripts/demo.sh [demo flags, e.g. --seed 1; --help lists them]
#        bash scripts/demo.sh --where_credit_pays [--seeds N]   the map's crossover on the agent credit toy
#          (docs/where-credit-pays.md): GRPO and the credit arm that wins, side by side; about a minute
#   VENV=path   where the virtual environment lives (default: .venv)
# Outputs in demo_output/: learning_curve.png, responses.html, metrics.json.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
source scripts/_setup_venv.sh
setup_start=$SECONDS
setup_venv "$VENV" demo
echo "[demo.sh] environment ready in $((SECONDS - setup_start))s ($VENV)"
if [ "${1:-}" = "--where_credit_pays" ]; then
  shift
  exec "$VENV/bin/python" benchmarks/where_credit_pays_demo.py --output demo_output/where_credit_pays.json "$@"
fi
"$VENV/bin/python" -m mcadvantage.demo --output_dir demo_output "$@"
