#!/usr/bin/env bash
# Set up a virtual environment with the package and the demo's extra (matplotlib), then run the
# offline CPU demo: a synthetic GSM8K-format task, the shipped warm-up checkpoint of a tiny
# character-level Llama, then GRPO and VinePPO side by side from it. Nothing is downloaded at run time
# (set-up installs packages).
# Usage: bash scripts/demo.sh [demo flags, e.g. --seed 1; --help lists them]
#        bash scripts/demo.sh --where_credit_pays [--seeds N]   what survives tuning on the agent credit toy
#          (docs/where-credit-pays.md): where the oracle's tuned gain is largest, the best tuned GRPO, the oracle
#          and practical arms side by side, each at its tuned learning rate and batch; about a minute
#        bash scripts/demo.sh --where_credit_pays_untuned [--seeds N]   the untuned map's crossover (one lr)
#        bash scripts/demo.sh --stability [SETTING]   the committed stability curve of one setting (default chain_H2)
#          as demo_output/stability.png: collapse share and tokens to target against the learning rate, one line per
#          arm, from benchmarks/results/lm_stability.json (docs/lm-stability-protocol.md); nothing is retrained
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
  exec "$VENV/bin/python" benchmarks/credit_map_tuned_demo.py --output demo_output/where_credit_pays.json "$@"
fi
if [ "${1:-}" = "--where_credit_pays_untuned" ]; then
  shift
  exec "$VENV/bin/python" benchmarks/where_credit_pays_demo.py --output demo_output/where_credit_pays_untuned.json "$@"
fi
if [ "${1:-}" = "--stability" ]; then
  shift
  exec "$VENV/bin/python" benchmarks/lm_stability.py --plot "${1:-chain_H2}" --output demo_output/stability.png
fi
"$VENV/bin/python" -m mcadvantage.demo --output_dir demo_output "$@"
