"""Learning efficiency: GRPO, RLOO, VinePPO and more supervised steps, side by side from one warm-up per seed.

    python benchmarks/learning_efficiency.py                       # task "demo", seeds 0 1 2, every arm
    python benchmarks/learning_efficiency.py --task long --arms grpo vineppo_k4 sft
    python benchmarks/learning_efficiency.py --report              # aggregate what is there, run nothing

Protocol (docs/learning-efficiency.md, written before the runs): for each task and seed, one
warm-up policy is trained with the demo's recipe (``mcadvantage.demo.arms.train_warmup_policy``) and saved;
every arm starts from it, with the same RL prompts, the same trainer seed (so the same prompt order), the
same batch layout, learning rate and temperature; only the advantage estimator differs
(``mcadvantage.demo.arms``; the RL-free arms in ``benchmarks/rl_free_arms.py``). Arms:

- ``grpo``, ``rloo``, ``vineppo_k4``, ``vineppo_k9``: ``VinePPOTrainer`` with that estimator;
- ``grpo_matched``: GRPO with as many prompts per step as make its sampled tokens per step match
  ``vineppo_k4``'s in the same seed (VinePPO's sampling budget spent on more prompts instead);
- ``sft``: more supervised steps on the warm-up's own demonstrations (what a user could do instead).

Held-out greedy accuracy on the task's held-out problems (disjoint from every training prompt) is measured
every ``--eval_every`` steps. Each (task, seed, arm) runs in its own process and appends its records to
``<root>/<task>/seed<N>/<arm>.jsonl`` as they come; a finished arm moves them into the run directory's archive
(``benchmarks/_runs.py``: records ``<task>/seed<N>/<arm>.jsonl`` and ``<arm>.done.json``, with the seed's
``warmup.json`` and the task's ``start.json``) and is never rerun, so an interrupted benchmark resumes where it
stopped (an unfinished arm restarts from its warm-up).

Writes ``benchmarks/results/learning_efficiency.json`` (``records``: ``{task, arm, seed, step, accuracy,
sampled_tokens, train_seconds}``, ``summary`` per task and arm: mean and standard error across seeds, ratios
to GRPO), ``benchmarks/results/learning_efficiency_<task>.png`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))

from benchmarks._runs import append_runs, has_run, load_runs, read_loose, read_run  # noqa: E402
from testbed.tasks import TASK_PRESETS, StudyConfig  # noqa: E402  (after the root is on sys.path)

BENCHMARKS = ROOT / "benchmarks"
RESULTS = ROOT / "benchmarks" / "results"

# Task presets: StudyConfig settings, fixed before the runs (see the protocol documents). The studies' tasks are
# defined once, in testbed.tasks.TASK_PRESETS (python -m testbed.make_warmup --task reads them too).
TASKS: dict[str, dict[str, Any]] = {
    **{name: dict(preset) for name, preset in TASK_PRESETS.items()},
    # Smoke runs and tests only: the demo's --quick sizes (numbers meaningless).
    "quick": {"quick": True},
}
# The regime study's tasks (docs/regime-protocol.md): every seed starts from the shipped plateau warm-up, trained on
# seed 0's demonstrations, so the problem sets are seed 0's for every seed (a seed-1 held-out set could hold seed 0's
# warm-up prompts) and the seed sets only the RL run's own randomness: prompt order and sampling.
TASKS["demo_plateau"] = {"warmup_schedule": "plateau"}
# `slip` from its own plateau warm-up (same rule, seed 0, --flaw slip), which is not shipped in the package.
TASKS["slip_plateau"] = {**TASKS["slip"], "warmup_schedule": "plateau"}
# `long` from its own plateau warm-up (same rule, seed 0, --task long), not shipped either.
TASKS["long_plateau"] = {**TASKS["long"], "warmup_schedule": "plateau"}
# `sign` (H2 with a systematic mid-solution flaw amid harmless lead-ins) from its own plateau warm-up, not shipped.
TASKS["sign_plateau"] = {**TASKS["sign"], "warmup_schedule": "plateau"}
# The paper's supervised start (docs/paper-claims-protocol.md, stage 4): the demo task's plateau rule without the
# final decay, so RL starts from the best validation checkpoint as the paper's SFT selection does (appendix C.3).
TASKS["demo_sft"] = {"warmup_schedule": "plateau", "warmup_decay_steps": 0}
SHARED_START_TASKS = {"demo_plateau", "slip_plateau", "long_plateau", "sign_plateau", "demo_sft"}
#: shared-start tasks whose starting policy is not shipped: its directory (the checkpoint is git-ignored, its
#: warmup.json and plateau_log.json are kept) and the command that trains it
UNSHIPPED_STARTS: dict[str, tuple[Path, str]] = {
    "slip_plateau": (
        RESULTS / "regime" / "warmup_slip_plateau",
        "python -m testbed.make_warmup --warmup_schedule plateau --flaw slip "
        "--output_dir benchmarks/results/regime/warmup_slip_plateau",
    ),
    "long_plateau": (
        RESULTS / "regime" / "warmup_long_plateau",
        "python -m testbed.make_warmup --warmup_schedule plateau --task long "
        "--output_dir benchmarks/results/regime/warmup_long_plateau",
    ),
    "sign_plateau": (
        RESULTS / "regime" / "warmup_sign_plateau",
        "python -m testbed.make_warmup --warmup_schedule plateau --task sign "
        "--output_dir benchmarks/results/regime/warmup_sign_plateau",
    ),
    "demo_sft": (
        RESULTS / "regime" / "warmup_demo_sft",
        "python -m testbed.make_warmup --seed 0 --output_dir benchmarks/results/regime/warmup_demo_sft "
        "--warmup_schedule plateau --warmup_patience 8 --warmup_decay_steps 0 --threads 1",
    ),
}
DEFAULT_ARMS = [
    "grpo",
    "rloo",
    "vineppo_k4",
    "vineppo_k9",
    "grpo_matched",
    "grpo_matched_cost",
    "hybrid_b50",
    "sft",
    "restem",
    "ppo",
    "dpo_plus",
]
# RestEM: 4 iterations of 40 new prompts x num_generations samples (the RL arms' 160 prompts in all), 8 epochs
# on the correct ones per iteration (the paper's), from the starting policy each time.
RESTEM_ITERATIONS = 4
RESTEM_EPOCHS = 8
# DPO+ (the paper's Table 3): 3 epochs, beta 0.3 on GSM8K, 64 pairs per prompt (8 samples give at most 16); the
# RL arms' learning rate; the same 160 prompts as the RL arms, sampled once from the warm-up.
DPO_EPOCHS = 3
DPO_BETA = 0.3
DPO_PAIRS_PER_PROMPT = 64
SFT_STEPS = 400  # about GRPO's training wall time per seed on the demo task, measured on 2 cores
SFT_LR = 3e-4  # where the warm-up's schedule ends (warmup_lr decayed to a tenth)


def task_config(task: str, seed: int) -> StudyConfig:
    if task not in TASKS:
        raise SystemExit(f"--task must be one of {sorted(TASKS)}, got {task!r}.")
    config = replace(StudyConfig(), seed=seed, **TASKS[task])
    if config.quick:
        config.apply_quick()
    return config


def task_data(task: str, seed: int) -> Any:
    """The problem sets of ``(task, seed)``: seed 0's for a shared-start task, the seed's own otherwise."""
    from testbed.tasks import build_data

    return build_data(task_config(task, 0 if task in SHARED_START_TASKS else seed))


# ---- one arm, in its own process ------------------------------------------------------------------------------


def _evaluator(config: Any, eval_set: list, tokenizer: Any):
    from mcadvantage import GSM8KVerifier
    from mcadvantage.demo.evaluation import evaluate_accuracy

    verifier = GSM8KVerifier()

    def evaluate(model: Any) -> float:
        acc, _, _ = evaluate_accuracy(
            model, tokenizer, eval_set, verifier.score, max_new_tokens=config.max_completion_length
        )
        return acc

    return evaluate


TEMPERATURE_SUFFIX = re.compile(r"^(?P<arm>.+)_t(?P<t>[0-9]+(?:\.[0-9]+)?)$")


def split_temperature(arm_name: str) -> tuple[str, float | None]:
    """``"ppo_t1.0"`` -> ``("ppo", 1.0)``: an arm trained and sampled at another temperature than the task's (the
    paper-claims protocol's temperature arms); ``("ppo", None)`` for a plain arm name."""
    match = TEMPERATURE_SUFFIX.match(arm_name)
    if match is None:
        return arm_name, None
    temperature = float(match["t"])
    if not temperature > 0:
        raise SystemExit(f"arm {arm_name!r}: the temperature after '_t' must be > 0, got {temperature}.")
    return match["arm"], temperature


def kl_to_start(
    model: Any,
    start: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    temperature: float,
    max_new_tokens: int,
    seed: int,
) -> float:
    """Monte Carlo estimate of the sequence-level KL(pi || pi_start) of the sampling distributions (logits divided by
    ``temperature``, as in training): one response per prompt sampled from ``model``, the mean over prompts of the
    summed ``log pi - log pi_start`` of its tokens (an unbiased estimate). The sampling runs under a forked RNG
    seeded with ``seed``, so measuring leaves the training run's random stream untouched and the same model gives the
    same estimate."""
    import torch

    was_training = model.training
    model.eval()
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(
                **enc,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            prompt_len = enc["input_ids"].shape[1]
            completion = out[:, prompt_len:]
            # A response's tokens: up to and including its first EOS (generate pads after it).
            is_eos = completion == tokenizer.eos_token_id
            after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
            completion_mask = ~after_eos
            attention = torch.cat([enc["attention_mask"], completion_mask.long()], dim=1)
            positions = (attention.cumsum(dim=1) - 1).clamp(min=0)

            def token_logprobs(m: Any) -> torch.Tensor:
                logits = m(input_ids=out, attention_mask=attention, position_ids=positions).logits
                logits = logits[:, prompt_len - 1 : -1].float() / temperature
                return torch.log_softmax(logits, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)

            diff = (token_logprobs(model) - token_logprobs(start)) * completion_mask
            return float(diff.sum(dim=1).mean())
    finally:
        tokenizer.padding_side = old_side
        model.train(was_training)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2), encoding="utf-8")
    os.replace(tmp, path)  # atomic: an interrupted write never leaves half a file


def run_key(task: str, seed: int, name: str) -> str:
    """The name of a seed's record (``warmup.json``, ``<arm>.jsonl``, ``<arm>.done.json``) in the run directory's
    archive (``benchmarks/_runs.py``)."""
    return f"{task}/seed{seed}/{name}"


def _seed_name(seed_dir: Path, name: str) -> str:
    """The archive's name of the record ``name`` of ``seed_dir`` (``<root>/<task>/seed<N>``; ``../start.json`` is
    the task's)."""
    prefix = f"{seed_dir.parent.name}/{seed_dir.name}"
    return f"{seed_dir.parent.name}/{name[3:]}" if name.startswith("../") else f"{prefix}/{name}"


def read_seed_record(seed_dir: Path, name: str) -> Any:
    """The record ``name`` of ``seed_dir`` (see :func:`_seed_name`) in its run directory's archive, or None."""
    return read_run(seed_dir.parents[1], _seed_name(seed_dir, name), None)


def write_seed_records(seed_dir: Path, records: dict[str, Any]) -> None:
    """Append ``{name: record}`` of ``seed_dir`` to its run directory's archive, in one write."""
    append_runs(seed_dir.parents[1], [(_seed_name(seed_dir, k), v) for k, v in records.items()])


def _machine_info() -> dict:
    """``benchmarks/_machine.py``'s :func:`machine_info` (beside this file, which tests load by path)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    from _machine import machine_info

    return machine_info()


def ensure_warmup(task: str, seed: int, seed_dir: Path) -> dict:
    """Train (or reuse) the seed's warm-up policy; returns its metadata."""
    meta = read_seed_record(seed_dir, "warmup.json")
    if task in SHARED_START_TASKS:
        # A clone has the seed's warmup.json (committed) without the copied weights (git-ignored): copy them again, so
        # a new arm resumes on the recorded seeds.
        if meta is not None and (seed_dir / "warmup_policy" / "model.safetensors").exists():
            return meta
        return _shared_start(task, seed, seed_dir)
    if meta is not None:
        return meta
    from mcadvantage.demo.arms import train_warmup_policy
    from mcadvantage.testing import build_char_tokenizer
    from testbed.tasks import build_data

    config = task_config(task, seed)
    data = build_data(config)
    tokenizer = build_char_tokenizer()
    curve_eval = _evaluator(config, data.eval_set[: config.curve_problems], tokenizer)
    t0 = time.perf_counter()
    model, tokenizer, curve = train_warmup_policy(
        config, data, seed_dir / "warmup_policy", evaluate=curve_eval
    )
    seconds = time.perf_counter() - t0
    accuracy = _evaluator(config, data.eval_set, tokenizer)(model)
    meta = {
        "task": task,
        "seed": seed,
        "accuracy": accuracy,
        "curve_on_first_problems": curve,
        "curve_problems": config.curve_problems,
        "seconds": seconds,
        "config": asdict(config),
        "environment": _machine_info(),
    }
    write_seed_records(seed_dir, {"warmup.json": meta})
    return meta


def shared_start_dir(task: str) -> Path:
    """The starting policy of shared-start ``task``: the shipped checkpoint of its warm-up schedule, or, for a task in
    ``UNSHIPPED_STARTS``, the directory its command trains (refused, with the command, until it is complete)."""
    if task in UNSHIPPED_STARTS:
        path, command = UNSHIPPED_STARTS[task]
        from mcadvantage.demo.arms import RESUME_FILE

        # make_warmup writes warmup.json last and then removes its resume state, when the checkpoint is complete; a
        # fresh clone has warmup.json (the committed evidence) without the weights (git-ignored), so both must be
        # there and no warm-up may be under way (a regeneration saves the weights before its plateau check).
        meta_path = path / "warmup.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
        if meta is None or not (path / "model.safetensors").exists() or (path / RESUME_FILE).exists():
            # The command that made the kept evidence, thread count included, retrains the same policy on one
            # machine; on another the weights differ within run-to-run noise (make_warmup's docstring). Recorded
            # before the testbed left the package, it names the old module: today's spelling runs the same flags.
            from testbed.make_warmup import current_command

            recorded = (meta or {}).get("command")
            raise SystemExit(
                f"--task {task} starts from the warm-up in {path}: run `{current_command(recorded or command)}` "
                "first and let it "
                "finish (the weights are not kept in git; the command retrains them, identically on the machine "
                "that made them, within run-to-run noise elsewhere)."
            )
        check = meta.get("sft_check", {})
        if check.get("plateaued") is False:  # the protocol's plateau evidence: no run from this start counts
            raise SystemExit(
                f"--task {task}: the warm-up in {path} failed the plateau check (held-out "
                f"{check['held_out_before']:.3f} -> {check['held_out_after']:.3f} after {check['steps']} more "
                f"supervised steps, more than 1 SE = {check['one_se']:.3f}), so docs/regime-protocol.md counts no run "
                "from it."
            )
        return path
    from mcadvantage.demo.config import shipped_warmup_dir

    return shipped_warmup_dir(task_config(task, 0).warmup_schedule)


def _shared_start(task: str, seed: int, seed_dir: Path) -> dict:
    """A shared-start task's starting policy: the shipped checkpoint, copied into the seed's directory; its held-out
    accuracy (greedy, so the same for every seed) is measured once per task and kept in ``<task>/start.json``."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = shared_start_dir(task)
    shutil.copytree(source, seed_dir / "warmup_policy", dirs_exist_ok=True)
    start = read_seed_record(seed_dir, "../start.json")
    if start is None:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source).eval()
        accuracy = _evaluator(task_config(task, 0), task_data(task, 0).eval_set, tokenizer)(model)
        # Recorded relative to src/ for a start the package ships (as every committed start.json of one says), to
        # the repository's root otherwise (the testbed's and the regime study's).
        policy = (
            source.relative_to(ROOT / "src")
            if source.is_relative_to(ROOT / "src")
            else source.relative_to(ROOT)
        )
        start = {"task": task, "policy": str(policy), "accuracy": accuracy}
        write_seed_records(seed_dir, {"../start.json": start})
    meta = {"task": task, "seed": seed, "accuracy": start["accuracy"], "shared_start": start["policy"]}
    write_seed_records(seed_dir, {"warmup.json": meta})
    return meta


MATCHED_TO = "vineppo_k4"  # the arm whose sampling budget grpo_matched gets
KL_SEED = 20_241_002  # the KL measurement's own random stream (kl_to_start)


def measured_cost_ratio() -> float:
    """``r``, a trained token's cost in generated tokens, as ``benchmarks/gradient_quality.py`` measured it on this
    machine for the demo policy (``benchmarks/results/gradient_quality.json``)."""
    path = RESULTS / "gradient_quality.json"
    if not path.exists():
        raise SystemExit(
            f"grpo_matched_cost needs the measured cost ratio r in {path}: run "
            "`python benchmarks/gradient_quality.py --tasks demo` first."
        )
    return float(json.loads(path.read_text())["cost_ratio"]["cost_ratio"])


def _tokens_per_step(info: dict) -> tuple[float, float]:
    """(sampled, trained) tokens per step of a finished RL arm: every policy response trains, Monte Carlo rollouts
    do not."""
    from mcadvantage.demo.arms import rollout_tokens

    sampled = info["sampled_tokens"]
    rollouts = sum(rollout_tokens(step) for step in info.get("logs", []))
    return sampled / info["steps"], (sampled - rollouts) / info["steps"]


def recount_sampled_tokens(info: dict, records: list[dict]) -> None:
    """Recompute an RL arm's cumulative sampled tokens from its per-step logs, in place (``info`` and its curve's
    ``records``): responses (a tree's generated tokens) plus every estimator's rollouts
    (:func:`mcadvantage.demo.arms.rollout_tokens`). Runs recorded before 2026-11-25 counted only ``mc/`` rollouts,
    which left out the hybrid's (``hybrid/generated_tokens``); the logs hold everything needed."""
    from mcadvantage.demo.arms import step_sampled_tokens

    logs = info.get("logs")
    if not logs:
        return
    batch = info["prompts_per_step"] * task_config(info["task"], int(info["seed"])).num_generations
    total, by_step = 0.0, {0: 0.0}
    for step in sorted(logs, key=lambda row: row["step"]):
        total += step_sampled_tokens(step, batch)
        if (
            step["step"] > 0
        ):  # a critic warm-up's steps (<= 0) add to the first policy step's count, not the start's
            by_step[int(step["step"])] = total
    info["sampled_tokens"] = total
    for record in records:
        record["sampled_tokens"] = by_step.get(int(record["step"]), record["sampled_tokens"])


def _matched_prompts(
    seed_dir: Path, config: Any, matched_to: str = MATCHED_TO, cost_ratio: float | None = None
) -> int:
    """Prompts per step that give GRPO ``matched_to``'s cost per step (from the finished runs): its sampled tokens,
    or with ``cost_ratio`` r its ``sampled + r x trained`` tokens (the cost model of the gradient instrument)."""
    from mcadvantage.evaluation.cost_model import cost_model_tokens

    cost = {}
    for arm in ("grpo", matched_to):
        done = read_seed_record(seed_dir, f"{arm}.done.json")
        if done is None:
            raise SystemExit(
                f"grpo_matched needs the finished arms grpo and {matched_to} first "
                f"({_seed_name(seed_dir, arm)} is not in {seed_dir.parents[1]}'s records)."
            )
        sampled, trained = _tokens_per_step(done)
        cost[arm] = cost_model_tokens(sampled, trained, cost_ratio or 0.0)
    return max(1, round(config.prompts_per_step * cost[matched_to] / cost["grpo"]))


def resolve_arm(arm_name: str, seed_dir: Path, config: Any) -> tuple[str, dict[str, Any]]:
    """The arm's name in :func:`testbed.arms.parse_arm`'s grammar, and what was measured to choose it:
    ``grpo_matched`` gets the Monte Carlo arm's sampled tokens per step as more prompts, ``grpo_matched_cost`` its
    cost per step under the cost model with the measured ``r``."""
    matched_to = os.environ.get("LE_MATCHED_TO", MATCHED_TO)
    if arm_name == "grpo_matched":
        return f"grpo_p{_matched_prompts(seed_dir, config, matched_to)}", {"matched_to": matched_to}
    if arm_name == "grpo_matched_cost":
        r = measured_cost_ratio()
        prompts = _matched_prompts(seed_dir, config, matched_to, cost_ratio=r)
        return f"grpo_p{prompts}", {"matched_to": matched_to, "cost_ratio": r}
    return arm_name, {}


def run_arm_process(
    task: str,
    seed: int,
    arm_name: str,
    root: Path,
    eval_every: int,
    sft_steps: int,
    threads: int = 2,
    kl_prompts: int = 0,
    rl_steps: int | None = None,
) -> None:
    """Run one arm (``--worker``): records appended to ``<arm>.jsonl`` as they come, moved into the run directory's
    archive with ``<arm>.done.json`` at the end.

    ``kl_prompts`` > 0 adds ``kl_to_start`` to every record (:func:`kl_to_start` on the first ``kl_prompts``
    held-out prompts); ``rl_steps`` overrides the task's number of RL steps; an arm name ending in ``_t<T>`` trains
    and samples at temperature ``T``."""
    import torch

    from mcadvantage.demo.arms import ArmRecord
    from mcadvantage.demo.run import _quiet_libraries
    from testbed.arms import parse_arm

    _quiet_libraries()
    torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))
    seed_dir = root / task / f"seed{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    warm = ensure_warmup(task, seed, seed_dir)
    if arm_name == "warmup":
        return
    config = task_config(task, seed)
    base_arm, temperature = split_temperature(arm_name)
    if temperature is not None:
        config = replace(config, temperature=temperature)
    if rl_steps is not None:
        config = replace(config, rl_steps=rl_steps)
    data = task_data(task, seed)
    policy_dir = seed_dir / "warmup_policy"
    resolved, matching = resolve_arm(base_arm, seed_dir, config)
    spec = parse_arm(resolved)
    extras: dict[str, float] = {}  # what the last evaluation measured besides accuracy, for its record
    evaluate = _arm_evaluator(config, data, policy_dir, kl_prompts, extras)
    log_path = seed_dir / f"{arm_name}.jsonl"
    log_path.unlink(missing_ok=True)  # an unfinished earlier attempt restarts from the warm-up

    def on_record(record: ArmRecord) -> None:
        row = asdict(record) | {"arm": arm_name, "task": task} | extras
        extras.clear()
        with log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"[{task} seed {seed} {arm_name}] step {record.step}: accuracy {record.accuracy:.3f}", flush=True
        )

    if kl_prompts > 0:
        extras["kl_to_start"] = 0.0  # the starting policy itself
    on_record(ArmRecord(arm_name, seed, 0, warm["accuracy"], 0.0, 0.0))
    t0 = time.perf_counter()
    trainer_dir = seed_dir / f"{arm_name}_trainer"
    records, steps, extra = _train_arm(
        spec, config, policy_dir, data, trainer_dir, evaluate, on_record, eval_every, sft_steps
    )
    done = {
        "task": task,
        "seed": seed,
        "arm": arm_name,
        "resolved_arm": resolved,
        "prompts_per_step": spec.prompts_per_step or config.prompts_per_step,
        "steps": steps,
        "sampled_tokens": records[-1].sampled_tokens,
        "train_seconds": records[-1].train_seconds,
        "process_seconds": time.perf_counter() - t0,
        "temperature": config.temperature,
        "torch_threads": torch.get_num_threads(),
        "environment": _machine_info(),
        **matching,
        **extra,
    }
    write_seed_records(seed_dir, {f"{arm_name}.jsonl": read_loose(log_path), f"{arm_name}.done.json": done})
    log_path.unlink()  # the archive holds it now


def _arm_evaluator(
    config: Any, data: Any, policy_dir: Path, kl_prompts: int, extras: dict[str, float]
) -> Callable[[Any], float]:
    """An arm's evaluation: held-out greedy accuracy, and with ``kl_prompts`` > 0 the KL to the start on the first
    ``kl_prompts`` held-out prompts, kept in ``extras`` for the record."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    accuracy_of = _evaluator(config, data.eval_set, tokenizer)
    if kl_prompts > 0:
        start_model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
        kl_set = [p.prompt for p in data.eval_set[:kl_prompts]]

    def evaluate(model: Any) -> float:
        if kl_prompts > 0:
            extras["kl_to_start"] = kl_to_start(
                model,
                start_model,
                tokenizer,
                kl_set,
                temperature=config.temperature,
                max_new_tokens=config.max_completion_length,
                seed=KL_SEED,
            )
        return accuracy_of(model)

    return evaluate


def _train_arm(
    spec: Any,
    config: Any,
    policy_dir: Path,
    data: Any,
    trainer_dir: Path,
    evaluate: Callable[[Any], float],
    on_record: Callable[[Any], None],
    eval_every: int,
    sft_steps: int,
) -> tuple[list[Any], int, dict[str, Any]]:
    """Train the arm ``spec`` from the warm-up (RL, or one of the RL-free arms); its evaluation records, its steps,
    and what its done record adds (the RL arms' logs and mean reward)."""
    from mcadvantage.demo.arms import run_rl_arm
    from testbed.arms import RLFreeArm

    if str(BENCHMARKS) not in sys.path:  # the RL-free arms are benchmark code, beside this file
        sys.path.insert(0, str(BENCHMARKS))
    from rl_free_arms import run_dpo_plus_arm, run_restem_arm, run_sft_arm

    extra: dict[str, Any] = {}
    rl_free = spec.name if isinstance(spec, RLFreeArm) else None
    if rl_free == "restem":
        prompts = config.rl_steps * config.prompts_per_step // RESTEM_ITERATIONS
        _, records = run_restem_arm(
            config,
            policy_dir,
            data,
            iterations=RESTEM_ITERATIONS,
            prompts_per_iteration=prompts,
            epochs=RESTEM_EPOCHS,
            learning_rate=SFT_LR,
            evaluate=evaluate,
            on_record=on_record,
        )
        steps = config.rl_steps
    elif rl_free == "dpo_plus":
        _, records = run_dpo_plus_arm(
            config,
            policy_dir,
            data,
            trainer_dir,
            prompts=config.rl_steps * config.prompts_per_step,
            pairs_per_prompt=DPO_PAIRS_PER_PROMPT,
            epochs=DPO_EPOCHS,
            learning_rate=config.rl_lr,
            beta=DPO_BETA,
            evaluate=evaluate,
            on_record=on_record,
        )
        steps = config.rl_steps
    elif rl_free == "sft":
        _, records = run_sft_arm(
            config,
            policy_dir,
            data,
            steps=sft_steps,
            learning_rate=SFT_LR,
            evaluate=evaluate,
            # as many evaluations as an RL arm gets
            eval_every=max(1, sft_steps * eval_every // config.rl_steps),
            on_record=on_record,
        )
        steps = sft_steps
    else:
        _, records, logs = run_rl_arm(
            config,
            spec,
            policy_dir,
            data,
            trainer_dir,
            evaluate=evaluate,
            eval_every=eval_every,
            on_record=on_record,
        )
        steps = config.rl_steps
        if spec.critic_warmup_steps:  # trained on top of the policy's steps (run_rl_arm)
            extra["critic_warmup_steps"] = spec.critic_warmup_steps
        extra["mean_reward"] = statistics.mean(r.get("reward", 0.0) for r in logs if r["step"] > 0)
        extra["logs"] = logs
    return records, steps, extra


# ---- aggregation ----------------------------------------------------------------------------------------------


def _mean_se(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return float("nan"), float("nan")
    mean = statistics.mean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return mean, se


def first_reaching(curve: list[dict], target: float) -> dict | None:
    """The first record (by step) of ``curve`` whose accuracy reaches ``target`` (None: never)."""
    for r in sorted(curve, key=lambda r: r["step"]):
        if r["accuracy"] >= target - 1e-12:
            return r
    return None


def steps_to_reach(curve: list[dict], target: float) -> int | None:
    """First evaluated step at which ``curve`` reaches ``target`` (None: never)."""
    hit = first_reaching(curve, target)
    return None if hit is None else int(hit["step"])


def summarize(records: list[dict], done: dict[tuple[str, int, str], dict]) -> dict:
    """Per task and arm: mean and standard error across seeds of the final accuracy, the paired difference
    to GRPO, sampled tokens, train seconds and their ratio to GRPO, and steps to reach GRPO's best accuracy
    (per seed: GRPO's best held-out accuracy over its curve, step 0 excluded)."""
    out: dict[str, dict] = {}
    by_run: dict[tuple[str, int, str], list[dict]] = {}
    for r in records:
        by_run.setdefault((r["task"], r["seed"], r["arm"]), []).append(r)
    tasks = sorted({k[0] for k in done})
    for task in tasks:
        arms = sorted({k[2] for k in done if k[0] == task}, key=lambda a: (DEFAULT_ARMS + [a]).index(a))
        table: dict[str, dict] = {}
        for arm in arms:
            seeds = sorted(s for (t, s, a) in done if t == task and a == arm)
            finals: list[float] = []
            diffs: list[float] = []  # final accuracy minus GRPO's, same seed
            tokens: list[float] = []
            seconds: list[float] = []
            tok_ratio: list[float] = []
            sec_ratio: list[float] = []
            reach: list[float] = []  # steps to GRPO's best, seeds that reach it
            reach_seconds: list[float] = []
            reached = 0
            for seed in seeds:
                curve = sorted(by_run[(task, seed, arm)], key=lambda r: r["step"])
                finals.append(curve[-1]["accuracy"])
                tokens.append(curve[-1]["sampled_tokens"])
                seconds.append(curve[-1]["train_seconds"])
                grpo = by_run.get((task, seed, "grpo")) if (task, seed, "grpo") in done else None
                if grpo:
                    grpo = sorted(grpo, key=lambda r: r["step"])
                    diffs.append(curve[-1]["accuracy"] - grpo[-1]["accuracy"])
                    if grpo[-1]["sampled_tokens"] > 0:
                        tok_ratio.append(curve[-1]["sampled_tokens"] / grpo[-1]["sampled_tokens"])
                    sec_ratio.append(curve[-1]["train_seconds"] / grpo[-1]["train_seconds"])
                    best = max(r["accuracy"] for r in grpo if r["step"] > 0)
                    hit = first_reaching([r for r in curve if r["step"] > 0], best)
                    if hit is not None:
                        reached += 1
                        reach.append(hit["step"])
                        reach_seconds.append(hit["train_seconds"])
            table[arm] = {
                "seeds": seeds,
                "prompts_per_step": [done[(task, s, arm)].get("prompts_per_step") for s in seeds],
                "final_accuracy": _mean_se(finals),
                "start_accuracy": _mean_se([by_run[(task, s, arm)][0]["accuracy"] for s in seeds]),
                "final_minus_grpo": _mean_se(diffs),
                "sampled_tokens": _mean_se(tokens),
                "train_seconds": _mean_se(seconds),
                "tokens_ratio_to_grpo": _mean_se(tok_ratio),
                "seconds_ratio_to_grpo": _mean_se(sec_ratio),
                "steps_to_grpo_best": _mean_se([float(s) for s in reach]),
                "seconds_to_grpo_best": _mean_se(reach_seconds),
                "seeds_reaching_grpo_best": reached,
            }
        out[task] = table
    return out


def finished_runs(root: Path) -> tuple[list[dict], dict[tuple[str, int, str], dict]]:
    """Every finished arm's evaluation records under ``root`` and its ``done`` record by (task, seed, arm)."""
    records: list[dict] = []
    done: dict[tuple[str, int, str], dict] = {}
    for name, info in load_runs(root, "*/seed*/*.done.json").items():
        key = (info["task"], int(info["seed"]), info["arm"])
        done[key] = info
        curve = read_run(root, name.removesuffix(".done.json") + ".jsonl")
        recount_sampled_tokens(info, curve)
        records += curve
    return records, done


def print_table(summary: dict) -> None:
    def fmt(ms: tuple[float, float], spec: str = ".3f") -> str:
        m, s = ms
        if math.isnan(m):
            return "-"
        return f"{m:{spec}}" + ("" if math.isnan(s) else f" ± {s:{spec}}")

    for task, table in summary.items():
        print(f"\ntask {task}")
        head = (
            f"{'arm':<14} {'n':>2} {'final acc':>15} {'minus GRPO':>16} {'steps to GRPO best':>19} {'s to GRPO best':>15} "
            f"{'tokens x GRPO':>14} {'seconds x GRPO':>15}"
        )
        print(head)
        print("-" * len(head))
        for arm, row in table.items():
            reach = (
                fmt(row["steps_to_grpo_best"], ".0f")
                + f" ({row['seeds_reaching_grpo_best']}/{len(row['seeds'])})"
            )
            print(
                f"{arm:<14} {len(row['seeds']):>2} {fmt(row['final_accuracy']):>15} {fmt(row['final_minus_grpo'], '+.3f'):>16} "
                f"{reach:>19} {fmt(row['seconds_to_grpo_best'], '.0f'):>15} {fmt(row['tokens_ratio_to_grpo'], '.2f'):>14} {fmt(row['seconds_ratio_to_grpo'], '.2f'):>15}"
            )


def markdown_tables(records: list[dict], summary: dict) -> str:
    """The results as Markdown: per task, the summary table (mean ± standard error over seeds) and every
    run's held-out curve, so the documentation shows every configuration that ran."""

    def fmt(ms: Any, spec: str = ".3f") -> str:
        m, e = ms
        if math.isnan(m):
            return "-"
        return f"{m:{spec}}" + ("" if math.isnan(e) else f" ± {e:{spec}}")

    out: list[str] = []
    for task, table in summary.items():
        out += [
            f"### Task `{task}`",
            "",
            "| arm | seeds | final accuracy | minus GRPO (paired) | steps to GRPO's best | seconds to GRPO's best "
            "| sampled tokens x GRPO | training seconds x GRPO |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for arm, row in table.items():
            n = len(row["seeds"])
            out.append(
                f"| `{arm}` | {n} | {fmt(row['final_accuracy'])} | {fmt(row['final_minus_grpo'], '+.3f')} "
                f"| {fmt(row['steps_to_grpo_best'], '.0f')} ({row['seeds_reaching_grpo_best']}/{n}) "
                f"| {fmt(row['seconds_to_grpo_best'], '.0f')} | {fmt(row['tokens_ratio_to_grpo'], '.2f')} "
                f"| {fmt(row['seconds_ratio_to_grpo'], '.2f')} |"
            )
        out += [
            "",
            "Every run (held-out accuracy at each evaluated step; `sft` steps are supervised steps):",
            "",
        ]
        out += [
            "| arm | seed | curve (step: accuracy) | sampled tokens | training s |",
            "|---|---:|---|---:|---:|",
        ]
        for arm, row in table.items():
            for seed in row["seeds"]:
                curve = sorted(
                    (r for r in records if r["task"] == task and r["arm"] == arm and r["seed"] == seed),
                    key=lambda r: r["step"],
                )
                points = " / ".join(f"{r['step']}: {r['accuracy']:.3f}" for r in curve)
                out.append(
                    f"| `{arm}` | {seed} | {points} | {curve[-1]['sampled_tokens']:,.0f} "
                    f"| {curve[-1]['train_seconds']:.0f} |"
                )
        out.append("")
    return "\n".join(out)


DOC_MARKER = "learning_efficiency"  # <!-- learning_efficiency results: start --> ... end -->


def update_doc(doc: Path, markdown: str, marker: str = DOC_MARKER) -> bool:
    """Replace the text between the ``marker`` results markers of ``doc`` with ``markdown`` (False: no markers)."""
    from mcadvantage.evaluation.report import replace_between_markers

    return replace_between_markers(doc, marker, markdown)


def plot(records: list[dict], summary: dict, path_for: Any) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for task, table in summary.items():
        fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for i, arm in enumerate(table):
            seeds = table[arm]["seeds"]
            curves = {
                s: sorted(
                    (r for r in records if r["task"] == task and r["arm"] == arm and r["seed"] == s),
                    key=lambda r: r["step"],
                )
                for s in seeds
            }
            steps = sorted(set.intersection(*[{r["step"] for r in c} for c in curves.values()]))
            mean, se, secs = [], [], []
            for st in steps:
                xs = [next(r for r in c if r["step"] == st) for c in curves.values()]
                # The gain over the seed's own starting policy: seeds start from different warm-ups (their spread
                # is larger than the arms' differences), and an arm may not have finished every seed yet.
                m, e = _mean_se(
                    [x["accuracy"] - c[0]["accuracy"] for x, c in zip(xs, curves.values(), strict=True)]
                )
                mean.append(m)
                se.append(0.0 if math.isnan(e) else e)
                secs.append(statistics.mean(x["train_seconds"] for x in xs))
            colour = f"C{i}"
            label = f"{arm} (n={len(seeds)})"
            if arm != "sft":
                by_step.plot(steps, mean, "o-", color=colour, label=label)
                by_step.fill_between(
                    steps,
                    [m - e for m, e in zip(mean, se, strict=True)],
                    [m + e for m, e in zip(mean, se, strict=True)],
                    color=colour,
                    alpha=0.15,
                )
            by_time.plot(secs, mean, "o-", color=colour, label=label)
            by_time.fill_between(
                secs,
                [m - e for m, e in zip(mean, se, strict=True)],
                [m + e for m, e in zip(mean, se, strict=True)],
                color=colour,
                alpha=0.15,
            )
        by_step.set_xlabel("RL step")
        by_step.set_ylabel("held-out accuracy gain over the start\n(mean ± SE over seeds)")
        by_time.set_xlabel("training wall time, s (evaluation excluded)")
        for ax in (by_step, by_time):
            ax.grid(alpha=0.3)
        by_time.legend(fontsize=8, loc="lower right")
        fig.suptitle(f"Learning efficiency, task '{task}'")
        fig.tight_layout()
        path = path_for(task)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def report(
    root: Path,
    json_path: Path,
    command: str,
    doc: Path | None = None,
    tasks: list[str] | None = None,
    doc_marker: str = DOC_MARKER,
) -> dict:
    """Aggregate the finished arms under ``root`` (only ``tasks``' when given) into ``json_path`` and plots."""
    records, done = finished_runs(root)
    if tasks is not None:
        records = [r for r in records if r["task"] in tasks]
        done = {k: v for k, v in done.items() if k[0] in tasks}
    if not done:
        print(f"no finished arms under {root}")
        return {}
    summary = summarize(records, done)
    print_table(summary)
    plots = plot(records, summary, lambda task: json_path.parent / f"learning_efficiency_{task}.png")
    warmups = {}
    for w in load_runs(root, "*/seed*/warmup.json").values():
        if tasks is not None and w["task"] not in tasks:
            continue
        warmups[f"{w['task']}/seed{w['seed']}"] = {
            k: w[k]
            for k in ("accuracy", "curve_on_first_problems", "curve_problems", "seconds", "shared_start")
            if k in w
        }
    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    result = {
        "machine": machine_info(),  # where the report was written; each run's own is in its record
        "command": command,
        "tasks": TASKS,
        "sft_learning_rate": SFT_LR,
        "warmups": warmups,
        "runs": [
            {k: v for k, v in info.items() if k != "logs"}
            for info in sorted(done.values(), key=lambda d: (d["task"], d["seed"], d["arm"]))
        ],
        "summary": summary,
        "plots": [str(Path(p).relative_to(ROOT)) if Path(p).is_relative_to(ROOT) else p for p in plots],
        "records": sorted(records, key=lambda r: (r["task"], r["arm"], r["seed"], r["step"])),
    }
    _write_json(json_path, result)
    print(f"wrote {json_path} and {', '.join(plots)}")
    if doc is not None:
        if not update_doc(doc, markdown_tables(records, summary), doc_marker):
            raise SystemExit(
                f"--doc {doc}: no '<!-- {doc_marker} results: start/end -->' markers to write between"
            )
        print(f"updated the results in {doc}")
    return result


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="demo", choices=sorted(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS)
    parser.add_argument("--eval_every", type=int, default=10, help="RL steps between held-out evaluations")
    parser.add_argument("--sft_steps", type=int, default=SFT_STEPS, help="supervised steps of the sft arm")
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads per arm process (1 lets two benchmark processes share a 2-core machine)",
    )
    parser.add_argument("--root", default=str(RESULTS / "learning_efficiency_runs"))
    parser.add_argument("--json", default=str(RESULTS / "learning_efficiency.json"))
    parser.add_argument("--report", action="store_true", help="only aggregate the finished arms")
    parser.add_argument(
        "--report_tasks",
        nargs="+",
        default=None,
        help="aggregate only these tasks' runs into --json (default: every task under --root)",
    )
    parser.add_argument(
        "--doc",
        default=None,
        help="also rewrite the results between the markers of this Markdown file (docs/learning-efficiency.md)",
    )
    parser.add_argument(
        "--doc_marker",
        default=DOC_MARKER,
        help="the results markers' name in --doc (one page can hold one block per task: "
        "`<!-- NAME results: start -->`)",
    )
    parser.add_argument(
        "--kl_prompts",
        type=int,
        default=0,
        help="at every evaluation also estimate KL(policy || start) on this many held-out prompts (0: no)",
    )
    parser.add_argument(
        "--rl_steps",
        type=int,
        default=None,
        help="RL steps per arm (default: the task's, 40 for the regime tasks)",
    )
    parser.add_argument("--worker", nargs=2, metavar=("SEED", "ARM"), help=argparse.SUPPRESS)
    return parser


def _run_missing(args: argparse.Namespace, root: Path, command: str) -> None:
    """Every (seed, arm) of ``args`` without a record, each in its own process, seed-major (a partial run still
    gives complete seeds to compare), reporting after each."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    # Seed-major order: a partial run still gives complete seeds to compare.
    for seed in args.seeds:
        for arm in ["warmup", *args.arms]:
            if has_run(
                root, run_key(args.task, seed, "warmup.json" if arm == "warmup" else f"{arm}.done.json")
            ):
                continue
            cmd = [
                sys.executable,
                __file__,
                "--task",
                args.task,
                "--root",
                str(root),
                "--eval_every",
                str(args.eval_every),
                "--sft_steps",
                str(args.sft_steps),
                "--threads",
                str(args.threads),
                "--kl_prompts",
                str(args.kl_prompts),
                *(["--rl_steps", str(args.rl_steps)] if args.rl_steps is not None else []),
                "--worker",
                str(seed),
                arm,
            ]
            print(f"[learning_efficiency] task {args.task} seed {seed}: {arm}", flush=True)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env)
            if proc.returncode != 0:
                raise SystemExit(
                    f"arm {arm} (task {args.task}, seed {seed}) failed with exit code {proc.returncode}"
                )
            print(f"[learning_efficiency] {arm} took {time.perf_counter() - t0:.0f} s", flush=True)
            report(root, Path(args.json), command, tasks=args.report_tasks)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = Path(args.root)
    if args.worker:
        run_arm_process(
            args.task,
            int(args.worker[0]),
            args.worker[1],
            root,
            args.eval_every,
            args.sft_steps,
            args.threads,
            args.kl_prompts,
            args.rl_steps,
        )
        return 0
    if args.kl_prompts < 0:
        raise SystemExit(f"--kl_prompts must be >= 0 (0 measures no KL), got {args.kl_prompts}.")
    if args.rl_steps is not None and args.rl_steps < 1:
        raise SystemExit(f"--rl_steps must be >= 1 (or left out for the task's), got {args.rl_steps}.")
    from testbed.arms import parse_arm

    for arm in args.arms:
        base_arm = split_temperature(arm)[0]
        if base_arm not in ("grpo_matched", "grpo_matched_cost"):
            parse_arm(base_arm)  # fail before hours of runs, not after
    command = "python benchmarks/learning_efficiency.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if not args.report:
        if args.task in SHARED_START_TASKS:
            shared_start_dir(args.task)  # refuses a missing or non-plateaued start before any process starts
        _run_missing(args, root, command)
    doc = Path(args.doc) if args.doc else None
    report(root, Path(args.json), command, doc, tasks=args.report_tasks, doc_marker=args.doc_marker)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
