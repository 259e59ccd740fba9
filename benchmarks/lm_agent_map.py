"""Where turn credit pays for a language model: every arm trained through ``VinePPOTrainer`` on a multi-turn tool
environment, at equal sampled model tokens, each with its learning rate and batch tuned on held-out seeds.

    python benchmarks/lm_agent_map.py --phase tune          # the tuning runs (resumable), then
    python benchmarks/lm_agent_map.py --phase eval          # the evaluation runs of every arm's chosen config
    python benchmarks/lm_agent_map.py --phase all           # both, in that order (what the background run does)
    python benchmarks/lm_agent_map.py --report              # the summary from the records there, nothing run

The protocol (docs/lm-agent-map-protocol.md) was committed before any run. In brief: the start is
:mod:`testbed.lm_agent`'s warm-up (a tiny tool-calling Llama, success about 0.1-0.3), the environment the agent
testbed's ``chain`` task through ``environment_factory=AgentEnv``; every run spends at most the setting's budget of
sampled model tokens (its episodes' model tokens, Monte Carlo continuations' model tokens included; tool results are
not sampled; the oracle's continuations are not charged), and is evaluated on a fixed held-out set of episodes at
half and the whole of its budget (one run gives the three budget fractions: the learning rate is
constant). Each arm chooses its (learning rate, prompts per step) from :data:`GRID` by the mean full-budget success
of :data:`TUNING_SEEDS`, then runs :data:`EVAL_SEEDS` (the oracle is not tuned: it runs at tuned GRPO's point).

Records: one record per run, named ``<setting>/<phase>/<run>.json``, in ``benchmarks/results/lm_agent_map_runs``'s
archive (``benchmarks/_runs.py``; appended when the run finishes; a run whose record exists is skipped, an
interrupted one restarts from its start), each naming the
commit, library versions, CPU and threads; the summary ``benchmarks/results/lm_agent_map.json`` has one record per
(setting, budget fraction, arm).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))

from benchmarks._runs import append_run, read_run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RUNS = RESULTS / "lm_agent_map_runs"
SUMMARY = RESULTS / "lm_agent_map.json"
WARMUP_DIR = RESULTS / "lm_agent_map_warmup"

#: Budget fractions evaluated inside each run.
FRACTIONS = (0.5, 1.0)
#: The tuning grid, the same for every arm: learning rates x prompts per step (each prompt gets GENERATIONS episodes).
GRID_LRS = (1e-3, 3e-3)
GRID_PROMPTS = (2, 4)
GRID: tuple[tuple[float, int], ...] = tuple((lr, p) for lr in GRID_LRS for p in GRID_PROMPTS)
GENERATIONS = 4
TUNING_SEEDS = (1000, 1001)
EVAL_SEEDS = tuple(range(12))
#: Held-out evaluation episodes per checkpoint (one per row of ``testbed.lm_agent.eval_rows``) and their seed (fixed:
#: every run and the start are evaluated on the same rows with the same random stream).
EVAL_EPISODES = 192
EVAL_SEED = 7
#: A run "collapsed" when it ends below its start by more than two SEs of a difference of two such evaluations.
COLLAPSE_SES = 2.0
#: "gae": steps that train the critic alone (charged: they sample episodes) and the critic's learning rate.
CRITIC_WARMUP_STEPS = 4
CRITIC_LR = 3e-3
#: FrozenLake's budget of sampled model tokens (sized in the protocol's FrozenLake amendment).
FROZENLAKE_BUDGET = 10_000


@dataclass(frozen=True)
class Setting:
    """One cell of the map: an environment at a horizon (for FrozenLake: its episode limit, the most moves), and its
    budget of sampled model tokens."""

    name: str
    env: str
    horizon: int
    budget_tokens: int


#: The settings, run in this order (docs/lm-agent-map-protocol.md; FrozenLake by its amendment of 2026-11-29).
SETTINGS: dict[str, Setting] = {
    "chain_H2": Setting("chain_H2", "agent_chain", 2, 9_000),
    "chain_H8": Setting("chain_H8", "agent_chain", 8, 12_000),
    "frozenlake_4x4": Setting("frozenlake_4x4", "frozenlake", 8, FROZENLAKE_BUDGET),
}
#: The FrozenLake start (testbed.lm_frozenlake's warm-up).
FROZENLAKE_WARMUP_DIR = WARMUP_DIR / "frozenlake"


@dataclass(frozen=True)
class EnvParts:
    """What a run needs of its setting's environment: the ``environment_factory`` class, the training and held-out
    rows, the episode's token budget, and how an episode's accepted tool calls are counted."""

    factory: Any
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    max_completion_length: int
    calls: Callable[[Any], int] | None = None


def environment_parts(setting: Setting, eval_episodes: int | None = None) -> EnvParts:
    """The environment side of ``setting`` (``agent_chain``: the agent testbed's ``chain`` task; ``frozenlake``:
    FrozenLake-v1 4x4 through ``mcadvantage.envs.gymnasium_environment``), with ``eval_episodes`` held-out rows
    (default :data:`EVAL_EPISODES`)."""
    eval_episodes = EVAL_EPISODES if eval_episodes is None else eval_episodes
    if setting.env == "agent_chain":
        from testbed.agent_env import AgentEnv
        from testbed.lm_agent import TRAIN_ROW_SEED, eval_rows, max_completion_length_for, task_rows

        return EnvParts(
            AgentEnv,
            task_rows(setting.horizon, 512, TRAIN_ROW_SEED),
            eval_rows(setting.horizon, eval_episodes),
            max_completion_length_for(setting.horizon),
        )
    if setting.env == "frozenlake":
        import testbed.lm_frozenlake as fl

        return EnvParts(
            fl.frozenlake_environment(),
            fl.frozenlake_rows(512, fl.TRAIN_ROW_SEED),
            fl.frozenlake_rows(eval_episodes, fl.EVAL_ROW_SEED),
            fl.max_completion_length(),
            fl._moves,
        )
    raise ValueError(f"setting {setting.name}: unknown env {setting.env!r} (agent_chain or frozenlake).")


def load_start(setting: Setting, warmup_dir: Path | None = None) -> tuple[Any, Any]:
    """The setting's start (tokenizer, model): the chain warm-up, or the FrozenLake one."""
    if setting.env == "frozenlake":
        from testbed.lm_frozenlake import load_frozenlake_warmup

        tokenizer, model, _ = load_frozenlake_warmup(warmup_dir or FROZENLAKE_WARMUP_DIR)
    else:
        from testbed.lm_agent import load_warmup

        tokenizer, model, _ = load_warmup(warmup_dir or WARMUP_DIR)
    return tokenizer, model


@dataclass(frozen=True)
class Arm:
    """An arm: its ``VinePPOConfig`` settings, whether its Monte Carlo continuations are charged, and whether it is
    tuned on the grid (the oracle is not: it runs at tuned GRPO's full-budget choice, a reference)."""

    name: str
    config: dict[str, Any]
    charge_mc: bool = True
    tuned: bool = True
    settings: tuple[str, ...] | None = None  # None: every setting; else only these (the oracle: H = 2 only)
    available: Callable[[], str | None] = field(default=lambda: None)  # None, or why the arm cannot run yet


def _anchor_available() -> str | None:
    from mcadvantage.estimators import available_advantage_estimators

    if "anchor" in available_advantage_estimators():
        return None
    return "the 'anchor' estimator is not registered yet (issue 49); merge main once its USABLE commit lands"


ARMS: dict[str, Arm] = {
    "grpo": Arm("grpo", {"advantage_estimator": "grpo"}),
    "vineppo_k1": Arm("vineppo_k1", {"advantage_estimator": "vineppo", "num_mc_rollouts": 1}),
    # Joined by the amendment of 2026-11-29 06:28 UTC, once the one Monte Carlo engine (issue 52) took free samples
    # for agents: K = 1 fresh continuation where a state has no free sample from the group's own episodes.
    "vineppo_k1_reuse": Arm(
        "vineppo_k1_reuse",
        {"advantage_estimator": "vineppo", "num_mc_rollouts": 1, "mc_reuse_samples": True},
    ),
    "gae_warm": Arm(
        "gae_warm",
        {
            "advantage_estimator": "gae",
            "critic_warmup_steps": CRITIC_WARMUP_STEPS,
            "critic_learning_rate": CRITIC_LR,
            "gae_gamma": 1.0,
            "gae_lambda": 1.0,
        },
    ),
    "oracle_k16": Arm(
        "oracle_k16",
        {"advantage_estimator": "vineppo", "num_mc_rollouts": 16},
        charge_mc=False,
        tuned=False,
        settings=("chain_H2",),
    ),
    "anchor": Arm("anchor", {"advantage_estimator": "anchor"}, available=_anchor_available),
    "anchor_pooled": Arm(
        "anchor_pooled",
        {"advantage_estimator": "anchor", "anchor_credit": "pooled"},
        available=_anchor_available,
    ),
}


# --------------------------------------------------------------------------------------------------------------
# Run identity and records
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One run: a setting, an arm, a grid point and a seed, in the tuning or the evaluation phase."""

    setting: str
    arm: str
    lr: float
    prompts: int
    seed: int
    phase: str

    @property
    def name(self) -> str:
        return f"{self.arm}_lr{self.lr:g}_p{self.prompts}_s{self.seed}"

    @property
    def key(self) -> str:
        """The run's record's name in the run directory's archive (``benchmarks/_runs.py``)."""
        return f"{self.setting}/{self.phase}/{self.name}.json"


def tuning_specs(setting: str, arms: Sequence[str]) -> list[RunSpec]:
    """Every tuning run of ``setting``: each arm x grid point x tuning seed."""
    return [
        RunSpec(setting, arm, lr, prompts, seed, "tune")
        for arm in arms
        if ARMS[arm].tuned
        for lr, prompts in GRID
        for seed in TUNING_SEEDS
    ]


def read_record(spec: RunSpec, root: Path = RUNS) -> dict[str, Any] | None:
    """A finished run's record, or None when the run has not finished."""
    return read_run(root, spec.key, None)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write a summary atomically (a temporary file renamed), so a killed write leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def choose(records: Sequence[dict[str, Any]], fraction: float) -> tuple[float, int]:
    """The grid point with the highest mean success at ``fraction`` over the tuning seeds; ties go to the smaller
    learning rate, then the fewer prompts. Every grid point must have all its tuning seeds.

    Raises:
        ValueError: when a grid point lacks a tuning seed (tune first).
    """
    by_point: dict[tuple[float, int], list[float]] = {}
    for rec in records:
        by_point.setdefault((rec["lr"], rec["prompts"]), []).append(checkpoint(rec, fraction)["success"])
    missing = [p for p in GRID if len(by_point.get(p, [])) < len(TUNING_SEEDS)]
    if missing:
        raise ValueError(
            f"tuning is incomplete: grid points {missing} lack some of the {len(TUNING_SEEDS)} tuning seeds; run "
            "--phase tune first."
        )
    return max(GRID, key=lambda p: (statistics.fmean(by_point[p]), -p[0], -p[1]))


def checkpoint(record: dict[str, Any], fraction: float) -> dict[str, Any]:
    """A run record's evaluation at budget ``fraction``."""
    for point in record["checkpoints"]:
        if math.isclose(point["fraction"], fraction):
            return point
    raise ValueError(f"the record {record.get('run')} has no checkpoint at fraction {fraction}.")


def eval_specs(setting: str, arms: Sequence[str], root: Path = RUNS) -> list[RunSpec]:
    """Every evaluation run of ``setting``: for each arm, the grid points chosen at some fraction, x the evaluation
    seeds (one run serves every fraction that chose its point). Needs the arm's tuning records."""
    specs = []
    for arm in sorted(arms, key=lambda a: not ARMS[a].tuned):  # the untuned oracle last: the slowest runs
        if not runs_in(arm, setting):
            continue
        points = chosen_points(setting, arm, root)
        specs += [
            RunSpec(setting, arm, lr, p, seed, "eval")
            for lr, p in dict.fromkeys(points.values())
            for seed in EVAL_SEEDS
        ]
    return specs


def runs_in(arm: str, setting: str) -> bool:
    """Whether the protocol runs ``arm`` in ``setting`` (the oracle only at H = 2: its steps at H = 8 cost minutes)."""
    allowed = ARMS[arm].settings
    return allowed is None or setting in allowed


def chosen_points(setting: str, arm: str, root: Path = RUNS) -> dict[float, tuple[float, int]]:
    """The (learning rate, prompts per step) every fraction of ``arm`` is evaluated at: the arm's own choice at the
    full budget (so 12 evaluation runs per arm serve both fractions), or, for an untuned arm (the oracle), tuned
    GRPO's.

    Raises:
        ValueError: when the tuning runs it needs are not all there.
    """
    source = arm if ARMS[arm].tuned else "grpo"
    records = [read_record(spec, root) for spec in tuning_specs(setting, [source])]
    if any(r is None for r in records):
        raise ValueError(f"{setting}/{source}: tuning is incomplete; run --phase tune first.")
    point = choose(records, FRACTIONS[-1])
    return {f: point for f in FRACTIONS}


def collapsed(start: float, final: float, n: int = EVAL_EPISODES) -> bool:
    """Whether ``final`` lies more than :data:`COLLAPSE_SES` SEs of a difference below ``start`` (binomial SE of the
    start's rate, on ``n`` episodes each)."""
    se = math.sqrt(2 * max(start * (1 - start), 1.0 / n) / n)
    return final < start - COLLAPSE_SES * se


# --------------------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------------------
def run_config(setting: Setting, arm: Arm, spec: RunSpec, output_dir: str) -> Any:
    """The run's ``VinePPOConfig``: one generation batch per optimizer step, a constant learning rate (so the model
    at half the budget is the model a half-budget run ends with), temperature 1."""
    from mcadvantage import VinePPOConfig

    return VinePPOConfig(
        output_dir=output_dir,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        per_device_train_batch_size=spec.prompts * GENERATIONS,
        num_generations=GENERATIONS,
        gradient_accumulation_steps=1,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        max_steps=100_000,  # the budget stops the run
        temperature=1.0,
        max_completion_length=environment_parts(setting, 1).max_completion_length,
        max_tool_calling_iterations=setting.horizon + 1,
        seed=spec.seed,
        **arm.config,
    )


def run_one(
    spec: RunSpec, *, warmup_dir: Path | None = None, start_success: float | None = None
) -> dict[str, Any]:
    """Train one run to its budget, evaluating at every fraction; returns its record (not written)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from mcadvantage import VinePPOTrainer

    setting, arm = SETTINGS[spec.setting], ARMS[spec.arm]
    why = arm.available()
    if why is not None:
        raise RuntimeError(f"arm {spec.arm} cannot run: {why}")
    torch.manual_seed(spec.seed)
    tokenizer, model = load_start(setting, warmup_dir)
    parts = environment_parts(setting)
    rows = parts.eval_rows
    ledger = Ledger(setting.budget_tokens, charge_mc=arm.charge_mc)

    class Trainer(VinePPOTrainer):
        def compute_advantages(self, batch: Any) -> torch.Tensor:
            advantages = super().compute_advantages(batch)
            if batch.mode == "train":
                own = int((batch.completion_mask * batch.tool_mask).sum().item())
                mc = float((self.last_advantage_result.metrics or {}).get("generated_tokens", 0.0))
                ledger.add_batch(own, int(mc))
            return advantages

    class Checkpoints(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            for fraction in ledger.due(state.global_step):
                success = _success(trainer, rows, parts)
                ledger.record(fraction, state.global_step, success)
            if ledger.finished:
                control.should_training_stop = True
            return control

    with tempfile.TemporaryDirectory(prefix="lm_agent_map_") as tmp:
        trainer = Trainer(
            model=model,
            reward_funcs=None,
            args=run_config(setting, arm, spec, tmp),
            train_dataset=Dataset.from_list(parts.train_rows),
            processing_class=tokenizer,
            environment_factory=parts.factory,
            callbacks=[Checkpoints()],
        )
        start = start_success if start_success is not None else _success(trainer, rows, parts)
        ledger.start_success = start
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    return ledger.as_record(spec, setting, seconds)


def _success(trainer: Any, rows: Sequence[dict[str, Any]], parts: EnvParts) -> float:
    from testbed.lm_agent import play_episodes

    played = play_episodes(trainer, rows, seed=EVAL_SEED, environment=parts.factory, calls=parts.calls)
    return sum(p.reward for p in played) / len(played)


class Ledger:
    """A run's sampled model tokens and its checkpoints at the budget fractions.

    After step ``n`` with ``spent`` tokens so far, fraction ``f`` is due when the next step, predicted to cost the
    mean step so far, would pass ``f x budget``; the model after step ``n`` is then evaluated for ``f``. When the
    first step alone passes ``f x budget``, the run could not afford a step within ``f``: that fraction's checkpoint
    is the start (``steps`` 0, marked ``affordable`` False), never a loss of the arm.
    """

    def __init__(self, budget: int, *, charge_mc: bool) -> None:
        self.budget = budget
        self.charge_mc = charge_mc
        self.own: list[int] = []
        self.mc: list[int] = []
        self.points: list[dict[str, Any]] = []
        self.start_success: float | None = None

    def add_batch(self, own: int, mc: int) -> None:
        self.own.append(own)
        self.mc.append(mc)

    @property
    def spent(self) -> int:
        return sum(self.own) + (sum(self.mc) if self.charge_mc else 0)

    @property
    def finished(self) -> bool:
        return len(self.points) == len(FRACTIONS)

    def due(self, step: int) -> list[float]:
        """The fractions whose checkpoint is the model after ``step`` (see the class docstring); the unaffordable
        ones are recorded here as the start."""
        if step == 0 or not self.own:
            return []
        done = {p["fraction"] for p in self.points}
        steps = len(self.own)
        cost = self.spent / steps
        due = []
        for fraction in FRACTIONS:
            if fraction in done:
                continue
            limit = fraction * self.budget
            if steps == 1 and self.spent > limit:
                self.points.append(
                    {
                        "fraction": fraction,
                        "steps": 0,
                        "tokens": 0,
                        "success": self.start_success,
                        "affordable": False,
                    }
                )
            elif self.spent + cost > limit:
                due.append(fraction)
        return due

    def record(self, fraction: float, step: int, success: float) -> None:
        self.points.append(
            {
                "fraction": fraction,
                "steps": step,
                "tokens": self.spent,
                "success": success,
                "affordable": True,
            }
        )

    def as_record(self, spec: RunSpec, setting: Setting, seconds: float) -> dict[str, Any]:
        points = sorted(self.points, key=lambda p: p["fraction"])
        return {
            "run": spec.name,
            "setting": spec.setting,
            "phase": spec.phase,
            "arm": spec.arm,
            "lr": spec.lr,
            "prompts": spec.prompts,
            "episodes_per_step": spec.prompts * GENERATIONS,
            "seed": spec.seed,
            "env": setting.env,
            "horizon": setting.horizon,
            "budget_tokens": setting.budget_tokens,
            "start_success": self.start_success,
            "checkpoints": points,
            "steps": len(self.own),
            "own_tokens": sum(self.own),
            "mc_tokens": sum(self.mc),
            "mc_charged": self.charge_mc,
            "sampled_tokens": self.spent,
            "collapsed": collapsed(self.start_success, points[-1]["success"]) if points else None,
            "train_seconds": seconds,
        }


# --------------------------------------------------------------------------------------------------------------
# Provenance, the driver, the summary
# --------------------------------------------------------------------------------------------------------------
def provenance() -> dict[str, Any]:
    """Commit (and whether the tree had changes), library versions, CPU and threads."""
    import trl

    from benchmarks._machine import machine_info

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return machine_info(
        commit=git("rev-parse", "HEAD"),
        dirty=bool(git("status", "--porcelain", "--untracked-files=no")),
        trl=trl.__version__,
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    )


def start_success(setting: Setting, warmup_dir: Path | None = None) -> float:
    """The start's success on the held-out set (the same for every run of the setting), cached in the runs' folder."""
    key = f"{setting.name}/start.json"
    cached = read_run(RUNS, key, None)
    if cached is not None:
        return cached["success"]
    from testbed.lm_agent import make_tool_trainer

    tokenizer, model = load_start(setting, warmup_dir)
    parts = environment_parts(setting)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_tool_trainer(
            model,
            tokenizer,
            setting.horizon,
            tmp,
            environment=parts.factory,
            rows=parts.train_rows[:2],
            max_completion_length=parts.max_completion_length,
        )
        success = _success(trainer, parts.eval_rows, parts)
    append_run(
        RUNS, key, {"setting": setting.name, "success": success, "episodes": EVAL_EPISODES, "seed": EVAL_SEED}
    )
    return success


def run_all(
    specs: Sequence[RunSpec], *, root: Path = RUNS, runner: Callable[..., dict[str, Any]] = run_one
) -> int:
    """Run every spec whose record is missing (in order), writing each record as it finishes; returns how many ran."""
    from tqdm.auto import tqdm

    todo = [s for s in specs if read_record(s, root) is None]
    print(f"{len(specs) - len(todo)} of {len(specs)} runs already done; {len(todo)} to run", flush=True)
    meta = provenance() if todo else {}
    with tqdm(todo, desc="lm agent map", unit="run", mininterval=5) as bar:
        for spec in bar:
            bar.set_postfix_str(f"{spec.setting}/{spec.phase}/{spec.name}")
            started = time.perf_counter()
            record = runner(spec, start_success=start_success(SETTINGS[spec.setting]))
            record["wall_seconds"] = time.perf_counter() - started
            record["machine"] = meta
            append_run(root, spec.key, record)
    return len(todo)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("tune", "eval", "all"), default="all")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=sorted(SETTINGS))
    parser.add_argument("--arms", nargs="+", default=None, help="default: every arm available now")
    parser.add_argument(
        "--report", action="store_true", help="write the summary from the records; run nothing"
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    arms = args.arms or [name for name, arm in ARMS.items() if arm.available() is None]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    if not args.report:
        if args.phase in ("tune", "all"):
            run_all([s for setting in args.settings for s in tuning_specs(setting, arms)])
        if args.phase in ("eval", "all"):
            run_all([s for setting in args.settings for s in eval_specs(setting, arms)])
    summary = summarize(args.settings, list(ARMS))
    write_record(SUMMARY, summary)
    print(f"wrote {SUMMARY} ({len(summary['records'])} records)")
    if args.report and list(args.settings) == list(SETTINGS):  # the page and README show every setting
        write_page(summary)
        write_readme(summary)
        print("wrote docs/where-credit-pays.md's language-model block and the README's bullet")
    return 0


def summarize(settings: Sequence[str], arms: Sequence[str], root: Path = RUNS) -> dict[str, Any]:
    """The summary: one record per (setting, budget fraction, arm) whose evaluation runs are all there, with the
    paired difference to tuned GRPO (same evaluation seeds) and Holm's adjustment over each setting's comparisons
    (every arm but GRPO at every fraction, the protocol's family)."""
    from mcadvantage.evaluation.stats import holm_adjust, paired_t_test

    out: list[dict[str, Any]] = []
    for name in settings:
        setting = SETTINGS[name]
        rows = []
        for arm in arms:
            if not runs_in(arm, name):
                continue
            try:
                chosen = chosen_points(name, arm, root)
            except ValueError:  # not tuned yet
                continue
            for fraction in FRACTIONS:
                lr, prompts = chosen[fraction]
                runs = [
                    read_record(RunSpec(name, arm, lr, prompts, seed, "eval"), root) for seed in EVAL_SEEDS
                ]
                if any(r is None for r in runs):
                    continue
                rows.append(summary_row(setting, arm, fraction, (lr, prompts), runs))
        _compare_with_grpo(rows, paired_t_test, holm_adjust)
        out += rows
    return {
        "protocol": "docs/lm-agent-map-protocol.md",
        "command": "python benchmarks/lm_agent_map.py --phase all",
        "settings": {n: vars(SETTINGS[n]) for n in settings},
        "grid": [{"lr": lr, "prompts": p} for lr, p in GRID],
        "eval_episodes": EVAL_EPISODES,
        "records": out,
    }


def summary_row(
    setting: Setting, arm: str, fraction: float, point: tuple[float, int], runs: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """One (setting, budget fraction, arm) record of the summary from the arm's evaluation runs at ``point``."""
    lr, prompts = point
    points = [checkpoint(r, fraction) for r in runs]
    success = [p["success"] for p in points]
    down = [collapsed(r["start_success"], p["success"]) for r, p in zip(runs, points, strict=True)]
    return {
        "setting": setting.name,
        "env": setting.env,
        "horizon": setting.horizon,
        "arm": arm,
        "budget_fraction": fraction,
        "budget_tokens": fraction * setting.budget_tokens,
        "chosen": {"lr": lr, "prompts": prompts, "episodes_per_step": prompts * GENERATIONS},
        "tuning_seeds": list(TUNING_SEEDS),
        "tuned_on": arm if ARMS[arm].tuned else "grpo",
        "seeds": list(EVAL_SEEDS),
        "success": success,
        "mean_success": statistics.fmean(success),
        "start_success": runs[0]["start_success"],
        "sampled_tokens": [p["tokens"] for p in points],
        "steps": [p["steps"] for p in points],
        "affordable": all(p["affordable"] for p in points),
        "collapsed": down,
        "collapse_rate": statistics.fmean(down),
        "mc_charged": ARMS[arm].charge_mc,
        # Monte Carlo continuation tokens of each run, up to its last checkpoint (the run stops there); only on the
        # whole budget's rows: the records do not split them by checkpoint.
        "mc_tokens": [r["mc_tokens"] for r in runs]
        if fraction == FRACTIONS[-1] and all("mc_tokens" in r for r in runs)
        else None,
    }


def _compare_with_grpo(rows: list[dict[str, Any]], paired_t_test: Any, holm_adjust: Any) -> None:
    """Add ``vs_grpo`` (paired difference to tuned GRPO at the same fraction: mean, 95% interval, p, Holm p) to every
    non-GRPO row of one setting that has a GRPO row at its fraction."""
    grpo = {r["budget_fraction"]: r for r in rows if r["arm"] == "grpo"}
    compared = [r for r in rows if r["arm"] != "grpo" and r["budget_fraction"] in grpo]
    for row in compared:
        base = grpo[row["budget_fraction"]]["success"]
        test = paired_t_test([a - b for a, b in zip(row["success"], base, strict=True)])
        row["vs_grpo"] = {"mean": test["mean"], "ci95": test["ci95"], "p": test["p"], "n": test["n"]}
    adjusted = holm_adjust([r["vs_grpo"]["p"] for r in compared])
    for row, p in zip(compared, adjusted, strict=True):
        row["vs_grpo"]["p_holm"] = p


# --------------------------------------------------------------------------------------------------------------
# The page's language-model block and the README's bullet (tests tie them to the summary)
# --------------------------------------------------------------------------------------------------------------
README = ROOT / "README.md"
README_BEGIN = "<!-- language-model agent map: generated by benchmarks/lm_agent_map.py --report -->"
README_END = "<!-- end of the language-model agent map -->"
#: The toy's practical winner (docs/where-credit-pays.md): pooled anchor credit keyed by the true state. Here
#: ``anchor_pooled`` keys by the environment's ``state_key``, the true state, so it is that arm's counterpart.
TOY_WINNER = "anchor_pooled"
SETTING_LABELS = {
    "chain_H2": "chain, H = 2 (decisive turns 0-1)",
    "chain_H8": "chain, H = 8 (decisive turns 5-7)",
    "frozenlake_4x4": "FrozenLake 4x4, not slippery (8 moves)",
}


def verdict(row: dict[str, Any]) -> str:
    """``pays`` / ``loses`` (Holm-adjusted p < 0.05 and the 95% interval on one side of 0) or ``level``."""
    v = row.get("vs_grpo")
    if not v:
        return "-"
    if v["p_holm"] < 0.05 and v["ci95"][0] > 0:
        return "pays"
    if v["p_holm"] < 0.05 and v["ci95"][1] < 0:
        return "loses"
    return "level"


def expected_arms(setting: str) -> list[str]:
    """The arms the protocol (with its amendments) runs in ``setting``."""
    return [a for a in ARMS if runs_in(a, setting)]


def toy_summary() -> dict[str, Any]:
    """The tuned toy map's committed summary (``benchmarks/credit_map_tuned.py report``)."""
    from benchmarks.credit_map_tuned import SUMMARY as TOY_SUMMARY

    return json.loads(TOY_SUMMARY.read_text())


def _rows(summary: dict[str, Any], setting: str, fraction: float | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in summary["records"]
        if r["setting"] == setting and (fraction is None or r["budget_fraction"] == fraction)
    ]


def _gap(v: dict[str, Any] | None) -> str:
    return "-" if not v else f"{v['mean']:+.3f} [{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}]"


def _where(rows: Sequence[dict[str, Any]]) -> str:
    return "; ".join(
        f"`{r['arm']}` {_gap(r['vs_grpo'])} ({r['setting']}, {r['budget_fraction']:g}x)" for r in rows
    )


def carry_lines(summary: dict[str, Any], toy: dict[str, Any] | None = None) -> list[str]:
    """The answer's bullets: per setting what is complete, tuned GRPO's end and collapses, the oracle, the arms that
    pay or lose (Holm), and whether the toy's answer carries over; every number from ``summary`` and ``toy`` (the
    tuned toy map's summary, default the committed one)."""
    toy = toy_summary() if toy is None else toy
    rows = [r for r in summary["records"] if r["arm"] != "grpo"]
    lines = []
    for name in summary["settings"]:
        done = {r["arm"] for r in _rows(summary, name)}
        missing = [a for a in expected_arms(name) if a not in done]
        grpo = next((r for r in _rows(summary, name, 1.0) if r["arm"] == "grpo"), None)
        state = "complete" if not missing else f"not finished: {', '.join(f'`{a}`' for a in missing)}"
        head = f"- **{SETTING_LABELS.get(name, name)}** ({state})"
        if grpo is None:
            lines.append(head + ": tuned GRPO's runs are not all in yet.")
            continue
        collapsed = sum(grpo["collapsed"])
        lines.append(
            f"{head}: start {grpo['start_success']:.3f}; tuned GRPO (lr {grpo['chosen']['lr']:g}, "
            f"{grpo['chosen']['episodes_per_step']} episodes a step) ends at {grpo['mean_success']:.3f} at 1x and "
            f"collapses in {collapsed} of {len(grpo['collapsed'])} runs."
        )
    oracle = [r for r in rows if r["arm"] == "oracle_k16"]
    pays = [r for r in rows if verdict(r) == "pays" and r["arm"] != "oracle_k16"]
    loses = [r for r in rows if verdict(r) == "loses"]
    if oracle:
        lines.append(oracle_line(oracle))
    unfinished = [n for n in summary["settings"] if any(a not in {r["arm"] for r in _rows(summary, n)}
                                                          for a in expected_arms(n))]  # fmt: skip
    if unfinished:
        lines.append(
            f"- **Partial**: {', '.join(unfinished)} had not finished when this was generated; their verdicts are "
            "provisional (Holm's family grows with the missing arms, which can only raise adjusted p-values)."
        )
    lines.append(power_line(rows))
    lines.append(f"- Practical arms that beat tuned GRPO (Holm): {_where(pays) if pays else 'none'}.")
    lines.append(f"- Arms behind tuned GRPO (Holm): {_where(loses) if loses else 'none'}.")
    counts = {}
    for r in rows + [r for r in summary["records"] if r["arm"] == "grpo"]:
        if r["budget_fraction"] == 1.0:
            done, total = counts.get(r["arm"], (0, 0))
            counts[r["arm"]] = (done + sum(r["collapsed"]), total + len(r["collapsed"]))
    lines.append(
        "- Collapsed runs at 1x (ending more than 2 SEs below the start), summed over the settings: "
        + ", ".join(f"`{a}` {c}/{n}" for a, (c, n) in counts.items())
        + "."
    )
    lines.append(answer_line(rows, toy))
    return lines


#: How the block and the README name the language-model map's oracle: it does not tune (it runs at tuned GRPO's
#: point) and its Monte Carlo continuations are not charged to its budget.
ORACLE_LABEL = "an untuned, uncharged reference"


def uncharged_ratio(rows: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """The uncharged arm's continuation tokens at the whole budget: the mean per run, and the total over its charged
    sampled tokens (from the runs' records); None when no whole-budget row holds them."""
    full = [r for r in rows if r.get("mc_tokens") and not r["mc_charged"]]
    if not full:
        return None
    mc = [t for r in full for t in r["mc_tokens"]]
    charged = [t for r in full for t in r["sampled_tokens"]]
    return statistics.fmean(mc), sum(mc) / sum(charged)


def oracle_line(oracle: Sequence[dict[str, Any]]) -> str:
    """The bullet on the oracle: what it is, its continuations' tokens, and where it pays."""
    paid = [r for r in oracle if verdict(r) == "pays"]
    cost = uncharged_ratio(oracle)
    tokens = (
        ""
        if cost is None
        else f"; its continuations, {cost[0]:,.0f} tokens a run at 1x, {cost[1]:.0f}x its charged tokens, are not "
        "counted"
    )
    return (
        f"- The oracle (K = 16, {ORACLE_LABEL}: it runs at tuned GRPO's point{tokens}; H = 2 only) against tuned "
        f"GRPO: {_where(oracle)}; it pays (Holm) in {len(paid)} of {len(oracle)} budgets."
    )


def answer_line(rows: Sequence[dict[str, Any]], toy: dict[str, Any]) -> str:
    """The bullet on whether the toy's answer carries over: where the toy's wins lie (``toy``, the tuned map's
    summary, :func:`credit_map_tuned.toy_answer`), and the oracle and the toy's practical winner here."""
    from benchmarks.credit_map_tuned import toy_answer

    oracle = [r for r in rows if r["arm"] == "oracle_k16"]
    pays = [r for r in rows if verdict(r) == "pays" and r["arm"] != "oracle_k16"]
    winner = [r for r in rows if r["arm"] == TOY_WINNER]
    won = [r for r in winner if verdict(r) == "pays"]
    return (
        f"- **Does the toy's answer carry over?** {toy_answer(toy)} Here the oracle ({ORACLE_LABEL}) pays in "
        f"{sum(verdict(r) == 'pays' for r in oracle)} of {len(oracle)} tested budgets, and `{TOY_WINNER}` (keyed by "
        f"the environment's `state_key`, the true state) pays in {len(won)} of {len(winner)}; {len(pays)} practical "
        "(setting, budget) results beat tuned GRPO in all."
    )


#: t quantiles for 11 degrees of freedom (12 paired seeds): two-sided 0.05, and 80% power.
T_975_11, T_80_11 = 2.201, 0.876


def power_line(rows: Sequence[dict[str, Any]]) -> str:
    """The smallest difference 12 paired seeds detect with 80% power (two-sided 0.05, before Holm), from the
    comparisons' own standard errors (95% half-width / t): the median and the range over the comparisons."""
    ses = sorted(
        (r["vs_grpo"]["ci95"][1] - r["vs_grpo"]["ci95"][0]) / 2 / T_975_11 for r in rows if r.get("vs_grpo")
    )
    if not ses:
        return "- Power: no comparison yet."
    mde = [(T_975_11 + T_80_11) * se for se in ses]
    return (
        f"- Power: with {len(EVAL_SEEDS)} paired seeds a comparison detects, with 80% power at two-sided 0.05 (before "
        f"Holm), a difference of {statistics.median(mde):.2f} (median over the {len(mde)} comparisons; "
        f"{mde[0]:.2f}-{mde[-1]:.2f}): the runs differ that much from seed to seed. Smaller effects are not ruled out."
    )


def setting_table(summary: dict[str, Any], setting: str) -> list[str]:
    """Every arm's row at every budget fraction of ``setting``."""
    out = [
        "| budget | arm | chosen (lr, episodes a step) | success | vs tuned GRPO [95% CI] | Holm p | verdict | "
        "collapsed | sampled tokens | steps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fraction in FRACTIONS:
        for r in _rows(summary, setting, fraction):
            v = r.get("vs_grpo")
            arm = f"`{r['arm']}`" + ("" if ARMS[r["arm"]].tuned and r["mc_charged"] else f" ({ORACLE_LABEL})")
            out.append(
                f"| {fraction:g}x | {arm} | {r['chosen']['lr']:g}, {r['chosen']['episodes_per_step']} | "
                f"{r['mean_success']:.3f} | {_gap(v)} | {'-' if not v else format(v['p_holm'], '.3g')} | "
                f"{verdict(r)} | {sum(r['collapsed'])}/{len(r['collapsed'])} | {_tokens(r)} | "
                f"{statistics.fmean(r['steps']):.1f}{'' if r['affordable'] else ' (cannot afford a step)'} |"
            )
    return out


def _tokens(row: dict[str, Any]) -> str:
    """A table's sampled tokens (mean per run); an uncharged arm's continuation tokens beside them."""
    tokens = f"{statistics.fmean(row['sampled_tokens']):.0f}"
    if row["mc_charged"]:
        return tokens
    if row.get("mc_tokens"):
        return f"{tokens} + {statistics.fmean(row['mc_tokens']):.0f} uncharged continuation tokens"
    return f"{tokens} + uncharged continuations (counted only at 1x)"


def render_block(summary: dict[str, Any], toy: dict[str, Any] | None = None) -> str:
    """The page's language-model block (between the markers of ``credit_map_tuned``); ``toy`` is the tuned toy map's
    summary (default the committed one)."""
    from benchmarks.credit_map_tuned import LM_BEGIN, LM_END

    out = [
        LM_BEGIN,
        "",
        "## On a language model, through the trainer",
        "",
        "Generated by `python benchmarks/lm_agent_map.py --report` from the run records "
        "(`benchmarks/results/lm_agent_map_runs/`) into `benchmarks/results/lm_agent_map.json`. Protocol, committed "
        "before the runs, with its dated amendments: [the language-model map's protocol](lm-agent-map-protocol.md). "
        "A tiny tool-calling Llama (2 layers, about 0.1 M parameters) warmed up to a low success, trained by "
        "`VinePPOTrainer` through `environment_factory=` at equal sampled model tokens; every arm but the oracle "
        f"({ORACLE_LABEL}: it runs at tuned GRPO's point and its continuations are not charged) picks its learning "
        f"rate and batch from one grid ({len(GRID_LRS)} rates x {len(GRID_PROMPTS)} batch sizes) "
        f"on held-out seeds, then {len(EVAL_SEEDS)} paired evaluation seeds on {EVAL_EPISODES} held-out episodes; "
        "paired t-test against tuned GRPO, Holm over each setting's arms and budgets.",
        "",
        "### Does the toy's answer carry over?",
        "",
        *carry_lines(summary, toy),
        "",
    ]
    for name in summary["settings"]:
        if _rows(summary, name):
            out += [f"### {SETTING_LABELS.get(name, name)}", "", *setting_table(summary, name), ""]
    out.append(LM_END)
    return "\n".join(out)


def write_page(summary: dict[str, Any]) -> None:
    """Put :func:`render_block` on docs/where-credit-pays.md: between its markers, or after the tuned answer."""
    from benchmarks.credit_map_tuned import LM_BEGIN, LM_END, PAGE

    text = PAGE.read_text()
    block = render_block(summary)
    if LM_BEGIN in text and LM_END in text:
        head, rest = text.split(LM_BEGIN, 1)
        text = head + block + rest.split(LM_END, 1)[1]
    else:
        head, rest = text.split("\n## How to read it", 1)
        text = head + block + "\n\n## How to read it" + rest
    PAGE.write_text(text)


def readme_bullet(summary: dict[str, Any], toy: dict[str, Any] | None = None) -> str:
    """The README's language-model bullet ("What step credit buys"), every number from ``summary`` and ``toy`` (the
    tuned toy map's summary, default the committed one)."""
    carry = carry_lines(summary, toy)
    answer = next(line for line in carry if line.startswith("- **Does the toy"))
    practical = next(line for line in carry if line.startswith("- Practical arms"))
    return (
        "- **On a language model acting in an environment, tuned** ([where credit pays](docs/where-credit-pays.md#"
        "on-a-language-model-through-the-trainer); [protocol](docs/lm-agent-map-protocol.md) committed before the "
        "runs). A tiny tool-calling model trained by `VinePPOTrainer` on multi-turn environments (a chain of "
        "decisive turns at H = 2 and 8, FrozenLake through `mcadvantage.envs`), equal sampled tokens, every arm "
        f"but the oracle ({ORACLE_LABEL}) tuned on held-out seeds, {len(EVAL_SEEDS)} paired seeds. "
        + practical[2:]
        + " "
        + answer[len("- **Does the toy's answer carry over?** ") :]
    )


def write_readme(summary: dict[str, Any]) -> None:
    """Replace the README's language-model bullet (between its markers) with :func:`readme_bullet`."""
    import textwrap

    text = README.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{README} lacks the markers {README_BEGIN!r} ... {README_END!r}.")
    head, rest = text.split(README_BEGIN, 1)
    bullet = textwrap.fill(readme_bullet(summary), width=116, subsequent_indent="  ", break_on_hyphens=False)
    README.write_text(f"{head}{README_BEGIN}\n{bullet}\n{README_END}{rest.split(README_END, 1)[1]}")


if __name__ == "__main__":
    raise SystemExit(main())
