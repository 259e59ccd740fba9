"""Check a training checkpoint's files before resuming from it.

A run killed while it saved (SIGKILL, out of memory, a pre-empted node) or a copy cut short leaves a checkpoint
directory with an empty or truncated file. Loaded as is, such a file fails deep inside ``safetensors``, ``torch.load``
or ``json`` with a message that names neither the file nor what to do, and only after the model was loaded; a
checkpoint missing ``optimizer.pt`` or ``advantage_estimator.pt`` is not an error at all (a fresh optimizer or critic
silently replaces the saved one). :func:`verify_checkpoint` reads every file ``Trainer`` will load and raises
:class:`CheckpointError` naming the first broken one, the checkpoint, and an earlier complete checkpoint to resume
from instead. ``VinePPOTrainer.train(resume_from_checkpoint=...)`` calls it first, before anything is loaded or
written, so a broken checkpoint changes nothing on disk.

What is checked, cheaply (no tensor is materialised):

- ``trainer_state.json`` exists (``Trainer`` writes it last: without it the save was interrupted) and parses;
- every other ``*.json`` parses;
- every ``*.safetensors`` file has a readable header and exactly the size its header announces (truncation);
- every ``*.pt`` / ``*.pth`` / ``*.bin`` file saved by ``torch.save`` (a zip archive) opens and its members' CRCs
  match (truncation, corruption); an empty one is broken whatever its format;
- a sharded model's ``*.index.json`` names shards that exist;
- the model's weights are there (``model.safetensors``, an index, ``pytorch_model.bin``, a PEFT adapter, or a
  DeepSpeed / FSDP state subdirectory, whose files are left to those engines).
"""

from __future__ import annotations

import json
import os
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcadvantage.estimators.base import AdvantageEstimator

__all__ = [
    "ESTIMATOR_STATE_FILE",
    "CheckpointError",
    "complete_checkpoints",
    "load_estimator_state",
    "save_estimator_state",
    "verify_checkpoint",
]

#: File in a checkpoint directory holding the advantage estimator's own state (e.g. the "gae" critic).
ESTIMATOR_STATE_FILE = "advantage_estimator.pt"

TRAINER_STATE = "trainer_state.json"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from. ``path`` is the broken (or missing) file, ``checkpoint`` its
    directory."""

    def __init__(self, message: str, *, path: str, checkpoint: str) -> None:
        super().__init__(message)
        self.path = path
        self.checkpoint = checkpoint


def _file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be loaded (None when it looks whole)."""
    size = path.stat().st_size
    name = path.name
    if size == 0:
        return "it is empty (0 bytes)"
    if name.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except (ValueError, UnicodeDecodeError) as err:
            return f"it is not valid JSON ({err})"
        return None
    if name.endswith(".safetensors"):
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"it is truncated ({size} bytes, shorter than a safetensors header)"
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                return (
                    f"it is truncated or corrupted (header of {header_len} bytes in a file of {size} bytes)"
                )
            try:
                header = json.loads(f.read(header_len))
            except (ValueError, UnicodeDecodeError):
                return "its safetensors header is corrupted"
        ends = [
            int(info["data_offsets"][1])
            for key, info in header.items()
            if key != "__metadata__" and isinstance(info, dict) and "data_offsets" in info
        ]
        expected = 8 + header_len + max(ends, default=0)
        if size != expected:
            return f"it is truncated or corrupted ({size} bytes where its header announces {expected})"
        return None
    if name.endswith((".pt", ".pth", ".bin")):
        with open(path, "rb") as f:
            magic = f.read(2)
        if magic != b"PK":
            return None  # not torch.save's zip format (e.g. a legacy pickle): nothing more to check cheaply
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
            return f"it is truncated or corrupted (not a readable torch.save archive: {err})"
        if bad is not None:
            return f"it is corrupted (member {bad!r} fails its CRC check)"
    return None


def _earlier_complete(checkpoint: Path) -> Path | None:
    """The newest complete checkpoint beside ``checkpoint`` with a lower step (None if there is none)."""
    match = _CHECKPOINT_DIR.match(checkpoint.name)
    if match is None:
        return None
    step = int(match.group(1))
    for candidate in reversed(complete_checkpoints(checkpoint.parent)):
        if int(_CHECKPOINT_DIR.match(candidate.name).group(1)) < step:  # type: ignore[union-attr]
            return candidate
    return None


def complete_checkpoints(output_dir: str | os.PathLike[str]) -> list[Path]:
    """The ``checkpoint-<step>`` directories of ``output_dir`` that pass :func:`verify_checkpoint`, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = sorted(
        (int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _CHECKPOINT_DIR.match(p.name))
    )
    complete = []
    for _, path in found:
        try:
            verify_checkpoint(path, suggest=False)
        except CheckpointError:
            continue
        complete.append(path)
    return complete


def verify_checkpoint(checkpoint: str | os.PathLike[str], *, suggest: bool = True) -> None:
    """Raise :class:`CheckpointError` if a file ``Trainer`` loads on resume is missing, empty, truncated or
    corrupted; the message names the file and, with ``suggest``, an earlier complete checkpoint to resume from.

    Reads every file once (the zip CRCs of ``optimizer.pt`` & co.), but materialises no tensor.
    """
    root = Path(checkpoint)
    if not root.is_dir():
        raise CheckpointError(
            f"Cannot resume from {root}: it is not a directory. Pass resume_from_checkpoint= a checkpoint-<step> "
            "directory saved by the trainer, or True for the newest one in output_dir.",
            path=str(root),
            checkpoint=str(root),
        )

    def fail(path: Path, problem: str) -> None:
        earlier = _earlier_complete(root) if suggest else None
        remedy = (
            f"Resume from the previous complete checkpoint instead: resume_from_checkpoint={str(earlier)!r} "
            "(the steps after it are trained again)"
            if earlier is not None
            else "Resume from an earlier checkpoint, or start the run afresh"
        )
        raise CheckpointError(
            f"Cannot resume from checkpoint {root}: {path} {problem}; the run that wrote it was probably killed "
            f"while saving, or the copy was cut short. Nothing was loaded or overwritten. {remedy}.",
            path=str(path),
            checkpoint=str(root),
        )

    state = root / TRAINER_STATE
    if not state.is_file():
        fail(state, "is missing (the trainer writes it last, so the save did not finish)")
    # DeepSpeed (global_step*/) and FSDP (pytorch_model_fsdp_*/) may keep the weights only in a subdirectory.
    if not any((root / name).is_file() for name in WEIGHT_FILES) and not any(
        p.is_dir() for p in root.iterdir()
    ):
        fail(root / WEIGHT_FILES[0], f"is missing (and so are {', '.join(WEIGHT_FILES[1:])})")
    for path in sorted(root.iterdir()):
        if path.is_file():
            problem = _file_problem(path)
            if problem is not None:
                fail(path, problem)
            if path.name.endswith(".index.json"):
                with open(path, encoding="utf-8") as f:
                    shards = set(json.load(f).get("weight_map", {}).values())
                for shard in sorted(shards):
                    if not (root / shard).is_file():
                        fail(root / shard, f"is missing (listed in {path.name})")
    with open(state, encoding="utf-8") as f:
        if "global_step" not in json.load(f):
            fail(state, "has no global_step (not a trainer state)")


def save_estimator_state(estimator: AdvantageEstimator, checkpoint_dir: str | os.PathLike[str]) -> None:
    """Save ``estimator.state_dict()`` (estimators with state, e.g. the ``"gae"`` critic) to
    ``checkpoint_dir/advantage_estimator.pt``, whole or not at all: a run killed mid-save leaves no truncated file."""
    state = estimator.state_dict()
    if state:
        import torch

        os.makedirs(checkpoint_dir, exist_ok=True)
        file = os.path.join(checkpoint_dir, ESTIMATOR_STATE_FILE)
        torch.save(state, f"{file}.tmp")
        os.replace(f"{file}.tmp", file)


def load_estimator_state(estimator: AdvantageEstimator, checkpoint_dir: str | os.PathLike[str]) -> None:
    """Restore the state :func:`save_estimator_state` wrote into ``checkpoint_dir``. An unreadable file raises
    ``RuntimeError`` naming it; a missing one warns (the estimator's state starts afresh). Estimators without state
    of their own (:attr:`~mcadvantage.estimators.base.AdvantageEstimator.has_state` False) load nothing."""
    if not estimator.has_state:
        return
    file = os.path.join(str(checkpoint_dir), ESTIMATOR_STATE_FILE)
    if not os.path.exists(file):
        warnings.warn(
            f"{checkpoint_dir} has no {ESTIMATOR_STATE_FILE}: the {type(estimator).__name__}'s own state (e.g. a "
            "critic) starts afresh; the checkpoint was saved without it.",
            stacklevel=3,
        )
        return
    import torch

    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise RuntimeError(
            f"Cannot resume the {type(estimator).__name__}'s state: {file} cannot be read "
            f"({type(err).__name__}: {err}); it is probably truncated. Resume from an earlier checkpoint."
        ) from err
    estimator.load_state_dict(state)
