"""What turn credit buys a user: learning-rate stability and sampled tokens to a target on the language-model agent
(issue 58; protocol docs/lm-stability-protocol.md, committed before any confirm run).

    python benchmarks/lm_stability.py --stage pilot              # the pilot that sized the study (resumable)
    python benchmarks/lm_stability.py --stage all                # sweep, head-to-head, larger model (resumable)
    python benchmarks/lm_stability.py --summarize                # benchmarks/results/lm_stability.json, nothing run
    python benchmarks/lm_stability.py --plot chain_H2            # demo_output/stability.png from the summary

Every run trains the language-model map's start (``benchmarks/lm_agent_map.py``: its model, warm-up, environments and
trainer settings, imported, not copied) through ``VinePPOTrainer`` at one constant learning rate and 8 episodes a
step until the next step would pass its budget of sampled model tokens (that step is not taken: strict budget), and
evaluates the policy on held-out episodes at the start, each eighth of the budget and the end. Records: one line of
JSON per finished run, appended as its own gzip member to ``benchmarks/results/lm_stability/runs.jsonl.gz`` (a run
already there is skipped; an interrupted one restarts from its start), each naming the commit, the library versions,
the CPU and the threads. The summary (``--summarize``) recomputes everything from those records.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))

from benchmarks import lm_agent_map as lm  # noqa: E402  (the map's model, environments and trainer settings)
from benchmarks._runs import append_run, load_runs  # noqa: E402  (the studies' one record loader)

RESULTS = ROOT / "benchmarks" / "results"
RECORDS = RESULTS / "lm_stability" / "runs.jsonl.gz"
SUMMARY = RESULTS / "lm_stability.json"
LARGE_WARMUP_DIR = RESULTS / "lm_stability_warmup" / "large"
PROTOCOL = "docs/lm-stability-protocol.md"

#: Prompts per step and episodes per prompt: 8 episodes a step for every arm (one batch, the learning rate is the axis).
PROMPTS = 2
GENERATIONS = lm.GENERATIONS
#: Held-out episodes per evaluation, and the evaluation streams: the sweep (= tuning) episodes and the head-to-head's
#: held-out episodes (another random stream, so the head-to-head is not scored on the episodes it was tuned on).
EVAL_EPISODES = 128
SWEEP_EVAL_SEED = 7
H2H_EVAL_SEED = 8
#: Evaluations inside a run: at the start, after each ``1/CHECKPOINTS`` of the budget is spent, and at the end.
CHECKPOINTS = 12
#: A safety cap on steps (a collapsed policy that writes nothing spends almost no tokens a step).
MAX_STEPS = 600
#: A dead run: after this many consecutive training steps in which every episode's reward is 0, the policy is
#: evaluated; when its held-out success is 0 too, the run stops there (``stopped_by: "dead"``, final success 0).
DEAD_STEPS = 16
#: A run "collapsed" when it ends more than this many SEs of a difference below its start (the map's rule).
COLLAPSE_SES = lm.COLLAPSE_SES
#: The stability bound: an arm's rate is stable when at most this share of its runs collapse.
STABILITY_BOUND = 0.10
#: Tokens to target: the target is this share of the best practical plateau (see :func:`target_for`).
TARGET_SHARE = 0.9
#: The tuning rule's tie width: rates whose tuning score is within this of the best tie, and the smallest wins.
TUNING_TIE = 0.02
#: Minimum effects: a difference below these is "level" whatever its p (final success; restricted tokens, as a share
#: of the budget).
MIN_EFFECT_SUCCESS = 0.05
MIN_EFFECT_TOKENS_SHARE = 0.10
ALPHA = 0.05
POWER = 0.80
#: The power target (protocol): the difference in final success the head-to-head at chain H = 2 should detect.
TARGET_DETECTABLE = 0.2
#: Plateau (protocol, "Settings"): a cell has plateaued when its mean success gained at most this over the budget's
#: last quarter (``gain_last_quarter``).
PLATEAU_BOUND = 0.03

# Sizes fixed by the protocol's amendment after the pilot (docs/lm-stability-protocol.md).
SWEEP_SEEDS: tuple[int, ...] = tuple(range(16))
H2H_SEEDS: tuple[int, ...] = tuple(range(100, 124))
LARGE_TUNE_SEEDS: tuple[int, ...] = tuple(range(300, 304))
LARGE_SEEDS: tuple[int, ...] = tuple(range(200, 212))
RATES: tuple[float, ...] = (1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3)
#: Rates added to one (setting, arm)'s sweep by the protocol's extension rule (each by a dated note before its runs).
EXTRA_RATES: dict[tuple[str, str], tuple[float, ...]] = {}
#: The larger model: 4 layers, hidden 160 (about 1.17 M parameters, 13x the map's 0.09 M).
LARGE_SIZES: dict[str, int] = {"num_layers": 4, "hidden_size": 160, "head_dim": 32, "intermediate_size": 512}


@dataclass(frozen=True)
class StudySetting:
    """A setting of the study: the language-model map's setting (environment, horizon) and this study's budget."""

    name: str
    base: str
    budget: int


SETTINGS: dict[str, StudySetting] = {
    "chain_H2": StudySetting("chain_H2", "chain_H2", 36_000),
    "frozenlake_4x4": StudySetting("frozenlake_4x4", "frozenlake_4x4", 40_000),
}


def study_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records the study reads: the pilot's, and every other stage's at its setting's current budget (runs at
    a budget an amendment replaced stay in the file, and out of the study)."""
    return [r for r in records if r["stage"] == "pilot" or r["budget"] == SETTINGS[r["setting"]].budget]


@dataclass(frozen=True)
class StudyArm:
    """An arm: the map's arm (its ``VinePPOConfig`` settings), whether continuations are charged, whether it is a
    reference (the oracle: labelled, outside the Holm family), and the settings it runs in (None: all)."""

    name: str
    config: dict[str, Any]
    charge_mc: bool = True
    reference: bool = False
    settings: tuple[str, ...] | None = None


ORACLE = {"advantage_estimator": "vineppo", "num_mc_rollouts": 16}
ARMS: dict[str, StudyArm] = {
    "grpo": StudyArm("grpo", lm.ARMS["grpo"].config),
    "rloo": StudyArm("rloo", {"advantage_estimator": "rloo"}),
    "anchor_pooled": StudyArm("anchor_pooled", lm.ARMS["anchor_pooled"].config),
    "vineppo_k1_reuse": StudyArm("vineppo_k1_reuse", lm.ARMS["vineppo_k1_reuse"].config),
    "gae_warm": StudyArm("gae_warm", lm.ARMS["gae_warm"].config),
    "oracle_charged": StudyArm("oracle_charged", ORACLE, reference=True, settings=("chain_H2",)),
    # Piloted, then dropped by the amendment of 2026-12-07 (a run costs minutes of CPU a step); runs nowhere.
    "oracle_uncharged": StudyArm("oracle_uncharged", ORACLE, charge_mc=False, reference=True, settings=()),
}
PRACTICAL = tuple(a for a, arm in ARMS.items() if not arm.reference)


def runs_in(arm: str, setting: str) -> bool:
    """Whether the protocol runs ``arm`` in ``setting``."""
    allowed = ARMS[arm].settings
    return allowed is None or setting in allowed


#: The extension rule (protocol): while an arm's top rate has all its sweep seeds and not all of them collapsed, the
#: next rate up (x EXTEND_FACTOR) joins its sweep; while its bottom rate has all its seeds and any collapsed, the next
#: rate down joins; at most MAX_EXTENSIONS each way.
EXTEND_FACTOR = 3.0
MAX_EXTENSIONS = 3


def rates_for(setting: str, arm: str, records: Sequence[dict[str, Any]] | None = None) -> tuple[float, ...]:
    """The sweep's rates for ``arm`` in ``setting``, ascending: :data:`RATES`, any in :data:`EXTRA_RATES`, and, given
    the sweep's ``records``, those the extension rule adds (see :data:`EXTEND_FACTOR`)."""
    rates = sorted(set(RATES) | set(EXTRA_RATES.get((setting, arm), ())))
    if records is None:
        return tuple(rates)
    seen: dict[float, dict[int, bool]] = {}
    for r in records:
        if (r["stage"], r["setting"], r["model"], r["arm"]) == ("sweep", setting, "small", arm):
            seen.setdefault(r["lr"], {})[r["seed"]] = r["collapsed"]

    def flags(
        lr: float,
    ) -> list[bool] | None:  # the collapse flags of every sweep seed, or None until all are in
        cell = seen.get(lr, {})
        return [cell[s] for s in SWEEP_SEEDS] if set(SWEEP_SEEDS) <= set(cell) else None

    for _ in range(MAX_EXTENSIONS):
        top = flags(rates[-1])
        if top is None or all(top):
            break
        rates.append(float(f"{rates[-1] * EXTEND_FACTOR:.3g}"))
    for _ in range(MAX_EXTENSIONS):
        bottom = flags(rates[0])
        if bottom is None or not any(bottom):
            break
        rates.insert(0, float(f"{rates[0] / EXTEND_FACTOR:.3g}"))
    return tuple(rates)


# --------------------------------------------------------------------------------------------------------------
# Pure pieces: collapse, intervals, censored tokens to target, the tuning rule, the verdict
# --------------------------------------------------------------------------------------------------------------
def collapsed(start: float, final: float, n: int = EVAL_EPISODES) -> bool:
    """Whether ``final`` lies more than :data:`COLLAPSE_SES` SEs of a difference below ``start`` (binomial SE of the
    start's rate on ``n`` episodes each, floored at one episode's worth)."""
    se = math.sqrt(2 * max(start * (1 - start), 1.0 / n) / n)
    return final < start - COLLAPSE_SES * se


def wilson(k: int, n: int, z: float = 1.959964) -> list[float]:
    """The Wilson 95% interval of a share ``k / n`` (``[nan, nan]`` when ``n`` is 0)."""
    if n == 0:
        return [math.nan, math.nan]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def tokens_to_target(checkpoints: Sequence[dict[str, Any]], target: float) -> tuple[int, bool]:
    """``(tokens, reached)``: the sampled tokens at the first evaluation whose success is at least ``target``
    (reached), else the run's last evaluation's tokens (where it stopped; :func:`runs_cell` censors such a run at
    its budget)."""
    for point in checkpoints:
        if point["success"] >= target:
            return int(point["tokens"]), True
    return int(checkpoints[-1]["tokens"]), False


def kaplan_meier(times: Sequence[float], events: Sequence[bool]) -> list[tuple[float, float]]:
    """The Kaplan-Meier survival curve ``[(time, S(time))]`` at each event time (``events[i]`` False: censored at
    ``times[i]``; a censored time equal to an event time counts as at risk at it)."""
    if len(times) != len(events):
        raise ValueError(f"kaplan_meier: {len(times)} times against {len(events)} event flags.")
    curve, survival = [], 1.0
    for t in sorted({t for t, e in zip(times, events, strict=True) if e}):
        at_risk = sum(1 for u in times if u >= t)
        died = sum(1 for u, e in zip(times, events, strict=True) if e and u == t)
        survival *= 1 - died / at_risk
        curve.append((t, survival))
    return curve


def km_median(times: Sequence[float], events: Sequence[bool]) -> float | None:
    """The Kaplan-Meier median: the first event time where survival falls to 0.5 or below; None when it never does
    (fewer than half reach the target before they are censored)."""
    for t, s in kaplan_meier(times, events):
        if s <= 0.5:
            return t
    return None


def stable_rate(collapse_by_rate: dict[float, float], bound: float = STABILITY_BOUND) -> float | None:
    """The largest rate such that it and every smaller rate have a collapse share at most ``bound``; None when the
    smallest rate already passes it."""
    best = None
    for rate in sorted(collapse_by_rate):
        if collapse_by_rate[rate] > bound:
            break
        best = rate
    return best


def choose_rate(final_by_rate: dict[float, Sequence[float]], tie: float = TUNING_TIE) -> float:
    """The collapse-aware tuning rule: each rate scores the mean final success of its tuning runs (a collapsed run
    scores its final success, so collapse costs what it costs); rates within ``tie`` of the best score tie, and the
    smallest of them wins (the safer one)."""
    if not final_by_rate or any(len(v) == 0 for v in final_by_rate.values()):
        raise ValueError("choose_rate: every rate needs at least one tuning run.")
    scores = {rate: statistics.fmean(v) for rate, v in final_by_rate.items()}
    best = max(scores.values())
    return min(rate for rate, s in scores.items() if s >= best - tie)


def verdict(mean: float, ci95: Sequence[float], p_holm: float, min_effect: float) -> str:
    """``better`` / ``worse`` when Holm's p < :data:`ALPHA`, the 95% interval excludes 0 and ``|mean|`` reaches
    ``min_effect``; else ``level``. ``mean`` is oriented so that larger is better for the arm."""
    if math.isnan(p_holm) or p_holm >= ALPHA or abs(mean) < min_effect:
        return "level"
    if ci95[0] > 0:
        return "better"
    if ci95[1] < 0:
        return "worse"
    return "level"


def detectable_difference(se: float, n: int, family: int, power: float = POWER) -> float:
    """The smallest true difference a paired t-test of ``n`` seeds with standard error ``se`` detects with ``power`` at
    Holm's first step in a family of ``family`` (two-sided ``ALPHA / family``)."""
    from mcadvantage.evaluation.stats import student_t_quantile

    if n < 2 or not math.isfinite(se):
        return math.nan
    alpha = ALPHA / max(family, 1)
    return (student_t_quantile(1 - alpha / 2, n - 1) + student_t_quantile(power, n - 1)) * se


def plateau(checkpoints: Sequence[dict[str, Any]]) -> float:
    """A run's plateau reading: the mean success of its last two evaluations."""
    return statistics.fmean(p["success"] for p in checkpoints[-2:])


def success_at(checkpoints: Sequence[dict[str, Any]], tokens: float) -> float:
    """A run's success at its last evaluation made at or before ``tokens`` sampled tokens (the start at least)."""
    return [p for p in checkpoints if p["tokens"] <= tokens or p is checkpoints[0]][-1]["success"]


# --------------------------------------------------------------------------------------------------------------
# The strict budget
# --------------------------------------------------------------------------------------------------------------
class BudgetReached(Exception):
    """Raised inside a step whose sampled tokens would pass the budget: the step is not taken."""


class StrictLedger:
    """A run's sampled model tokens under a strict budget.

    :meth:`admit` is asked after a step's episodes (and continuations) are sampled and before the optimizer sees them:
    when the step's charged tokens would take the run past its budget it is refused (recorded in ``refused``) and the
    caller stops without the update. :meth:`due` says when an evaluation is due: each time the spent tokens cross
    another ``1/checkpoints`` of the budget."""

    def __init__(self, budget: int, *, charge_mc: bool, checkpoints: int = CHECKPOINTS) -> None:
        if budget < 1 or checkpoints < 1:
            raise ValueError(f"StrictLedger: budget={budget} and checkpoints={checkpoints} must be >= 1.")
        self.budget = budget
        self.charge_mc = charge_mc
        self.own: list[int] = []
        self.mc: list[int] = []
        self.refused: dict[str, int] | None = None
        self.dead = False
        self.zero_streak = 0  # consecutive admitted steps whose every episode scored 0
        self._marks = [budget * k / checkpoints for k in range(1, checkpoints)]

    def cost(self, own: int, mc: int) -> int:
        """A step's charged tokens: its own model tokens, plus its continuations' when they are charged."""
        return own + (mc if self.charge_mc else 0)

    @property
    def spent(self) -> int:
        """The charged tokens of the steps taken."""
        return sum(self.own) + (sum(self.mc) if self.charge_mc else 0)

    def admit(self, own: int, mc: int) -> bool:
        """Take the step (True) or refuse it because it would pass the budget (False)."""
        if self.spent + self.cost(own, mc) > self.budget:
            self.refused = {"own_tokens": own, "mc_tokens": mc}
            return False
        self.own.append(own)
        self.mc.append(mc)
        return True

    def note_rewards(self, rewards: Sequence[float]) -> None:
        """Count a step's episode rewards toward the dead-run streak (any nonzero reward resets it)."""
        self.zero_streak = self.zero_streak + 1 if all(r == 0 for r in rewards) else 0

    def dead_check_due(self, every: int = DEAD_STEPS) -> bool:
        """Whether the dead-run rule asks for an evaluation now (each further ``every`` steps of zero reward)."""
        return self.zero_streak > 0 and self.zero_streak % every == 0

    def due(self) -> bool:
        """Whether the spent tokens have crossed a checkpoint mark not yet evaluated (all crossed marks are used)."""
        crossed = [m for m in self._marks if m <= self.spent]
        self._marks = [m for m in self._marks if m > self.spent]
        return bool(crossed)


# --------------------------------------------------------------------------------------------------------------
# Runs and their records
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One run: stage, setting, model, arm, learning rate, seed, the evaluation stream and the budget."""

    stage: str
    setting: str
    model: str
    arm: str
    lr: float
    seed: int
    eval_seed: int
    budget: int

    @property
    def key(self) -> str:
        """The run's identity in the records: stage, setting, model, arm, rate, seed and budget."""
        return (
            f"{self.stage}/{self.setting}/{self.model}/{self.arm}/lr{self.lr:g}/s{self.seed}/b{self.budget}"
        )


def record_key(record: dict[str, Any]) -> str:
    """A record's run key (as :attr:`RunSpec.key`)."""
    return RunSpec(**{f: record[f] for f in RunSpec.__dataclass_fields__}).key


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` under its run key to the study's archive ``path`` (``<root>/runs.jsonl.gz``) through the
    studies' one loader (``benchmarks/_runs.py``: one gzip member in one locked write, so two processes may append)."""
    append_run(Path(path).parent, record_key(record), record)


def read_records(path: Path | None = None) -> list[dict[str, Any]]:
    """Every record in the archive ``path`` (default :data:`RECORDS`; none when it is absent), as appended. A last
    member cut short by a kill is dropped with a warning; everything before it is kept (``benchmarks/_runs.py``)."""
    return list(load_runs(Path(RECORDS if path is None else path).parent, appended=True).values())


def study_setting(name: str) -> Any:
    """The map's :class:`lm_agent_map.Setting` of a study setting (environment and horizon)."""
    return lm.SETTINGS[SETTINGS[name].base]


def warmup_dir(setting: str, model: str) -> Path | None:
    """The start of ``model`` in ``setting``: the map's warm-up (None) for ``small``, the larger one for ``large``."""
    if model == "small":
        return None
    if model == "large" and setting == "chain_H2":
        return LARGE_WARMUP_DIR
    raise ValueError(f"no start for model {model!r} in setting {setting!r} (large: chain_H2 only).")


_STARTS: dict[tuple[str, str, int], float] = {}


EVAL_CLOCK = {"seconds": 0.0}  # evaluation time of the run in progress (the record's eval_seconds)


def evaluate(trainer: Any, parts: Any, eval_seed: int) -> float:
    """Success of ``trainer.model`` on :data:`EVAL_EPISODES` held-out episodes under ``eval_seed``."""
    from testbed.lm_agent import play_episodes

    started = time.perf_counter()
    rows = parts.eval_rows[:EVAL_EPISODES]
    played = play_episodes(trainer, rows, seed=eval_seed, environment=parts.factory, calls=parts.calls)
    EVAL_CLOCK["seconds"] += time.perf_counter() - started
    return sum(p.reward for p in played) / len(played)


def _trainer(spec: RunSpec, ledger: StrictLedger, points: list[dict[str, Any]], tmp: str) -> Any:
    """The run's ``VinePPOTrainer`` (the map's config at this arm, rate and seed), whose steps pass the strict
    ledger and whose callback evaluates at each checkpoint mark."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from mcadvantage import VinePPOTrainer
    from mcadvantage.estimators.batch import combine_rewards

    setting, arm = study_setting(spec.setting), ARMS[spec.arm]
    parts = lm.environment_parts(setting)
    _tokenizer, model = lm.load_start(setting, warmup_dir(spec.setting, spec.model))
    map_spec = lm.RunSpec(setting.name, "grpo", spec.lr, PROMPTS, spec.seed, spec.stage)
    config = lm.run_config(setting, lm.Arm(arm.name, arm.config), map_spec, tmp)
    config.max_steps = MAX_STEPS
    # the records hold what matters; the trainer's per-step lines would flood the log
    config.logging_steps = MAX_STEPS

    class Trainer(VinePPOTrainer):
        def compute_advantages(self, batch: Any) -> torch.Tensor:
            advantages = super().compute_advantages(batch)
            if batch.mode == "train":
                own = int((batch.completion_mask * batch.tool_mask).sum().item())
                mc = int(float((self.last_advantage_result.metrics or {}).get("generated_tokens", 0.0)))
                if not ledger.admit(own, mc):
                    raise BudgetReached
                ledger.note_rewards(combine_rewards(batch.rewards_per_func, batch.reward_weights).tolist())
            return advantages

    class Checkpoints(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if ledger.due() or ledger.dead_check_due():
                points.append(_point(state.global_step, ledger, evaluate(trainer, parts, spec.eval_seed)))
                if ledger.dead_check_due() and points[-1]["success"] == 0:
                    ledger.dead = True
                    control.should_training_stop = True
            return control

    trainer = Trainer(
        model=model,
        reward_funcs=None,
        args=config,
        train_dataset=Dataset.from_list(parts.train_rows),
        processing_class=_tokenizer,
        environment_factory=parts.factory,
        callbacks=[Checkpoints()],
    )
    return trainer, parts


def _point(step: int, ledger: StrictLedger, success: float) -> dict[str, Any]:
    return {
        "step": step,
        "tokens": ledger.spent,
        "own_tokens": sum(ledger.own),
        "mc_tokens": sum(ledger.mc),
        "success": success,
    }


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Train one run to its strict budget, evaluating at the start, each checkpoint mark and the end; its record."""
    import torch

    torch.manual_seed(spec.seed)
    EVAL_CLOCK["seconds"] = 0.0
    arm = ARMS[spec.arm]
    ledger = StrictLedger(spec.budget, charge_mc=arm.charge_mc)
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lm_stability_") as tmp:
        trainer, parts = _trainer(spec, ledger, points, tmp)
        cache = (spec.setting, spec.model, spec.eval_seed)
        if cache not in _STARTS:
            _STARTS[cache] = evaluate(trainer, parts, spec.eval_seed)
        points.append(_point(0, ledger, _STARTS[cache]))
        started = time.perf_counter()
        stopped_by = "max_steps"
        try:
            trainer.train()
        except BudgetReached:
            stopped_by = "budget"
        if ledger.dead:
            stopped_by = "dead"
        seconds = time.perf_counter() - started
        steps = len(ledger.own)
        if points[-1]["step"] != steps or len(points) == 1:
            points.append(_point(steps, ledger, evaluate(trainer, parts, spec.eval_seed)))
    return run_record(spec, ledger, points, stopped_by, seconds)


def run_record(
    spec: RunSpec, ledger: StrictLedger, points: list[dict[str, Any]], stopped_by: str, seconds: float
) -> dict[str, Any]:
    """A finished run's record: its identity, every evaluation, its tokens (own, continuations, charged), the
    refused step, underspend, collapse and time."""
    start, final = points[0]["success"], points[-1]["success"]
    return {
        **asdict(spec),
        "episodes_per_step": PROMPTS * GENERATIONS,
        "eval_episodes": EVAL_EPISODES,
        "charge_mc": ARMS[spec.arm].charge_mc,
        "reference": ARMS[spec.arm].reference,
        "arm_config": ARMS[spec.arm].config,
        "start_success": start,
        "final_success": final,
        "checkpoints": points,
        "steps": len(ledger.own),
        "own_tokens": sum(ledger.own),
        "mc_tokens": sum(ledger.mc),
        "sampled_tokens": ledger.spent,
        "underspend": spec.budget - ledger.spent,
        "refused_step": ledger.refused,
        "stopped_by": stopped_by,
        "collapsed": collapsed(start, final),
        "train_seconds": seconds,
        "eval_seconds": EVAL_CLOCK["seconds"],
    }


#: What this study's own processes write while it runs (its records, and the summary a worker writes when it ends):
#: changes there do not make a run's tree "dirty".
OWN_OUTPUTS = ("benchmarks/results/lm_stability", "benchmarks/results/lm_stability.json")


def provenance(threads: int) -> dict[str, Any]:
    """Commit (and whether the tree had changes outside this study's own outputs, :data:`OWN_OUTPUTS`),
    library versions, CPU and threads (``benchmarks._machine``)."""
    import subprocess

    from benchmarks._machine import machine_info

    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in OWN_OUTPUTS)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return machine_info(torch_threads_requested=threads, dirty=bool(status))


class Claim:
    """An exclusive, non-blocking claim on a name among the processes of this machine (``flock`` on a file under
    ``claims/`` beside the records): two workers never run the same run, and a killed worker's claims vanish with it.
    Use as a context manager; :attr:`held` says whether the claim was won."""

    def __init__(self, name: str, path: Path | None = None) -> None:
        folder = (RECORDS if path is None else path).parent / "claims"
        folder.mkdir(parents=True, exist_ok=True)
        self.file = folder / (name.replace("/", "_") + ".lock")
        self.fd: int | None = None
        self.held = False

    def __enter__(self) -> Claim:
        self.fd = os.open(self.file, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held = True
        except BlockingIOError:
            self.held = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            if self.held:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def run_queue(
    specs: Sequence[RunSpec],
    *,
    path: Path | None = None,
    runner: Callable[[RunSpec], dict[str, Any]] | None = None,
    threads: int = 1,
    label: str = "lm stability",
) -> int:
    """Run every spec whose key is not yet in ``path`` and that no other worker has claimed (in order), appending
    each record as it finishes; the count run. Safe to interrupt, to run again, and to run in two processes."""
    from tqdm.auto import tqdm

    path = RECORDS if path is None else path
    runner = run_one if runner is None else runner
    done = {record_key(r) for r in read_records(path)}
    todo = [s for s in dict.fromkeys(specs) if s.key not in done]
    print(
        f"{label}: {len(specs) - len(todo)} of {len(specs)} runs already recorded; {len(todo)} to run",
        flush=True,
    )
    meta = provenance(threads) if todo else {}
    ran = 0
    with tqdm(todo, desc=label, unit="run", mininterval=10, file=sys.stdout) as bar:
        for spec in bar:
            with Claim(spec.key, path) as claim:
                if not claim.held or spec.key in {record_key(r) for r in read_records(path)}:
                    continue  # another worker runs it, or ran it meanwhile
                bar.set_postfix_str(spec.key)
                started, cpu = time.perf_counter(), time.process_time()
                record = runner(spec)
                if (
                    record_key(record) != spec.key
                ):  # else the run would never count as done, and rerun forever
                    raise RuntimeError(f"the runner's record says {record_key(record)}, not {spec.key}")
                record["wall_seconds"] = time.perf_counter() - started
                record["cpu_seconds"] = time.process_time() - cpu
                record["load_average"] = os.getloadavg()[0]
                record["machine"] = meta
                append_record(path, record)
                ran += 1
            print(
                f"done {spec.key}: final {record['final_success']:.3f} collapsed={record['collapsed']} tokens "
                f"{record['sampled_tokens']}/{spec.budget} steps {record['steps']} {record['wall_seconds']:.0f}s "
                f"wall, {record['cpu_seconds']:.0f}s CPU",
                flush=True,
            )
    return ran


# --------------------------------------------------------------------------------------------------------------
# The study's runs, stage by stage
# --------------------------------------------------------------------------------------------------------------
#: The pilot (docs/lm-stability-protocol.md, "Pilot"): per-run cost and the plateau at the candidate budgets;
#: (setting, model, arm, lr, seed, budget). The uncharged oracle runs a short budget: its cost is per step.
PILOT: tuple[tuple[str, str, str, float, int, int], ...] = (
    *(("chain_H2", "small", "grpo", lr, s, 18_000) for lr in (3e-4, 1e-3, 3e-3) for s in (0, 1)),
    *(
        ("chain_H2", "small", a, 1e-3, 0, 18_000)
        for a in ("rloo", "anchor_pooled", "vineppo_k1_reuse", "gae_warm")
    ),
    ("chain_H2", "small", "oracle_charged", 1e-3, 0, 18_000),
    ("chain_H2", "small", "oracle_uncharged", 1e-3, 0, 3_000),
    *(("frozenlake_4x4", "small", "grpo", lr, 0, 20_000) for lr in (3e-4, 1e-3)),
    *(("frozenlake_4x4", "small", a, 1e-3, 0, 20_000) for a in ("vineppo_k1_reuse", "gae_warm")),
    ("chain_H2", "large", "grpo", 1e-3, 0, 18_000),
)


def pilot_specs(settings: Sequence[str], models: Sequence[str] = ("small", "large")) -> list[RunSpec]:
    """The pilot's runs in ``settings`` for ``models``."""
    return [
        RunSpec("pilot", s, m, a, lr, seed, SWEEP_EVAL_SEED, budget)
        for s, m, a, lr, seed, budget in PILOT
        if s in settings and m in models
    ]


def sweep_specs(
    settings: Sequence[str], arms: Sequence[str], records: Sequence[dict[str, Any]] | None = None
) -> list[RunSpec]:
    """The stability curve: every arm x rate (with the extension rule's, given the ``records``) x sweep seed,
    seed-major (after each seed every cell has as many runs, so a partial sweep is balanced)."""
    return [
        RunSpec("sweep", s, "small", a, lr, seed, SWEEP_EVAL_SEED, SETTINGS[s].budget)
        for s in settings
        for seed in SWEEP_SEEDS
        for a in arms
        if runs_in(a, s)
        for lr in rates_for(s, a, records)
    ]


def sweep_finals(
    records: Iterable[dict[str, Any]], setting: str, model: str, arm: str, stage: str = "sweep"
) -> dict[float, list[float]]:
    """Final success per rate of ``arm``'s tuning runs (``stage``) in ``setting`` with ``model``."""
    out: dict[float, list[float]] = {}
    for r in records:
        if (r["stage"], r["setting"], r["model"], r["arm"]) == (stage, setting, model, arm):
            out.setdefault(r["lr"], []).append(r["final_success"])
    return out


def chosen_rate(
    records: Sequence[dict[str, Any]], setting: str, model: str, arm: str, stage: str, seeds: Sequence[int]
) -> float | None:
    """The tuning rule's rate for ``arm`` from complete tuning runs (every rate of :func:`rates_for` has every seed
    of ``seeds``), else None."""
    have: dict[float, set[int]] = {}
    for r in records:
        if (r["stage"], r["setting"], r["model"], r["arm"]) == (stage, setting, model, arm):
            have.setdefault(r["lr"], set()).add(r["seed"])
    rates = rates_for(setting, arm, records) if model == "small" else RATES
    if any(not set(seeds) <= have.get(lr, set()) for lr in rates):
        return None
    finals = sweep_finals(records, setting, model, arm, stage)
    return choose_rate({lr: finals[lr] for lr in rates})


def h2h_specs(
    records: Sequence[dict[str, Any]], settings: Sequence[str], arms: Sequence[str]
) -> list[RunSpec]:
    """The head-to-head: each arm at its tuned rate (from the complete sweep) x the evaluation seeds, on the
    held-out stream. Arms whose sweep is not complete are left out (printed)."""
    specs = []
    for s in settings:
        for a in arms:
            if not runs_in(a, s):
                continue
            lr = chosen_rate(records, s, "small", a, "sweep", SWEEP_SEEDS)
            if lr is None:
                print(f"head-to-head {s}/{a}: its sweep is not complete yet; left out", flush=True)
                continue
            specs += [
                RunSpec("h2h", s, "small", a, lr, seed, H2H_EVAL_SEED, SETTINGS[s].budget)
                for seed in H2H_SEEDS
            ]
    return specs


def best_credit_arm(summary_h2h: Sequence[dict[str, Any]], setting: str = "chain_H2") -> str | None:
    """The practical credit arm with the largest mean paired success difference to tuned GRPO in ``setting``'s
    head-to-head (None until every practical arm's head-to-head is in)."""
    rows = [
        r for r in summary_h2h if (r["setting"], r["model"]) == (setting, "small") and r["arm"] in PRACTICAL
    ]
    if len(rows) < len(PRACTICAL) or any(r["seeds"] != list(H2H_SEEDS) for r in rows):
        return None  # every practical arm's head-to-head, GRPO's included, must be whole
    rows = [r for r in rows if r["arm"] != "grpo"]
    return max(rows, key=lambda r: r["vs_grpo"]["success"]["mean"])["arm"]


def large_specs(records: Sequence[dict[str, Any]]) -> list[RunSpec]:
    """The larger model at chain H = 2: tuned GRPO and the best credit arm, tuned on their own tuning seeds, then
    the paired evaluation seeds (the evaluation runs only once tuning is complete)."""
    summary = summarize(records)
    arm = best_credit_arm(summary["head_to_head"])
    if arm is None:
        print("larger model: the small head-to-head is not complete yet; nothing to run", flush=True)
        return []
    budget = SETTINGS["chain_H2"].budget
    specs = [
        RunSpec("large_tune", "chain_H2", "large", a, lr, seed, SWEEP_EVAL_SEED, budget)
        for seed in LARGE_TUNE_SEEDS
        for a in ("grpo", arm)
        for lr in RATES
    ]
    for a in ("grpo", arm):
        lr = chosen_rate(records, "chain_H2", "large", a, "large_tune", LARGE_TUNE_SEEDS)
        if lr is not None:
            specs += [
                RunSpec("large_h2h", "chain_H2", "large", a, lr, s, H2H_EVAL_SEED, budget)
                for s in LARGE_SEEDS
            ]
    return specs


def ensure_large_warmup(threads: int) -> bool:
    """Train and check the larger model's start (chain H = 2, the map's recipe at :data:`LARGE_SIZES`) unless saved
    (True), or leave it to the worker already training it (False)."""
    if (LARGE_WARMUP_DIR / "model.pt").exists():
        return True
    with Claim("large_warmup") as claim:
        if not claim.held:
            print("larger model's start: another worker is training it; later", flush=True)
            return False
        _train_large_warmup(threads)
    return True


def _train_large_warmup(threads: int) -> None:
    """Train, check and save the larger model's start (see :func:`ensure_large_warmup`)."""
    from benchmarks._machine import machine_info
    from testbed.lm_agent import WarmupConfig, make_tool_trainer, save_warmup, success_check, train_warmup

    config = WarmupConfig(horizons=(2,), key_prob=0.5, steps=400, seed=0, sizes=dict(LARGE_SIZES))
    started = time.perf_counter()
    tokenizer, model, losses = train_warmup(config)
    seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        check = success_check(make_tool_trainer(model, tokenizer, 2, tmp), 2, n=512, seed=10_002)
    meta = {
        "config": asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss_first_last": [losses[0], losses[-1]],
        "train_seconds": seconds,
        "check": [check],
        "command": "python benchmarks/lm_stability.py --stage large (ensure_large_warmup)",
        "machine": machine_info(torch_threads_requested=threads),
    }
    save_warmup(model, LARGE_WARMUP_DIR, meta)
    print(
        f"larger model's start: success {check['success']:.3f} on 512 held-out episodes; {seconds:.0f} s",
        flush=True,
    )


# --------------------------------------------------------------------------------------------------------------
# The summary (recomputed from the records)
# --------------------------------------------------------------------------------------------------------------
def _group(records: Iterable[dict[str, Any]], stages: Sequence[str]) -> dict[tuple, list[dict[str, Any]]]:
    """Records of ``stages`` by (setting, model, arm, lr), each list ordered by seed."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        if r["stage"] in stages:
            groups.setdefault((r["setting"], r["model"], r["arm"], r["lr"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["seed"]) for k, v in sorted(groups.items())}


def target_for(cells: Sequence[dict[str, Any]]) -> float | None:
    """The tokens-to-target target of one (setting, model): :data:`TARGET_SHARE` x the best plateau among the
    practical arms' cells whose collapse share is within :data:`STABILITY_BOUND` (None without such a cell)."""
    stable = [c["plateau"] for c in cells if c["arm"] in PRACTICAL and c["collapse_rate"] <= STABILITY_BOUND]
    return TARGET_SHARE * max(stable) if stable else None


def runs_cell(runs: Sequence[dict[str, Any]], target: float | None) -> dict[str, Any]:
    """What a list of runs of one (setting, model, arm, lr) shows: per seed and pooled."""
    k = sum(r["collapsed"] for r in runs)
    cell = {
        "setting": runs[0]["setting"],
        "model": runs[0]["model"],
        "arm": runs[0]["arm"],
        "lr": runs[0]["lr"],
        "reference": runs[0]["reference"],
        "charge_mc": runs[0]["charge_mc"],
        "budget": runs[0]["budget"],
        "seeds": [r["seed"] for r in runs],
        "start_success": runs[0]["start_success"],
        "success": [r["final_success"] for r in runs],
        "mean_success": statistics.fmean(r["final_success"] for r in runs),
        "collapsed": [r["collapsed"] for r in runs],
        "collapse_rate": k / len(runs),
        "collapse_ci95": wilson(k, len(runs)),
        "plateau": statistics.fmean(plateau(r["checkpoints"]) for r in runs),
        "gain_last_quarter": statistics.fmean(
            r["final_success"] - success_at(r["checkpoints"], 0.75 * r["budget"]) for r in runs
        ),
        "sampled_tokens": [r["sampled_tokens"] for r in runs],
        "own_tokens": [r["own_tokens"] for r in runs],
        "mc_tokens": [r["mc_tokens"] for r in runs],
        "underspend": [r["underspend"] for r in runs],
        "over_budget": sum(r["sampled_tokens"] > r["budget"] for r in runs),
        "steps": [r["steps"] for r in runs],
    }
    if target is not None:
        hits = [tokens_to_target(r["checkpoints"], target) for r in runs]
        cell["target"] = target
        cell["tokens_to_target"] = [t if ok else None for t, ok in hits]
        cell["reached_share"] = sum(ok for _, ok in hits) / len(runs)
        # A run that does not reach the target is censored at its budget, not where it stopped: the budget and the
        # dead-run rule end runs whose outcome is final, so none leaves the risk set early (amendment 2026-12-08).
        cell["restricted_tokens"] = [t if ok else r["budget"] for (t, ok), r in zip(hits, runs, strict=True)]
        cell["km_median_tokens"] = km_median(cell["restricted_tokens"], [ok for _, ok in hits])
    return cell


def curve_cells(
    records: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], float]]:
    """The stability curve's cells (sweep and larger-model tuning runs) and each (setting, model)'s target (the
    larger model reads its setting's small-model target, so both are scored against one bar)."""
    groups = _group(records, ("sweep", "large_tune"))
    plain = {k: runs_cell(v, None) for k, v in groups.items()}
    targets: dict[tuple[str, str], float] = {}
    for setting in {k[0] for k in groups}:
        t = target_for([c for k, c in plain.items() if k[0] == setting and k[1] == "small"])
        if t is not None:
            targets[(setting, "small")] = targets[(setting, "large")] = t
    cells = [runs_cell(v, targets.get((k[0], k[1]))) for k, v in groups.items()]
    return cells, targets


def arm_lines(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (setting, model, arm): the rates run, the largest stable rate, whether the curve spans no-collapse to
    all-collapse, and the collapse-aware tuning rule's choice (on the cells' seeds)."""
    out = []
    for key in sorted({(c["setting"], c["model"], c["arm"]) for c in cells}):
        mine = sorted(
            (c for c in cells if (c["setting"], c["model"], c["arm"]) == key), key=lambda c: c["lr"]
        )
        out.append(
            {
                "setting": key[0],
                "model": key[1],
                "arm": key[2],
                "rates": [c["lr"] for c in mine],
                "seeds_per_rate": min(len(c["seeds"]) for c in mine),
                "stable_rate": stable_rate({c["lr"]: c["collapse_rate"] for c in mine}),
                "spans": mine[0]["collapse_rate"] == 0 and mine[-1]["collapse_rate"] == 1,
                "chosen_lr": choose_rate({c["lr"]: c["success"] for c in mine}),
            }
        )
    return out


def _paired(arm: Sequence[float], base: Sequence[float]) -> dict[str, Any]:
    from mcadvantage.evaluation.stats import paired_t_test

    test = paired_t_test([a - b for a, b in zip(arm, base, strict=True)])
    return {k: test[k] for k in ("n", "mean", "se", "ci95", "p")}


def head_to_head(
    records: Sequence[dict[str, Any]], targets: dict[tuple[str, str], float]
) -> list[dict[str, Any]]:
    """Per (setting, model, arm): the evaluation runs at the tuned rate, paired with tuned GRPO's by seed (final
    success, and restricted tokens to target: GRPO's minus the arm's, so positive favours the arm), Holm over each
    (setting, model)'s practical comparisons (both endpoints), the verdict with its minimum effect."""
    from mcadvantage.evaluation.stats import holm_adjust

    rows = []
    for (setting, model, arm, lr), runs in _group(records, ("h2h", "large_h2h")).items():
        cell = runs_cell(runs, targets.get((setting, model)))
        tune_stage, tune_seeds = (
            ("sweep", SWEEP_SEEDS) if model == "small" else ("large_tune", LARGE_TUNE_SEEDS)
        )
        cell["tuning_seeds"] = sorted({r["seed"] for r in records if (r["stage"], r["setting"], r["model"],
                                       r["arm"], r["lr"]) == (tune_stage, setting, model, arm, lr)})  # fmt: skip
        rows.append(cell)
    for setting, model in {(r["setting"], r["model"]) for r in rows}:
        mine = [r for r in rows if (r["setting"], r["model"]) == (setting, model)]
        grpo = next((r for r in mine if r["arm"] == "grpo"), None)
        if grpo is None:
            continue
        family = []
        for row in mine:
            if row["arm"] == "grpo" or row["seeds"] != grpo["seeds"]:
                continue
            row["vs_grpo"] = {"success": _paired(row["success"], grpo["success"])}
            if "restricted_tokens" in row:
                row["vs_grpo"]["tokens_saved"] = _paired(grpo["restricted_tokens"], row["restricted_tokens"])
            if not row["reference"]:
                family += [(row, k) for k in row["vs_grpo"]]
        for (row, k), p in zip(family, holm_adjust([r["vs_grpo"][k]["p"] for r, k in family]), strict=True):
            floor = MIN_EFFECT_SUCCESS if k == "success" else MIN_EFFECT_TOKENS_SHARE * row["budget"]
            v = row["vs_grpo"][k]
            v.update(p_holm=p, min_effect=floor, family=len(family))
            v["verdict"] = verdict(v["mean"], v["ci95"], p, floor)
            v["detectable"] = detectable_difference(v["se"], v["n"], len(family))
    return rows


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The study's summary from its records: the curve (one record per setting, model, arm, rate), each arm's
    stable rate and tuned rate, the head-to-head (one record per setting, model, arm), the targets, the pilot."""
    total = len(records)
    records = study_records(records)
    cells, targets = curve_cells(records)
    return {
        "protocol": PROTOCOL,
        "command": "python benchmarks/lm_stability.py --stage all",
        "records": "benchmarks/results/lm_stability/runs.jsonl.gz",
        "runs": total,  # every record the summary read (the file's first ``runs``), superseded ones included
        "superseded_runs": total - len(records),
        "settings": {n: asdict(s) for n, s in SETTINGS.items()},
        "rates": list(RATES),
        "stability_bound": STABILITY_BOUND,
        "target_share": TARGET_SHARE,
        "targets": [{"setting": s, "model": m, "target": t} for (s, m), t in sorted(targets.items())],
        "min_effect": {"success": MIN_EFFECT_SUCCESS, "tokens_share_of_budget": MIN_EFFECT_TOKENS_SHARE},
        "curve": cells,
        "arms": arm_lines(cells),
        "head_to_head": head_to_head(records, targets),
        "status": stage_status(records),
        "pilot": pilot_rows(records),
    }


def stage_status(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (stage, setting): runs recorded, runs planned (the extension rule's rates so far included) and whether
    the stage is whole. A report reads nothing from a stage that is not whole (the protocol's 21:45 amendment)."""
    out = []
    for (stage, setting), total in planned(records=records).items():
        done = sum((r["stage"], r["setting"]) == (stage, setting) for r in records)
        out.append(
            {"stage": stage, "setting": setting, "recorded": done, "planned": total, "whole": done >= total}
        )
    return out


def pilot_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pilot's runs, one row each: what it cost and where it ended."""
    keep = ("setting", "arm", "lr", "seed", "budget", "steps", "sampled_tokens", "own_tokens", "mc_tokens",
            "final_success", "collapsed", "train_seconds", "wall_seconds")  # fmt: skip
    rows = []
    for r in records:
        if r["stage"] == "pilot":
            row = {k: r.get(k) for k in keep}
            row["success_by_tokens"] = [[p["tokens"], p["success"]] for p in r["checkpoints"]]
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------------------------
STAGES = ("pilot", "sweep", "h2h", "large", "all")


def stage_specs(stage: str, settings: Sequence[str], arms: Sequence[str], threads: int) -> list[RunSpec]:
    """The runs of ``stage`` not yet known to be done (``all``: sweep, then head-to-head, then the larger model; the
    later stages are computed from the records as they stand when they are reached)."""
    if stage == "pilot":
        specs = [s for s in pilot_specs(settings) if s.arm in arms]
        if any(s.model == "large" for s in specs) and not ensure_large_warmup(threads):
            specs = [s for s in specs if s.model != "large"]
        return specs
    if stage == "sweep":
        return sweep_specs(settings, arms, study_records(read_records()))
    if stage == "h2h":
        return h2h_specs(study_records(read_records()), settings, arms)
    if stage == "large":
        if "chain_H2" not in settings or not ensure_large_warmup(threads):
            return []
        return large_specs(study_records(read_records()))
    raise ValueError(f"unknown stage {stage!r}; one of {STAGES}")


def study_order(settings: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``--stage all``'s order: each setting's sweep and head-to-head in :data:`SETTINGS`' order, the larger model
    right after the first setting (chain H = 2), so the first setting's answer is whole before the next starts."""
    order: list[tuple[str, list[str]]] = []
    for i, name in enumerate(s for s in SETTINGS if s in settings):
        order += [("sweep", [name]), ("h2h", [name])]
        if i == 0:
            order.append(("large", [name]))
    return order


def run_stages(
    stage: str, settings: Sequence[str], arms: Sequence[str], threads: int, wait_seconds: float = 60.0
) -> None:
    """Run ``stage``; ``all`` runs :func:`study_order` in passes. A pass restarts from the top after any stage ran
    something, and waits (``wait_seconds``) rather than move past a stage whose remaining runs another worker holds,
    so no worker starts a later stage before an earlier one is whole. It ends when a pass finds nothing to run or
    wait for."""
    if stage != "all":
        run_queue(stage_specs(stage, settings, arms, threads), threads=threads, label=stage)
        return
    while True:
        outcome = "done"
        for name, names in study_order(settings):
            specs = stage_specs(name, names, arms, threads)
            label = f"{name} {' '.join(names)}"
            if run_queue(specs, threads=threads, label=label):
                outcome = "ran"
                break
            recorded = {record_key(r) for r in read_records()}
            if any(s.key not in recorded for s in specs):
                outcome = "wait"
                print(f"{label}: waiting for runs another worker holds", flush=True)
                break
        if outcome == "done":
            print("nothing left to run or wait for; done", flush=True)
            return
        if outcome == "wait":
            time.sleep(wait_seconds)


def planned(
    settings: Sequence[str] | None = None, records: Sequence[dict[str, Any]] | None = None
) -> dict[tuple[str, str], int]:
    """How many runs the protocol plans per (stage, setting) of ``settings`` (default: every setting): sweep (with
    the extension rule's rates so far, given the ``records``), head-to-head and the larger model's two."""
    settings = tuple(SETTINGS) if settings is None else settings
    plan: dict[tuple[str, str], int] = {}
    for s in settings:
        arms = [a for a in ARMS if runs_in(a, s)]
        plan[("sweep", s)] = sum(len(rates_for(s, a, records)) for a in arms) * len(SWEEP_SEEDS)
        plan[("h2h", s)] = len(arms) * len(H2H_SEEDS)
    plan[("large_tune", "chain_H2")] = 2 * len(RATES) * len(LARGE_TUNE_SEEDS)
    plan[("large_h2h", "chain_H2")] = 2 * len(LARGE_SEEDS)
    return plan


#: Cost of a run against a surviving chain sweep run, where a stage has no CPU seconds yet: FrozenLake (the pilot's
#: 43 s against 27 s) and the larger model (the pilot's 2.7x wall time).
COST_RATIO = {"chain_H2": 1.0, "frozenlake_4x4": 1.6, "large": 2.7}


def progress_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """Per (stage, setting): runs recorded of those planned, their mean CPU seconds, and the CPU-hours left at that
    mean (where a stage has none yet: a surviving chain sweep run's, 35 s before there is one, x :data:`COST_RATIO`)."""
    records = study_records(records)
    alive = [r["cpu_seconds"] for r in records if "cpu_seconds" in r and r["stage"] == "sweep"
             and r["setting"] == "chain_H2" and not r["collapsed"]]  # fmt: skip
    unit = statistics.fmean(alive) if alive else 35.0
    lines, left = [], 0.0
    for (stage, setting), total in planned(records=records).items():
        mine = [r for r in records if (r["stage"], r["setting"]) == (stage, setting)]
        cpu = [r["cpu_seconds"] for r in mine if "cpu_seconds" in r]
        ratio = COST_RATIO["large" if stage.startswith("large") else setting]
        mean = statistics.fmean(cpu) if cpu else unit * ratio
        left += max(total - len(mine), 0) * mean / 3600
        lines.append(f"{stage:<10} {setting:<15} {len(mine):>4} of {total:>4} runs, {mean:5.0f} s CPU a run")
    lines.append(f"about {left:.1f} CPU-hours left (about {left / 2:.1f} h on two idle cores)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: run a stage (resumable), write the summary, print progress or tables, draw the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=STAGES, default=None, help="run this stage (resumable)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--summarize", action="store_true", help="write the summary from the records")
    parser.add_argument(
        "--plot", metavar="SETTING", default=None, help="plot SETTING's curve from the summary"
    )
    parser.add_argument("--output", default=str(ROOT / "demo_output" / "stability.png"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--progress", action="store_true", help="runs recorded per stage, and CPU-hours left")
    parser.add_argument(
        "--table", metavar="SETTING", default=None, help="print SETTING's tables from the summary"
    )
    args = parser.parse_args(argv)
    if args.progress:
        print("\n".join(progress_lines(read_records())))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.stage is not None:
        import torch

        torch.set_num_threads(args.threads)
        run_stages(args.stage, args.settings, args.arms, args.threads)
    if args.summarize or args.stage is not None:
        summary = summarize(read_records())
        SUMMARY.write_text(json.dumps(summary, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"wrote {SUMMARY.relative_to(ROOT)} ({len(summary['curve'])} curve cells)", flush=True)
    if args.table is not None:
        summary = json.loads(SUMMARY.read_text(encoding="utf-8"))
        print("\n".join([*curve_table(summary, args.table), "", *h2h_table(summary, args.table)]))
    if args.plot is not None:
        summary = json.loads(SUMMARY.read_text(encoding="utf-8"))
        print(plot(summary, args.plot, Path(args.output)))
    return 0


def summary_target(summary: dict[str, Any], setting: str, model: str = "small") -> float | None:
    """The target success of one (setting, model) in a summary (90% of the best stable practical plateau), or None."""
    return next(
        (t["target"] for t in summary["targets"] if (t["setting"], t["model"]) == (setting, model)), None
    )


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def curve_table(summary: dict[str, Any], setting: str, model: str = "small") -> list[str]:
    """``setting``'s curve as a markdown table (one row per arm and rate; references labelled), then each arm's
    largest stable rate and tuned rate."""
    out = [
        "| arm | lr | runs | collapsed [95% CI] | final success | plateau (last-quarter gain) | reached target | "
        "KM median tokens | mean tokens (own + continuations) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in (c for c in summary["curve"] if (c["setting"], c["model"]) == (setting, model)):
        name = f"`{c['arm']}`" + (" (reference, continuations charged)" if c["reference"] else "")
        low, high = c["collapse_ci95"]
        own, mc = statistics.fmean(c["own_tokens"]), statistics.fmean(c["mc_tokens"])
        out.append(
            f"| {name} | {c['lr']:g} | {len(c['seeds'])} | {sum(c['collapsed'])}/{len(c['seeds'])} "
            f"[{low:.2f}, {high:.2f}] | {c['mean_success']:.3f} | {c['plateau']:.3f} ({c['gain_last_quarter']:+.3f}) | "
            f"{c.get('reached_share', math.nan):.2f} | "
            f"{_tokens(c.get('km_median_tokens'))} | {own:,.0f} + {mc:,.0f} |"
        )
    out += [
        "",
        "| arm | largest stable rate | tuned rate | curve spans 0 to all collapsed |",
        "|---|---|---|---|",
    ]
    for a in (a for a in summary["arms"] if (a["setting"], a["model"]) == (setting, model)):
        stable = "none" if a["stable_rate"] is None else f"{a['stable_rate']:g}"
        out.append(f"| `{a['arm']}` | {stable} | {a['chosen_lr']:g} | {'yes' if a['spans'] else 'no'} |")
    return out


def h2h_table(summary: dict[str, Any], setting: str, model: str = "small") -> list[str]:
    """``setting``'s head-to-head as a markdown table: each arm against tuned GRPO on both endpoints, with Holm's
    p, the verdict and the detectable difference."""
    out = [
        "| arm | lr | seeds | final success | vs GRPO [95% CI] | Holm p | verdict (detectable) | tokens saved vs "
        "GRPO [95% CI] | Holm p | verdict (detectable) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in summary["head_to_head"] if (r["setting"], r["model"]) == (setting, model)):
        cells = []
        for key in ("success", "tokens_saved"):
            v = r.get("vs_grpo", {}).get(key)
            if v is None:
                cells += ["-", "-", "-"]
                continue
            fmt = ".3f" if key == "success" else ",.0f"
            ci = f"{v['mean']:+{fmt}} [{v['ci95'][0]:+{fmt}}, {v['ci95'][1]:+{fmt}}]"
            if "p_holm" not in v:  # a reference: compared, outside the family
                cells += [ci, f"{v['p']:.3g} (raw)", "reference"]
            else:
                cells += [ci, f"{v['p_holm']:.3g}", f"{v['verdict']} ({v['detectable']:{fmt}})"]
        name = f"`{r['arm']}`" + (" (reference)" if r["reference"] else "")
        out.append(
            f"| {name} | {r['lr']:g} | {len(r['seeds'])} | {r['mean_success']:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    return out


def plot(summary: dict[str, Any], setting: str, output: Path, model: str = "small") -> str:
    """``setting``'s curve from ``summary``: collapse share and the Kaplan-Meier median tokens to target against
    the learning rate, one line per arm (references dashed); returns a line saying what was written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in summary["curve"] if c["setting"] == setting and c["model"] == model]
    if not cells:
        raise ValueError(f"the summary has no curve for {setting!r} ({model}); run the sweep first.")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 7.5), sharex=True)
    arms = list(dict.fromkeys(c["arm"] for c in cells))
    for i, arm in enumerate(arms):
        mine = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["lr"])
        style = "--" if mine[0]["reference"] else "-"
        label = f"{arm} (reference)" if mine[0]["reference"] else arm
        nudge = 1 + 0.03 * (i - (len(arms) - 1) / 2)  # a small offset so coinciding lines stay visible
        xs = [c["lr"] * nudge for c in mine]
        low = [max(0.0, c["collapse_rate"] - c["collapse_ci95"][0]) for c in mine]  # (rounding at 0 and 1)
        high = [max(0.0, c["collapse_ci95"][1] - c["collapse_rate"]) for c in mine]
        top.errorbar(xs, [c["collapse_rate"] for c in mine], yerr=[low, high], fmt=style, marker="o",
                     capsize=2, label=label)  # fmt: skip
        med = [(x, c.get("km_median_tokens")) for x, c in zip(xs, mine, strict=True)]
        med = [(x, y) for x, y in med if y is not None]
        bottom.plot([x for x, _ in med], [y for _, y in med], style, marker="o", label=label)
    rates = sorted({c["lr"] for c in cells})
    top.axhline(summary["stability_bound"], color="grey", lw=0.8, ls=":")
    top.set_ylabel("collapse share (95% Wilson)")
    bottom.set_ylabel("sampled tokens to target (KM median)")
    bottom.set_xlabel("learning rate (8 episodes a step)")
    bottom.set_xscale("log")
    bottom.set_xticks(rates, [f"{r:g}" for r in rates])
    bottom.minorticks_off()
    top.legend(fontsize=8)
    seeds = min(len(c["seeds"]) for c in cells)
    target = summary_target(summary, setting, model)
    top.set_title(f"{setting} ({model} model): {seeds}+ runs per point")
    bottom.set_title(
        f"target {target:.3f}; no point where under half the runs reach it"
        if target is not None
        else "no target yet",
        fontsize=9,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return f"wrote {output} ({len(cells)} cells of {setting})"


if __name__ == "__main__":
    raise SystemExit(main())
