"""benchmarks/horizon_gradient.py: the error at equal sampled tokens, the resumable records and how the sweep's
report folds them into its JSON and page."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import horizon_gradient as hg  # noqa: E402
import horizon_sweep as hs  # noqa: E402
from _runs import read_run  # noqa: E402


def test_equal_token_error_by_hand():
    """g = (1, 0), batches g + e and g - e with e = (0, 0.5): scale 1, mean error 0 (no bias), one batch's noise
    the unbiased variance 2 * 0.25 = 0.5; at a budget of two batches' tokens the error is 0.5 / 2 = 0.25."""
    exact = torch.tensor([1.0, 0.0])
    grads = [torch.tensor([1.0, 0.5]), torch.tensor([1.0, -0.5])]
    out = hg.equal_token_error(grads, exact, [10, 10], budget=20, resamples=50)
    assert out["bias"] == 0.0 and out["noise_per_batch"] == pytest.approx(0.5)
    assert out["rel_sq_error"] == pytest.approx(0.25)
    # a biased estimator: the same error on every batch stays at any budget
    biased = hg.equal_token_error([torch.tensor([1.0, 0.5])] * 3, exact, [10] * 3, budget=1000, resamples=50)
    assert biased["noise_per_batch"] == 0.0 and biased["rel_sq_error"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="at least 2"):
        hg.equal_token_error(grads[:1], exact, [10], budget=20)


def test_records_resume_and_the_sweep_report_folds_them_into_json_and_page(tmp_path, capsys):
    root = tmp_path / "gradient"
    tiny = ["--root", str(root), "--params", "turn", "--structures", "delayed", "--horizons", "2", "--rates", "0.5",
            "--arms", "grpo", "oracle", "vineppo_k1", "--repeats", "4"]  # fmt: skip
    assert hg.main(tiny) == 0
    assert capsys.readouterr().out.strip().endswith("measured 3 records")
    assert hg.main(tiny) == 0
    assert capsys.readouterr().out.strip().endswith("measured 0 records")  # resumed: nothing measured again
    record = read_run(root, f"{hg.cell_name(('turn', 'delayed', 2, 0.5))}/vineppo_k1.json")
    assert record["per_batch"]["repeats"] == 4 and record["equal_tokens"]["budget_tokens"] == 4 * 3 * 4 * 2
    assert record["sampled_tokens_per_batch"] > 16 * 2  # episodes plus Monte Carlo rollouts
    # the sweep's summary and page (no sweep records here: only the gradient section has content)
    summary = json.loads(json.dumps(hs.summarize({}, gradient_records=hg.load(root))))
    gradient = summary["gradient"]
    assert [r["arm"] for r in gradient["records"]] == ["grpo", "vineppo_k1", "oracle"]
    assert gradient["cells"][0]["best_grpo"] == "grpo" and gradient["records"][0]["vs_best_grpo"] is None
    oracle = gradient["records"][2]
    assert oracle["sampled_tokens_per_batch"] == 32 and math.isfinite(oracle["cosine"])
    page = hs.render_page(summary, figure="f.png")
    assert "## The gradient instrument at H = 2 and H = 16" in page
    assert "| turn | delayed | 2 | 0.5 | oracle | 32 |" in page
