"""The demo's settings and data: every knob (:class:`DemoConfig`, one ``--flag`` each), what an arm is (:func:`parse_arm`),
the problem sets (:func:`build_data`), and the shipped warm-up checkpoint those settings select.

The bottom of the demo: the runner (:mod:`mcadvantage.demo.run`), the arms' training (:mod:`mcadvantage.demo.arms`)
and the benchmarks all read their settings from here, and this module imports nothing of theirs.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from mcadvantage.demo.task import ArithmeticProblem, generate_problems, skip_last_solution

__all__ = [
    "ArmSpec",
    "DemoConfig",
    "DemoData",
    "MC_OPTION_SUFFIXES",
    "WARM_CRITIC",
    "ProblemSets",
    "warmup_settings",
    "arm_names",
    "build_data",
    "demonstrations",
    "parse_args",
    "parse_arm",
    "problem_sets",
    "shipped_warmup_dir",
    "usable_shipped_warmup",
    "validate_config",
]


@dataclass
class DemoConfig:
    """Every knob of the demo (each is a ``--flag`` of ``python -m mcadvantage.demo``)."""

    output_dir: str = "demo_output"
    seed: int = 0
    # torch intra-op threads (capped at the machine's CPU count); the demo is sized for 2 cores.
    threads: int = 2
    # model (SPEC: hidden 128, 4 layers, 4 heads of 32 -> 1.06M parameters with the char vocabulary)
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 512
    # data: every set has 2-5 operations; held-out, warm-up and RL prompts are disjoint
    warmup_problems: int = 30000
    flawed_demo_rate: float = 0.6
    # A flawed demonstration forgets the last operation (task.skip_last_solution). The research testbed's
    # StudyConfig (testbed/tasks.py, repository only) adds the studies' other flaws and a harmless variation.
    flawed_demo_min_steps: int = 4
    rl_problems: int = 5000
    eval_problems: int = 600
    curve_problems: int = 200
    min_steps: int = 2
    max_steps: int = 5
    # supervised warm-up
    warmup_steps: int = 800
    warmup_batch_size: int = 32
    warmup_lr: float = 3e-3
    warmup_evals: int = 8
    # How the warm-up ends. "fixed": warmup_steps steps, warmup-stable-decay schedule (the 0.1 demo checkpoint).
    # "plateau": the regime protocol's rule (docs/regime-protocol.md): constant learning rate, validation accuracy
    # every warmup_eval_every steps, stop once warmup_patience evaluations in a row have not beaten the best by more
    # than one binomial SE (or at warmup_max_steps), then warmup_decay_steps of linear decay from the best checkpoint.
    warmup_schedule: str = "fixed"
    validation_problems: int = 600
    warmup_eval_every: int = 100
    warmup_patience: int = 8  # 4 stopped too early (docs/regime-protocol.md, amendments)
    warmup_min_steps: int = 800  # the rule may stop no earlier (0.1's fixed recipe, still rising there)
    warmup_max_steps: int = 6000
    warmup_decay_steps: int = 100
    # RL arms, comma-separated, run one after another from the same starting policy: grpo, rloo, vineppo
    # (K = num_mc_rollouts), vineppo_k<K>, <arm>_p<P> (P prompts per step); see mcadvantage.demo.arms
    arms: str = "grpo,vineppo"
    # Train the warm-up here instead of loading the shipped checkpoint (which only fits the default
    # settings and seed 0; other settings train it anyway, about 5 minutes).
    train_warmup: bool = False
    rl_steps: int = 40
    num_mc_rollouts: int = 4
    num_generations: int = 8
    prompts_per_step: int = 4
    rl_lr: float = 1e-4
    # The paper's sampling temperature (Table 1). Measured here on a weak warm-up policy (seed 1):
    # 0.6 gained +0.04 held-out accuracy where 1.0 gained nothing (too few correct samples to learn from).
    temperature: float = 0.6
    num_iterations: int = 1
    beta: float = 0.0
    max_completion_length: int = 64
    rl_evals: int = 8
    # report
    html_responses: int = 8
    quick: bool = False

    #: The settings that decide the warm-up policy, in the order ``warmup.json`` records them: the shipped checkpoint
    #: is used only when all of them (and the schedule's, :data:`SCHEDULE_FIELDS`) equal the ones it was trained with.
    #: A subclass that adds settings of the data (the research testbed's ``StudyConfig``) lists them here too.
    warmup_fields: ClassVar[tuple[str, ...]] = (
        "seed",
        "hidden_size",
        "num_layers",
        "num_heads",
        "head_dim",
        "intermediate_size",
        "warmup_problems",
        "flawed_demo_rate",
        "flawed_demo_min_steps",
        "eval_problems",
        "min_steps",
        "max_steps",
        "warmup_batch_size",
        "warmup_lr",
        "warmup_schedule",
    )
    #: A ``warmup.json`` written before one of these settings existed was trained with this value of it.
    legacy_warmup_settings: ClassVar[dict[str, Any]] = {"warmup_schedule": "fixed"}

    def warmup_total_steps(self) -> int:
        """The most supervised steps the warm-up can take under its schedule (what a progress bar counts to)."""
        if self.warmup_schedule == "plateau":
            return self.warmup_max_steps + self.warmup_decay_steps
        return self.warmup_steps

    def apply_quick(self) -> None:
        """``--quick``: tiny sizes for tests and smoke runs (about a minute on 2 cores). Every stage
        and output runs, but the numbers are not meaningful: the model is too small and too briefly
        trained to solve the task."""
        self.hidden_size, self.num_layers, self.num_heads, self.head_dim = 64, 2, 2, 32
        self.intermediate_size = 128
        self.warmup_problems, self.rl_problems = 2000, 64
        self.eval_problems, self.curve_problems = 48, 16
        self.warmup_steps, self.warmup_batch_size, self.warmup_evals = 60, 16, 2
        self.validation_problems, self.warmup_eval_every, self.warmup_max_steps = 32, 20, 200
        self.warmup_min_steps = 40
        self.warmup_patience, self.warmup_decay_steps = 2, 10
        self.rl_steps, self.num_mc_rollouts, self.num_generations, self.prompts_per_step = 3, 2, 4, 2
        self.rl_evals, self.html_responses, self.max_completion_length = 1, 3, 48


#: The schedule of the warm-up ``python -m mcadvantage.demo`` starts from (without ``--quick``).
DEMO_WARMUP_SCHEDULE = "plateau"
#: What ``--help`` adds to a flag's default.
FLAG_NOTES = {
    "warmup_schedule": (
        ". 'plateau' starts from the checkpoint shipped in the package (mcadvantage/demo/warmup_plateau); 'fixed' "
        "starts from testbed/warmup_policy of a repository checkout, and where that is absent (an installed "
        "package) trains the warm-up first (about 5 minutes)"
    ),
}


def parse_args(argv: Sequence[str] | None = None) -> DemoConfig:
    """Parse command-line flags into a :class:`DemoConfig`. ``--quick`` first sets the quick sizes;
    flags given explicitly override them."""
    defaults = DemoConfig()
    parser = argparse.ArgumentParser(
        prog="python -m mcadvantage.demo",
        description="Offline CPU demo: supervised warm-up, then VinePPO, on a synthetic GSM8K-format task.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in fields(DemoConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            parser.add_argument(
                f"--{f.name}", action="store_true", help=f"{f.name} (flag)" + FLAG_NOTES.get(f.name, "")
            )
        else:
            shown = f"{DEMO_WARMUP_SCHEDULE} ({value} with --quick)" if f.name == "warmup_schedule" else value
            parser.add_argument(
                f"--{f.name}",
                type=type(value),
                default=None,
                help=f"default: {shown}" + FLAG_NOTES.get(f.name, ""),
            )
    ns = parser.parse_args(argv)
    config = DemoConfig()
    if ns.quick:
        config.apply_quick()
        config.quick = True
    else:
        # The demo starts from the warm-up trained to a plateau (the paper's regime, docs/regime-protocol.md);
        # DemoConfig itself keeps "fixed", the 0.1 recipe the learning-efficiency study and --quick use.
        config.warmup_schedule = DEMO_WARMUP_SCHEDULE
    for f in fields(DemoConfig):
        value = getattr(ns, f.name)
        if isinstance(getattr(defaults, f.name), bool):
            if value:  # a switch given on the command line (--train_warmup); --quick is set above
                setattr(config, f.name, True)
        elif value is not None:
            setattr(config, f.name, value)
    validate_config(config)
    return config


#: The demo's flags that must be >= 1.
_POSITIVE = (
    "warmup_steps", "warmup_batch_size", "rl_steps", "num_mc_rollouts", "prompts_per_step", "eval_problems",
    "curve_problems", "threads", "max_completion_length", "warmup_evals", "rl_evals", "validation_problems",
    "warmup_eval_every", "warmup_patience", "warmup_max_steps", "warmup_min_steps", "warmup_problems", "rl_problems",
    "num_iterations",
)  # fmt: skip


def validate_config(config: DemoConfig) -> None:
    """Reject inconsistent settings with a message naming the flag, its value and the fix."""
    for name in _POSITIVE:
        if getattr(config, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(config, name)}.")
    if config.warmup_schedule not in ("fixed", "plateau"):
        raise SystemExit(f"--warmup_schedule must be 'fixed' or 'plateau', got {config.warmup_schedule!r}.")
    if config.warmup_min_steps > config.warmup_max_steps:
        raise SystemExit(
            f"--warmup_min_steps ({config.warmup_min_steps}) must be <= --warmup_max_steps ({config.warmup_max_steps})."
        )
    if config.warmup_decay_steps < 0:
        raise SystemExit(f"--warmup_decay_steps must be >= 0, got {config.warmup_decay_steps}.")
    if config.html_responses < 0:
        raise SystemExit(f"--html_responses must be >= 0, got {config.html_responses}.")
    if config.num_generations < 2:
        raise SystemExit(
            f"--num_generations must be >= 2 (TRL's GRPOTrainer, which VinePPOTrainer extends, requires "
            f"it), got {config.num_generations}."
        )
    if not 1 <= config.min_steps <= config.max_steps:
        raise SystemExit(
            f"need 1 <= --min_steps <= --max_steps, got {config.min_steps} and {config.max_steps}."
        )
    if not 0.0 <= config.flawed_demo_rate <= 1.0:
        raise SystemExit(f"--flawed_demo_rate must be in [0, 1], got {config.flawed_demo_rate}.")
    if config.flawed_demo_min_steps < 2:
        raise SystemExit(
            f"--flawed_demo_min_steps must be >= 2 (a flawed demonstration keeps at least one line before its "
            f"mistake: it drops the last operation), got {config.flawed_demo_min_steps}."
        )
    if config.curve_problems > config.eval_problems:
        raise SystemExit(
            f"--curve_problems ({config.curve_problems}) must be <= --eval_problems ({config.eval_problems}): "
            "the learning curve is measured on the first curve_problems held-out problems."
        )
    if config.html_responses > config.eval_problems:
        raise SystemExit(
            f"--html_responses ({config.html_responses}) must be <= --eval_problems ({config.eval_problems}): "
            "the page shows responses to held-out problems."
        )
    for name in arm_names(config):
        try:
            parse_arm(name)
        except ValueError as err:
            raise SystemExit(f"--arms: {err}") from None
    if not arm_names(config):
        raise SystemExit("--arms is empty; pass e.g. --arms grpo,vineppo.")
    if not config.temperature > 0:
        raise SystemExit(
            f"--temperature must be > 0 (VinePPO samples from the policy), got {config.temperature}."
        )


def arm_names(config: DemoConfig) -> list[str]:
    """``--arms`` as arm names of :mod:`mcadvantage.demo.arms` (``vineppo`` means ``vineppo_k<K>``)."""
    names = [a.strip() for a in config.arms.split(",") if a.strip()]
    return [f"vineppo_k{config.num_mc_rollouts}" if a == "vineppo" else a for a in names]


_ARM = re.compile(
    r"^(?P<base>grpo|rloo|ppo(?P<warm>_warm(?:_l(?P<lam>0\.[0-9]+|1(?:\.0+)?))?)?|hybrid(?:_b(?P<b>[0-9]{1,3}))?|tree(?:_d(?P<d>[1-9][0-9]*))?"
    r"|vineppo_k(?P<k>[1-9][0-9]*)(?:_(?P<mc>reuse|variance))?)"
    r"(?:_p(?P<p>[1-9][0-9]*))?$"
)

#: Monte Carlo options of the ``_reuse`` / ``_variance`` arm suffixes (``VinePPOConfig`` fields).
MC_OPTION_SUFFIXES: dict[str, dict[str, Any]] = {
    "reuse": {"mc_reuse_samples": True},
    "variance": {"mc_reuse_samples": True, "mc_allocation": "variance"},
}


#: The ``ppo_warm`` arms' critic (``VinePPOConfig`` fields), chosen by the critic study (docs/howto/ppo-critic.md): 30x
#: the demo policy's learning rate (on the grid 1x/10x/30x/100x), and 10 steps that train the critic alone first.
WARM_CRITIC: dict[str, Any] = {"critic_learning_rate": 3e-3, "critic_warmup_steps": 10}


@dataclass(frozen=True)
class ArmSpec:
    """What one RL arm trains with: ``VinePPOTrainer`` with ``advantage_estimator``; ``num_mc_rollouts`` and
    ``prompts_per_step`` None mean the config's; ``mc_options`` are extra ``VinePPOConfig`` fields as ``(name, value)``
    pairs (Monte Carlo options, the hybrid's budget, the tree's depths, the warmed-up critic's settings)."""

    name: str
    advantage_estimator: str
    num_mc_rollouts: int | None = None
    prompts_per_step: int | None = None
    mc_options: tuple[tuple[str, Any], ...] = ()

    @property
    def critic_warmup_steps(self) -> int:
        """Steps that train only the critic before the policy moves (``critic_warmup_steps``; 0 but for ``ppo_warm``),
        on top of the config's ``rl_steps``, which count the policy's steps."""
        return int(dict(self.mc_options).get("critic_warmup_steps", 0))


def parse_arm(name: str) -> ArmSpec:
    """The :class:`ArmSpec` for an arm name. The grammar:

    - ``"grpo"``, ``"rloo"``: ``VinePPOTrainer`` with ``advantage_estimator="grpo"`` / ``"rloo"`` (equal to
      TRL's own advantages);
    - ``"ppo"``: PPO with a learned critic (``advantage_estimator="gae"``, the critic initialised from the starting
      policy, the paper's gamma = lambda = 1, value clip 0.2, the critic's learning rate the policy's);
    - ``"ppo_warm"``: the same with the critic study's critic (:data:`WARM_CRITIC`: learning rate 3e-3, 10 critic-only
      steps on top of the ``rl_steps`` policy steps); ``"ppo_warm_l<L>"``: that with ``gae_lambda=L``;
    - ``"vineppo_k<K>"``: Monte Carlo step values from ``K`` rollouts per state (``"vineppo_k4"``);
    - ``"vineppo_k<K>_reuse"``: the same with free samples (``mc_reuse_samples``: the group's other responses and
      rollouts through a state count, leave-one-out, and new rollouts only top a state up to ``K``);
      ``"vineppo_k<K>_variance"``: free samples plus ``mc_allocation="variance"`` (the tokens fixed ``K`` would cost,
      spent where they cut advantage error most);
    - ``"hybrid"``, ``"hybrid_b<B>"``: GRPO's advantage plus Monte Carlo step credit (``K`` from the config) in
      degenerate groups, with the library's default budget or ``B`` percent extra sampled tokens (``"hybrid_b50"``:
      ``hybrid_budget=0.5``);
    - ``"tree"``, ``"tree_d<D>"``: each group drawn as a tree (``tree_branching`` [4, 2], the library's default depth
      or a branch point at token ``D``: ``"tree_d12"`` is ``tree_depths=[0, 12]``), step credit from its leaves;
    - ``"<rl arm>_p<P>"``: the same with ``P`` prompts per step instead of the config's
      ``prompts_per_step`` (``"grpo_p19"``: GRPO given more prompts, e.g. VinePPO's sampling budget).

    The studies' arms without RL (``sft``, ``restem``, ``dpo_plus``) are the research testbed's
    (``testbed/arms.py``, repository only)."""
    m = _ARM.match(name)
    if m is None:
        raise ValueError(
            f"unknown arm {name!r}: use 'grpo', 'rloo', 'ppo', 'ppo_warm' or 'ppo_warm_l<L>' (a warmed-up critic, GAE "
            "lambda L), 'vineppo_k<K>' (e.g. 'vineppo_k4', with '_reuse' or '_variance' for the cheaper Monte Carlo "
            "options), 'hybrid' or 'hybrid_b<B>' (B percent extra tokens), 'tree' or 'tree_d<D>' (branching at token "
            "D), any of them with '_p<P>' for P prompts per step (e.g. 'grpo_p19')."
        )
    base = m.group("base")
    family = re.match(r"[a-z]+", base).group(0)  # "vineppo_k4_reuse" -> "vineppo", "tree_d12" -> "tree"
    estimator = "gae" if family == "ppo" else family
    k = int(m.group("k")) if m.group("k") else None
    p = int(m.group("p")) if m.group("p") else None
    options = tuple(sorted(MC_OPTION_SUFFIXES[m.group("mc")].items())) if m.group("mc") else ()
    if m.group("b") is not None:
        options = (("hybrid_budget", int(m.group("b")) / 100),)
    if m.group("d") is not None:
        options = (("tree_depths", (0, int(m.group("d")))),)
    if m.group("warm") is not None:
        warm = {**WARM_CRITIC, **({"gae_lambda": float(m.group("lam"))} if m.group("lam") else {})}
        options = tuple(sorted(warm.items()))
    return ArmSpec(name, estimator, num_mc_rollouts=k, prompts_per_step=p, mc_options=options)


@dataclass
class DemoData:
    """The demo's problem sets. ``warmup`` holds ``(prompt, demonstration)`` pairs (some flawed, see
    ``flawed``); the other sets are problems whose prompts appear in no other set."""

    eval_set: list[ArithmeticProblem]
    warmup: list[tuple[str, str]]
    flawed: int
    rl_set: list[ArithmeticProblem]
    # For the plateau stop rule only: disjoint from every other set, so the stopping decision never sees the
    # held-out problems the arms are scored on.
    validation_set: list[ArithmeticProblem] = field(default_factory=list)


class ProblemSets(NamedTuple):
    """The demo's four problem sets, generated from ``config.seed`` (:func:`problem_sets`); no prompt is in two."""

    eval_set: list[ArithmeticProblem]
    warmup_set: list[ArithmeticProblem]
    rl_set: list[ArithmeticProblem]
    validation_set: list[ArithmeticProblem]


def problem_sets(config: DemoConfig) -> ProblemSets:
    """Generate the held-out, warm-up, RL and validation problems, each from its own seed derived from
    ``config.seed``, with disjoint prompts."""
    kwargs = {"min_steps": config.min_steps, "max_steps": config.max_steps}
    eval_set = generate_problems(config.eval_problems, seed=1_000_003 * (config.seed + 1), **kwargs)
    taken = {p.prompt for p in eval_set}
    warmup_set = generate_problems(
        config.warmup_problems, seed=2_000_003 * (config.seed + 1), exclude=taken, **kwargs
    )
    taken |= {p.prompt for p in warmup_set}
    rl_set = generate_problems(
        config.rl_problems, seed=3_000_003 * (config.seed + 1), exclude=taken, **kwargs
    )
    taken |= {p.prompt for p in rl_set}
    # Drawn after the other sets, from its own seed: adding it changed none of them.
    validation_set = generate_problems(
        config.validation_problems, seed=6_000_007 * (config.seed + 1), exclude=taken, **kwargs
    )
    return ProblemSets(eval_set, warmup_set, rl_set, validation_set)


#: ``(problem, the flaw's own random generator) -> the flawed solution``, or None when the problem cannot have the
#: mistake (its demonstration then stays correct).
FlawWriter = Callable[[ArithmeticProblem, random.Random], str | None]


def demonstrations(
    config: DemoConfig, problems: Sequence[ArithmeticProblem], write_flaw: FlawWriter
) -> tuple[list[tuple[str, str]], int]:
    """The warm-up's ``(prompt, demonstration)`` pairs for ``problems`` and how many are flawed: a problem with
    ``>= config.flawed_demo_min_steps`` operations gets ``write_flaw``'s solution at ``config.flawed_demo_rate``
    (the demo's is :func:`~mcadvantage.demo.task.skip_last_solution`), every other one its correct solution."""
    rng = random.Random(4_000_003 * (config.seed + 1))
    # The flaw's own generator, so a flaw that draws (the testbed's slips) leaves the pattern of flawed ones alone.
    flaw_rng = random.Random(5_000_003 * (config.seed + 1))
    pairs: list[tuple[str, str]] = []
    flawed = 0
    for p in problems:
        # rng.random() is drawn for every problem so the flaw pattern does not depend on min_steps.
        flaw = rng.random() < config.flawed_demo_rate and p.num_steps >= config.flawed_demo_min_steps
        solution = (write_flaw(p, flaw_rng) or p.solution) if flaw else p.solution  # None: left correct
        flawed += solution != p.solution
        pairs.append((p.prompt, solution))
    return pairs, flawed


def build_data(config: DemoConfig) -> DemoData:
    """Generate the problem sets (:func:`problem_sets`) and the warm-up demonstrations (:func:`demonstrations`),
    a fraction ``config.flawed_demo_rate`` of those with ``>= config.flawed_demo_min_steps`` operations forgetting
    the last operation."""
    sets = problem_sets(config)
    warmup, flawed = demonstrations(
        config, sets.warmup_set, lambda problem, _rng: skip_last_solution(problem)
    )
    return DemoData(
        eval_set=sets.eval_set,
        warmup=warmup,
        flawed=flawed,
        rl_set=sets.rl_set,
        validation_set=sets.validation_set,
    )


# Besides DemoConfig.warmup_fields, per schedule, the settings that end it (they decide the warm-up too).
SCHEDULE_FIELDS = {
    "fixed": ("warmup_steps",),
    "plateau": (
        "validation_problems",
        "warmup_eval_every",
        "warmup_patience",
        "warmup_max_steps",
        "warmup_decay_steps",
    ),
}


def warmup_settings(config: DemoConfig) -> dict[str, Any]:
    """The settings that decide ``config``'s warm-up policy (what ``warmup.json`` records and is matched on):
    ``config.warmup_fields``, then its schedule's."""
    names = config.warmup_fields + SCHEDULE_FIELDS[config.warmup_schedule]
    return {name: getattr(config, name) for name in names}


#: The demo's warm-up checkpoint of each schedule (seed 0, default settings). The plateau one, the demo's default
#: start, ships in the package. The fixed one (the 0.1 demo's, which the first studies start from) is kept out of the
#: wheel, in the research testbed of a repository checkout (``testbed/warmup_policy``, beside ``src/``); where that
#: is absent (an installed package), ``--warmup_schedule fixed`` trains it instead, as for any other settings.
SHIPPED_WARMUP_DIRS = {
    "fixed": Path(__file__).resolve().parents[3] / "testbed" / "warmup_policy",
    "plateau": Path(__file__).resolve().parent / "warmup_plateau",
}


def shipped_warmup_dir(schedule: str = "fixed") -> Path:
    """Where the demo's warm-up checkpoint for ``schedule`` is kept (trained by ``python -m testbed.make_warmup
    [--warmup_schedule plateau]`` in a repository checkout, seed 0, default settings; see
    :data:`SHIPPED_WARMUP_DIRS`). The directory may be absent: the fixed one is not in the installed package."""
    if schedule not in SHIPPED_WARMUP_DIRS:
        raise ValueError(
            f"shipped_warmup_dir: schedule must be one of {sorted(SHIPPED_WARMUP_DIRS)}, got {schedule!r}."
        )
    return SHIPPED_WARMUP_DIRS[schedule]


def usable_shipped_warmup(config: DemoConfig) -> dict[str, Any] | None:
    """The shipped checkpoint's ``warmup.json`` when it matches ``config``'s warm-up settings, else None."""
    meta_path = shipped_warmup_dir(config.warmup_schedule) / "warmup.json"
    if config.train_warmup or config.quick or not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    recorded = {**config.legacy_warmup_settings, **meta["config"]}
    if any(recorded.get(name) != value for name, value in warmup_settings(config).items()):
        return None
    return meta
