"""Gradient quality per unit of cost: each estimator's batch gradient against the reference policy gradient.

    python benchmarks/gradient_quality.py                     # every task below (toys: a minute; demo: ~40 min)
    python benchmarks/gradient_quality.py --tasks toy toy_low # the exact toys only
    python benchmarks/gradient_quality.py --report            # rewrite the table and plot from the stored JSON

Tasks:

* ``toy``: :class:`~mcadvantage.testing.TabularStepPolicy`, 3 one-token steps (a/b/c), success probability set by
  the first two steps only (the third is harmless variation), pass rate ~0.45. The reference is the exact gradient.
* ``toy_low``: the same with a low pass rate (~0.1): most GRPO groups of 8 are all-fail, so GRPO's advantage is
  zero there while per-step values are not (hypothesis H1 of the mechanism issue).
* ``demo``: the shipped demo warm-up policy (1M parameters) on 64 held-out demo prompts, temperature 0.6, the
  GSM8K verifier and segmenter. Reference: 64 prompts x 8 responses x 8 rounds (4,096 responses) with a
  leave-one-out baseline; its split-half cosine and relative standard error are recorded.
* ``demo_plateau_hard``: the plateau policy on held-out prompts with 5 operations only, where its pass rate is low
  and all-fail groups are 3x as common as on the mixed prompts (H1 inside the demo task; docs/regime-protocol.md).
  ``--tasks demo_plateau_hard``.
* ``demo_plateau``: the same on the warm-up trained to a plateau (``mcadvantage/demo/warmup_plateau``, made by
  ``python -m testbed.make_warmup --warmup_schedule plateau``; docs/regime-protocol.md), with the estimators
  of the regime study's arms (``PLATEAU_SPECS``). Not in the default ``--tasks``: ``--tasks demo_plateau``.

Every estimator is measured with the same prompts per repeat (common random numbers). Costs are per batch: sampled
tokens, and ``generated + r x trained`` with ``r`` measured on this machine for the demo policy (transformers
``generate``; recorded) and the same ``r`` for the toys. Results go to ``benchmarks/results/gradient_quality.json``
(written after every estimator, so an interrupted run resumes where it stopped) and
``benchmarks/results/gradient_quality.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the research testbed (testbed/) is a package at the repository's root
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "gradient_quality.json"

#: r for vLLM on GPUs as the paper's throughput suggests (docs/howto/measure-gradient-quality.md): an estimate.
GPU_COST_RATIO = 0.4

TOY_SPECS = [
    "grpo:prompts=4",
    "grpo:prompts=8",
    "grpo:prompts=16",
    "grpo:prompts=32",
    "rloo:prompts=4",
    "vineppo:k=1,prompts=4",
    "vineppo:k=2,prompts=4",
    "vineppo:k=4,prompts=4",
    "vineppo:k=1,reuse,prompts=4",
    "vineppo:k=2,variance,prompts=4",
    "hybrid:budget=0.1,k=2,prompts=4",
    "hybrid:budget=0.5,k=2,prompts=4",
    # Trees (advantage_estimator="tree"): 4 x 2 branching after the first step token; shared prefixes cost once.
    "tree:branching=4x2,depths=0-1,prompts=4",
    "tree:branching=4x2,depths=0-1,prompts=6",
]
DEMO_SPECS = [
    "grpo:prompts=4",
    "grpo:prompts=8",
    "grpo:prompts=16",
    "grpo:prompts=32",
    "rloo:prompts=4",
    "vineppo:k=1,prompts=4",
    "vineppo:k=4,prompts=4",
    "vineppo:k=1,reuse,prompts=4",
    "vineppo:k=2,variance,prompts=4",
    "gae:warmup=40,prompts=4",
    "vineppo:k=4,nowhiten,prompts=4",
    "vineppo:k=16,prompts=4",
    "hybrid:budget=0.1,k=4,prompts=4",
    "hybrid:budget=0.5,k=4,prompts=4",
]


def toy_task(pass_rates: list[float], seed: int) -> Any:
    from testbed.toys import toy_gradient_task

    task, policy = toy_gradient_task(pass_rates, seed=seed)
    return task, policy.exact_gradient(), {"pass_rate": policy.exact_objective().item(), "reference": "exact"}


# The plateau policy (docs/regime-protocol.md): the estimators the regime study's arms use, measured first.
PLATEAU_SPECS = [
    "grpo:prompts=4",
    "grpo:prompts=8",
    "grpo:prompts=16",
    "grpo:prompts=32",
    "rloo:prompts=4",
    "vineppo:k=1,prompts=4",
    "vineppo:k=4,prompts=4",
    "vineppo:k=2,variance,prompts=4",
    "hybrid:budget=0.5,k=4,prompts=4",
    # Added after the first pass (same seed, same prompts per repeat): the cheapest Monte Carlo option, PPO's critic
    # and the tree arm of the learning runs (4 x 2 at token 12) at three batch sizes.
    "vineppo:k=1,reuse,prompts=4",
    "gae:warmup=40,prompts=4",
    "tree:branching=4x2,depths=0-12,prompts=4",
    "tree:branching=4x2,depths=0-12,prompts=6",
    "tree:branching=4x2,depths=0-12,prompts=8",
]
#: policy task -> the study task (``learning_efficiency.TASKS``) whose settings, warm-up schedule and starting policy
#: it measures
DEMO_TASKS = {
    "demo": "demo",
    "demo_plateau": "demo_plateau",
    "slip_plateau": "slip_plateau",
    "demo_plateau_hard": "demo_plateau",
    "long_plateau": "long_plateau",
    "sign_plateau": "sign_plateau",
}
#: confirmation runs (docs/regime-protocol.md, amendments) -> the task whose policy, prompts and reference gradient
#: they reuse; run with their own --seed and --demo_repeats, as the protocol gives them
CONFIRMATIONS = {"long_plateau_followup": "long_plateau"}
DEMO_TASKS.update({name: DEMO_TASKS[source] for name, source in CONFIRMATIONS.items()})
#: what a confirmation run measures: GRPO's budgets on either side of the contenders' costs, and the contenders
CONFIRMATION_SPECS = [
    "grpo:prompts=4",
    "grpo:prompts=8",
    "vineppo:k=1,reuse,prompts=4",
    "hybrid:budget=0.5,k=4,prompts=4",
    "tree:branching=4x2,depths=0-12,prompts=4",
    "tree:branching=4x2,depths=0-12,prompts=6",
]
#: task -> the fewest operations its held-out prompts have (H1 inside the demo task: the plateau policy solves 8% of
#: the 5-operation problems greedily and 27% at temperature 0.6; docs/regime-protocol.md)
MIN_OPERATIONS = {"demo_plateau_hard": 5}


def demo_task(
    prompts: int,
    seed: int,
    threads: int,
    config: Any = None,
    policy_dir: Any = None,
    min_operations: int = 0,
) -> Any:
    """The gradient task of ``config``'s policy (default: the demo's) on its first ``prompts`` held-out prompts with
    at least ``min_operations`` operations; the policy is ``policy_dir``, else the shipped checkpoint of
    ``config.warmup_schedule``."""
    import torch

    from mcadvantage import GSM8KVerifier, TransformersSampler
    from mcadvantage.demo.arms import load_policy
    from mcadvantage.demo.config import DemoConfig, shipped_warmup_dir
    from mcadvantage.evaluation.gradient_instrument import CausalLMOracle, GradientTask
    from mcadvantage.tasks.segmentation import get_segmenter
    from testbed.tasks import held_out_problems

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    config = config or DemoConfig()
    model, tok = load_policy(str(policy_dir or shipped_warmup_dir(config.warmup_schedule)))
    problems = held_out_problems(config, prompts, min_operations=min_operations)
    task = GradientTask(
        oracle=CausalLMOracle(model),
        sampler=TransformersSampler(model, tok, temperature=config.temperature, max_batch_sequences=1024),
        prompt_ids=[tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems],
        prompts=[p.prompt for p in problems],
        rows=[{"answer": p.answer} for p in problems],
        reward_funcs=[GSM8KVerifier()],
        tokenizer=tok,
        segmenter=get_segmenter("gsm8k"),
        max_completion_length=config.max_completion_length,
        policy_model=model,
    )
    policy = (
        "shipped demo warm-up (seed 0)"
        if config.warmup_schedule == "fixed"
        else "shipped plateau warm-up (seed 0)"
    )
    if policy_dir is not None:
        policy = f"{Path(policy_dir).relative_to(ROOT)} (seed 0)"
    return task, model, {"policy": policy, "temperature": config.temperature}


def load_results() -> dict[str, Any]:
    return json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {"tasks": {}}


def save_results(data: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def build_demo_task(name: str, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The gradient task of a policy task (``DEMO_TASKS``) and what describes it."""
    if str(ROOT / "benchmarks") not in sys.path:  # the regime study's tasks are defined beside this file
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from learning_efficiency import UNSHIPPED_STARTS, shared_start_dir, task_config

    study_task = DEMO_TASKS[name]
    # An unshipped start is refused, with its command, until its warm-up is complete and plateaued.
    policy_dir = shared_start_dir(study_task) if study_task in UNSHIPPED_STARTS else None
    task, _, info = demo_task(
        args.demo_prompts,
        args.seed,
        args.threads,
        task_config(study_task, 0),
        policy_dir,
        min_operations=MIN_OPERATIONS.get(name, 0),
    )
    if name in MIN_OPERATIONS:
        info["prompts"] = (
            f"the first {args.demo_prompts} held-out prompts with >= {MIN_OPERATIONS[name]} operations"
        )
    return task, info


def group_stats(task: Any, rounds: int, group: int = 8) -> dict[str, Any]:
    """How often a group of ``group`` responses to one prompt has no signal for a group-relative advantage: every
    prompt of the task sampled ``rounds`` times; the shares of all-fail, all-pass and all-equal groups, and the
    mean reward."""
    import torch

    from mcadvantage.evaluation.gradient_instrument import groups_without_signal

    fail = passed = equal = 0
    rewards_sum, groups = 0.0, 0
    for _ in range(rounds):
        batch = task.sample_group(list(range(len(task.prompt_ids))), group)
        rewards = torch.nan_to_num(batch.all_rewards, nan=0.0).view(-1, group)
        counts = groups_without_signal(rewards)
        equal, fail, passed = equal + counts[0], fail + counts[1], passed + counts[2]
        rewards_sum += float(rewards.sum())
        groups += rewards.shape[0]
    return {
        "rounds": rounds,
        "groups": groups,
        "group_size": group,
        "mean_reward": rewards_sum / (groups * group),
        "all_equal_share": equal / groups,
        "all_fail_share": fail / groups,
        "all_pass_share": passed / groups,
    }


def run_task(name: str, args: argparse.Namespace, data: dict[str, Any]) -> None:
    import torch

    from mcadvantage.evaluation.gradient_instrument import ReferenceGradient, reference_gradient
    from mcadvantage.evaluation.gradient_quality import measure_estimators, parse_estimator_spec

    stored = data["tasks"].setdefault(name, {"records": []})
    if name.startswith("toy"):
        rates = [0.05, 0.3, 0.6, 0.9] if name == "toy" else [0.0, 0.05, 0.15, 0.4]
        task, reference, info = toy_task(rates, args.seed)
        specs, repeats = TOY_SPECS, args.toy_repeats
    else:
        task, info = build_demo_task(name, args)
        specs, repeats = (DEMO_SPECS if name == "demo" else PLATEAU_SPECS), args.demo_repeats
        # The reference (8 MB) is not committed: a fresh clone recomputes it, seeded, when the file is missing. A
        # confirmation run uses the reference of the task it confirms.
        source = CONFIRMATIONS.get(name, name)
        reference_file = RESULTS / f"gradient_quality_{source}_reference.pt"
        if name in CONFIRMATIONS:
            specs = CONFIRMATION_SPECS
            if "reference" not in data["tasks"].get(source, {}) or not reference_file.exists():
                raise SystemExit(
                    f"{name} reuses {source}'s reference gradient, which is missing: run "
                    f"`python benchmarks/gradient_quality.py --tasks {source}` first (it recomputes only what is "
                    "missing)."
                )
            stored["reference"] = dict(data["tasks"][source]["reference"])
            info = {**info, "confirms": source}
        if "reference" not in stored or not reference_file.exists():
            ref = reference_gradient(task, responses_per_round=8, rounds=args.reference_rounds, progress=True)
            torch.save(
                {"gradient": ref.gradient, "standard_error": ref.standard_error},
                reference_file,
            )
            stored["reference"] = {
                "responses": ref.responses,
                "rounds": ref.rounds,
                "split_half_cosine": ref.split_half_cosine,
                "relative_standard_error": ref.relative_standard_error,
                "mean_reward": ref.mean_reward,
                "degenerate_group_share": ref.degenerate_share,
            }
            save_results(data)
        saved = torch.load(reference_file, weights_only=True)
        reference = ReferenceGradient(
            gradient=saved["gradient"],
            standard_error=saved["standard_error"],
            split_half_cosine=stored["reference"]["split_half_cosine"],
            responses=stored["reference"]["responses"],
            rounds=stored["reference"]["rounds"],
        )
    ratio = args.cost_ratio if args.cost_ratio is not None else data["cost_ratio"]["cost_ratio"]
    stored.update(info=info, repeats=repeats, seed=args.seed)
    done = {r["estimator"] for r in stored["records"]}
    todo = [
        s
        for s in (parse_estimator_spec(x, segmenter=task.segmenter, group=8) for x in specs)
        if s.name not in done
    ]

    def keep(record: dict[str, Any]) -> None:
        stored["records"].append(record)
        save_results(data)
        print(
            f"{name}: {record['estimator']}: cosine {record['cosine']:.3f} {record['cosine_ci']}", flush=True
        )

    measure_estimators(
        task, todo, reference, repeats=repeats, cost_ratio=ratio, seed=args.seed, on_record=keep
    )


def ensure_cost_ratio(data: dict[str, Any], args: argparse.Namespace) -> None:
    """Measure r once, for the demo policy on this machine (the toys use the same r)."""
    if "cost_ratio" in data:
        return

    from mcadvantage.evaluation.cost_model import measure_cost_ratio

    _, model, _ = demo_task(args.demo_prompts, args.seed, args.threads)
    data["cost_ratio"] = measure_cost_ratio(model)
    if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module, not run: its sibling
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import machine_info  # where the record was made (commit, versions, CPU, threads)

    data["machine"] = machine_info()
    save_results(data)


def equal_cost_markdown(records: list[dict[str, Any]], ratio: float, label: str) -> str:
    """Each non-GRPO record's cosine next to GRPO's at the same cost (its budgets interpolated in log cost), with
    the cost model recomputed at ``ratio``."""
    from mcadvantage.evaluation.gradient_quality import at_equal_cost

    rows = [{**r, "cost_model": r["sampled_tokens"] + ratio * r["trained_tokens"]} for r in records]
    lines = [
        f"| {e['estimator']} | {e['cosine']:.3f} | {e['baseline_cosine_at_cost']:.3f} | "
        f"{e['cosine'] - e['baseline_cosine_at_cost']:+.3f} |"
        if e["baseline_cosine_at_cost"] is not None
        else f"| {e['estimator']} | {e['cosine']:.3f} | outside GRPO's budgets | |"
        for e in at_equal_cost(rows)
        if not e["estimator"].startswith("grpo_p")
    ]
    return (
        f"At equal cost, r = {ratio:.2f} (GRPO's budgets interpolated in log cost):\n\n"
        f"| {label} | cosine | GRPO at the same cost | difference |\n|---|---:|---:|---:|\n"
        + "\n".join(lines)
        + "\n"
    )


def report(data: dict[str, Any]) -> str:
    from mcadvantage.evaluation.gradient_quality import markdown_table, plot_records

    parts = []
    for name, stored in data["tasks"].items():
        if not stored["records"]:
            continue
        ref = stored.get("reference")
        about = (
            f"Reference: {ref['responses']:,} responses in {ref['rounds']} rounds, split-half cosine "
            f"{ref['split_half_cosine']:.2f}, relative standard error {ref['relative_standard_error']:.2f}."
            if ref
            else "Reference: the exact gradient."
        )
        if ref and "mean_reward" in ref:
            about += (
                f" Its responses' mean reward {ref['mean_reward']:.3f}; all-equal groups of 8 (zero GRPO advantage): "
                f"{ref['degenerate_group_share']:.0%}."
            )
        if "group_stats" in stored:
            g = stored["group_stats"]
            about += (
                f" Groups of {g['group_size']} ({g['groups']:,} sampled, `--group_stats`): mean reward "
                f"{g['mean_reward']:.3f}, all-fail {g['all_fail_share']:.0%}, all-pass {g['all_pass_share']:.0%}."
            )
        if stored.get("info", {}).get("prompts"):
            about += f" Prompts: {stored['info']['prompts']}."
        parts.append(
            f"### {name}\n\n{about} r = {data['cost_ratio']['cost_ratio']:.2f}.\n\n{markdown_table(stored['records'])}\n"
        )
        for ratio in (data["cost_ratio"]["cost_ratio"], GPU_COST_RATIO):
            parts.append(equal_cost_markdown(stored["records"], ratio, "estimator"))
        plot_records(
            stored["records"],
            str(RESULTS / f"gradient_quality_{name}.png"),
            title=f"{name}: gradient quality per unit of cost",
        )
    return "\n".join(parts)


def publish(markdown: str, doc: str | None, name: str) -> None:
    """Print the tables and, with ``--doc``, write them between the ``<!-- {name} results: start/end -->`` markers
    of that Markdown file."""
    print(markdown)
    if doc:
        from mcadvantage.evaluation.report import replace_between_markers

        if not replace_between_markers(doc, name, markdown):
            raise SystemExit(f"--doc {doc}: no '<!-- {name} results: start/end -->' markers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tasks", nargs="+", default=["toy", "toy_low", "demo"], choices=["toy", "toy_low", *DEMO_TASKS]
    )
    parser.add_argument("--toy_repeats", type=int, default=200)
    parser.add_argument("--demo_repeats", type=int, default=30)
    parser.add_argument("--demo_prompts", type=int, default=64)
    parser.add_argument("--reference_rounds", type=int, default=8)
    parser.add_argument("--cost_ratio", type=float, default=None, help="override the measured r")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="only rewrite the tables and plots")
    parser.add_argument(
        "--group_stats",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only sample ROUNDS groups of 8 per prompt of each policy task and store the shares of all-fail, "
        "all-pass and all-equal groups (where GRPO's advantage is zero)",
    )
    parser.add_argument(
        "--doc", default=None, help="also write the tables between the markers of this Markdown file"
    )
    args = parser.parse_args(argv)
    data = load_results()
    if args.group_stats:
        for name in args.tasks:
            if name not in DEMO_TASKS:
                raise SystemExit(
                    f"--group_stats: {name!r} is not a policy task; choose from {sorted(DEMO_TASKS)}."
                )
            task, _ = build_demo_task(name, args)
            stats = group_stats(task, args.group_stats)
            data["tasks"].setdefault(name, {"records": []})["group_stats"] = stats
            save_results(data)
            print(f"{name}: {stats}")
    elif not args.report:
        ensure_cost_ratio(data, args)
        for name in args.tasks:
            run_task(name, args, data)
    publish(report(data), args.doc, "gradient_quality")
    return 0


if __name__ == "__main__":
    sys.exit(main())
