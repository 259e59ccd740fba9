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
