"""Faults around checkpoints: a training process SIGKILLed mid-step and resumed, and broken checkpoint files.

What is lost when a run is SIGKILLed during optimizer step K+1 (after checkpoint-K was saved): only the work of
that unfinished step (its responses are generated and graded again after the resume). The resumed run reaches the
same global step, sees the same prompts in the same order, restores the ``gae`` critic and its optimizer exactly as
saved, and logs the same losses as a run that was never interrupted.

A checkpoint with an empty, truncated or corrupted file is refused before anything is loaded or written, with an
error naming the file and the previous complete checkpoint; nothing in the output directory changes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from _fault_training import losses, make_trainer  # noqa: E402

SCRIPT = Path(__file__).with_name("_fault_training.py")
MAX_STEPS = 4
KILL_AT = 2  # SIGKILL while grading step 3, after checkpoint-2 was saved

pytestmark = pytest.mark.slow


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assert_equal_state(a, b, where="state"):
    """Nested dicts / lists / tensors equal exactly (the critic's weights and its optimizer's moments)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_equal_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    else:
        assert a == b, where


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def killed_run(tiny_model_dir, tmp_path_factory):
    """An uninterrupted reference run (in this process) and a run SIGKILLed in step KILL_AT + 1 (its own process)."""
    root = tmp_path_factory.mktemp("sigkill")
    reference = make_trainer(
        tiny_model_dir, root / "reference", record=root / "reference.jsonl", max_steps=MAX_STEPS
    )
    reference.train()
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(tiny_model_dir), "--out", str(root / "killed"),
         "--record", str(root / "killed.jsonl"), "--max-steps", str(MAX_STEPS), "--kill-at-step", str(KILL_AT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return {
        "root": root,
        "reference": reference,
        "returncode": proc.returncode,
        "stderr": proc.stderr,
        "killed_seconds": time.monotonic() - start,
    }


def test_sigkill_mid_step_then_resume_continues_exactly(killed_run, tiny_model_dir):
    root, reference = killed_run["root"], killed_run["reference"]
    assert killed_run["returncode"] == -signal.SIGKILL, killed_run["stderr"][-2000:]
    killed = root / "killed"
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    checkpoint = killed / f"checkpoint-{KILL_AT}"

    # The critic (value model and its Adam moments) saved before the kill is the reference run's at that step.
    saved = torch.load(checkpoint / "advantage_estimator.pt", weights_only=True)
    assert {"value_model", "optimizer"} <= set(saved)
    _assert_equal_state(
        saved, torch.load(root / "reference" / checkpoint.name / "advantage_estimator.pt", weights_only=True)
    )

    # Resume in a fresh trainer: it loads exactly what was saved.
    resumed = make_trainer(tiny_model_dir, killed, record=root / "resumed.jsonl", max_steps=MAX_STEPS)
    loaded = []
    original = resumed.advantage_estimator.load_state_dict
    resumed.advantage_estimator.load_state_dict = lambda state: (
        loaded.append(copy.deepcopy(state)),
        original(state),
    )[1]
    resumed.train(resume_from_checkpoint=str(checkpoint))
    # (Handed over once when training resumes and once more when the critic is built on the first batch.)
    assert loaded
    for state in loaded:
        _assert_equal_state(state, saved)

    # Same global step, same data order from the resume point on.
    assert resumed.state.global_step == reference.state.global_step == MAX_STEPS
    before = [r for r in _records(root / "reference.jsonl") if r["step"] < KILL_AT]
    after = [r for r in _records(root / "reference.jsonl") if r["step"] >= KILL_AT]
    assert _records(root / "killed.jsonl") == before  # the killed step's grading never finished
    assert _records(root / "resumed.jsonl") == after

    # The loss curve continues: steps 1..K from the checkpoint's history, K+1.. trained again, equal to the
    # uninterrupted run's (and so are the gradient norms and the critic's value loss).
    ref_losses, res_losses = losses(reference), losses(resumed)
    assert sorted(res_losses) == list(range(1, MAX_STEPS + 1))
    for name in ("loss", "grad_norm", "critic/value_loss", "reward"):
        ref = {e["step"]: e[name] for e in reference.state.log_history if name in e}
        res = {e["step"]: e[name] for e in resumed.state.log_history if name in e}
        assert res == pytest.approx(ref, rel=1e-5, abs=1e-7), name
    assert res_losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-7)

    # ... and the critic and its optimizer end where the uninterrupted run's did.
    _assert_equal_state(resumed.advantage_estimator.state_dict(), reference.advantage_estimator.state_dict())


BROKEN_FILES = [
    ("model.safetensors", "truncate"),
    ("optimizer.pt", "truncate"),
    ("advantage_estimator.pt", "truncate"),
    ("trainer_state.json", "truncate"),
    ("rng_state.pth", "empty"),
    ("scheduler.pt", "corrupt"),
    ("trainer_state.json", "missing"),
]


def _break(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "corrupt":  # same size, bytes flipped in the middle (a bad copy)
        middle = len(data) // 2
        path.write_bytes(
            data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 64]) + data[middle + 64 :]
        )
    elif how == "missing":
        path.unlink()


@pytest.fixture(scope="module")
def idle_trainer(killed_run, tiny_model_dir):
    """One trainer reused for every broken checkpoint: ``train`` refuses before it touches anything."""
    return make_trainer(tiny_model_dir, killed_run["root"] / "broken-out", max_steps=MAX_STEPS)


@pytest.mark.parametrize(("name", "how"), BROKEN_FILES, ids=[f"{n}-{h}" for n, h in BROKEN_FILES])
def test_broken_checkpoint_file_is_named_and_nothing_is_overwritten(
    killed_run, idle_trainer, name, how, tmp_path
):
    from mcadvantage.trainer.checkpoints import CheckpointError

    out = tmp_path / "out"
    for step in (1, 2):
        shutil.copytree(killed_run["root"] / "killed" / f"checkpoint-{step}", out / f"checkpoint-{step}")
    broken = out / "checkpoint-3"  # as if the run had been killed while writing its third checkpoint
    shutil.copytree(out / "checkpoint-2", broken)
    _break(broken / name, how)
    idle_trainer.args.output_dir = str(out)
    before = _snapshot(out)
    weights = {k: v.clone() for k, v in idle_trainer.model.state_dict().items()}

    for resume in (str(broken), True):  # an explicit path, and "the newest checkpoint in output_dir"
        start = time.monotonic()
        with pytest.raises(CheckpointError) as info:
            idle_trainer.train(resume_from_checkpoint=resume)
        seconds = time.monotonic() - start
        message = str(info.value)
        assert str(broken / name) in message and info.value.path == str(broken / name), message
        assert str(out / "checkpoint-2") in message  # what to resume from instead
        assert "Nothing was loaded or overwritten" in message
        assert seconds < 5, seconds
    assert _snapshot(out) == before  # nothing written, nothing rotated away
    assert idle_trainer.state.global_step == 0
    for key, value in idle_trainer.model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def test_complete_checkpoints_pass_and_are_listed(killed_run):
    from mcadvantage.trainer.checkpoints import complete_checkpoints, verify_checkpoint

    for checkpoint in (killed_run["root"] / "killed").glob("checkpoint-*"):
        verify_checkpoint(checkpoint)
    assert [p.name for p in complete_checkpoints(killed_run["root"] / "reference")] == [
        f"checkpoint-{s}" for s in range(1, MAX_STEPS + 1)
    ]
