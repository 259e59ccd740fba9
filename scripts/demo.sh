#!/usr/bin/env bash
# Set up a virtual environment with the package and the demo's extra (matplotlib), then run the
# offline CPU demo: a synthetic GSM8K-format task, the shipped warm-up checkpoint of a tiny
# character-level Llama, then GRPO and VinePPO side by side from it. Nothing is downloaded at run time
# (set-up installs packages).
# Usage: bash scripts/demo.sh [demo flags, e.g. --seed 1; --help lists them]
#   VENV=path   where the virtual environment lives (default: .venv)
# Outputs in demo_output/: learning_curve.png, responses.html, metrics.json.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
source scripts/_setup_venv.sh
setup_start=$SECONDS
setup_venv "$VENV" demo
echo "[demo.sh] environment ready in $((SECONDS - setup_start))s ($VENV)"
"$VENV/bin/python" -m mcadvantage.demo --output_dir demo_output "$@"
