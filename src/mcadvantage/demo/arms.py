"""Arms of a side-by-side comparison on the demo task: one starting policy, one data order, one trainer,
and only the advantage (or the training signal) differs between arms.

Used by the demo (GRPO and VinePPO side by side) and by ``benchmarks/learning_efficiency.py`` (every
arm, several seeds). An arm is named by a short string:

- ``"grpo"``, ``"rloo"``: ``VinePPOTrainer`` with ``advantage_estimator="grpo"`` / ``"rloo"`` (equal to
  TRL's own advantages);
- ``"ppo"``: PPO with a learned critic (``advantage_estimator="gae"``, the critic initialised from the starting
  policy, the paper's gamma = lambda = 1, value clip 0.2, the critic's learning rate the policy's);
- ``"vineppo_k<K>"``: Monte Carlo step values from ``K`` rollouts per state (``"vineppo_k4"``);
- ``"vineppo_k<K>_reuse"``: the same with free samples (``mc_reuse_samples``: the group's other responses and
  rollouts through a state count, leave-one-out, and new rollouts only top a state up to ``K``);
  ``"vineppo_k<K>_variance"``: free samples plus ``mc_allocation="variance"`` (the tokens fixed ``K`` would cost,
  spent where they cut advantage error most);
- ``"<rl arm>_p<P>"``: the same with ``P`` prompts per step instead of the config's
  ``prompts_per_step`` (``"grpo_p19"``: GRPO given more prompts, e.g. VinePPO's sampling budget);
- ``"sft"``: more supervised steps on the warm-up demonstrations, what a user could do instead of RL;
- ``"restem"``: RestEM (the paper's RL-free baseline): rounds of sampling from the current policy,
  keeping the verified-correct responses, and fine-tuning the starting policy on them;
- ``"dpo_plus"``: DPO+ (the paper's other RL-free baseline): responses sampled once from the starting policy,
  (correct, incorrect) pairs per prompt, ``trl.DPOTrainer`` with the NLL term on the chosen response.

Every RL arm is the same ``VinePPOTrainer`` with the same settings (:func:`rl_training_args`); the
estimator is the only difference, so a gap between arms is the advantage's doing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcadvantage.demo.run import DemoConfig, DemoData

__all__ = [
    "ArmSpec",
    "ArmRecord",
    "parse_arm",
    "rl_training_args",
    "run_rl_arm",
    "run_restem_arm",
    "run_dpo_plus_arm",
    "run_sft_arm",
    "load_policy",
    "summarize_curve",
    "train_warmup_policy",
]

_ARM = re.compile(
    r"^(?P<base>grpo|rloo|ppo|vineppo_k(?P<k>[1-9][0-9]*)(?:_(?P<mc>reuse|variance))?)(?:_p(?P<p>[1-9][0-9]*))?$"
)
#: Monte Carlo options of the ``_reuse`` / ``_variance`` arm suffixes (``VinePPOConfig`` fields).
MC_OPTION_SUFFIXES: dict[str, dict[str, Any]] = {
    "reuse": {"mc_reuse_samples": True},
    "variance": {"mc_reuse_samples": True, "mc_allocation": "variance"},
}


@dataclass(frozen=True)
class ArmSpec:
    """What one arm trains with. ``kind`` is ``"rl"``, ``"sft"`` or ``"restem"``; ``prompts_per_step`` None
    means the config's; ``mc_options`` are extra ``VinePPOConfig`` Monte Carlo fields as ``(name, value)``
    pairs."""

    name: str
    kind: str
    advantage_estimator: str | None = None
    num_mc_rollouts: int | None = None
    prompts_per_step: int | None = None
    mc_options: tuple[tuple[str, Any], ...] = ()


@dataclass
class ArmRecord:
    """One point of an arm's learning curve: held-out greedy accuracy after ``step`` optimizer steps,
    with the responses sampled so far (policy responses plus Monte Carlo rollouts, in tokens) and the
    training wall time so far (evaluation excluded)."""

    arm: str
    seed: int
    step: int
    accuracy: float
    sampled_tokens: float
    train_seconds: float


def parse_arm(name: str) -> ArmSpec:
    """The :class:`ArmSpec` for an arm name (see the module docstring for the grammar)."""
    if name in ("sft", "restem", "dpo_plus"):
        return ArmSpec(name, name)
    m = _ARM.match(name)
    if m is None:
        raise ValueError(
            f"unknown arm {name!r}: use 'grpo', 'rloo', 'ppo', 'vineppo_k<K>' (e.g. 'vineppo_k4', with '_reuse' or "
            "'_variance' for the cheaper Monte Carlo options), any of them with '_p<P>' for P prompts per step "
            "(e.g. 'grpo_p19'), 'sft', 'restem' or 'dpo_plus'."
        )
    base = m.group("base")
    estimator = "vineppo" if base.startswith("vineppo") else "gae" if base == "ppo" else base
    k = int(m.group("k")) if m.group("k") else None
    p = int(m.group("p")) if m.group("p") else None
    options = tuple(sorted(MC_OPTION_SUFFIXES[m.group("mc")].items())) if m.group("mc") else ()
    return ArmSpec(
        name, "rl", advantage_estimator=estimator, num_mc_rollouts=k, prompts_per_step=p, mc_options=options
    )


def load_policy(policy_dir: str | Path) -> tuple[Any, Any]:
    """The saved policy and tokenizer in ``policy_dir`` (a warm-up checkpoint)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(policy_dir), AutoTokenizer.from_pretrained(policy_dir)


def train_warmup_policy(
    config: DemoConfig,
    data: DemoData,
    save_dir: str | Path,
    *,
    evaluate: Callable[[Any], float] | None = None,
    eval_every: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[Any, Any, list[tuple[float, float]]]:
    """Build the demo's tiny Llama from ``config.seed``, train it on ``data.warmup`` with the demo's
    warm-up recipe (``config.warmup_*``), save it with its tokenizer to ``save_dir`` and return
    ``(model, tokenizer, curve)``, where ``curve`` holds ``(step, evaluate(model))`` at step 0, every
    ``eval_every`` steps and the last step (empty without ``evaluate``)."""
    import torch

    from mcadvantage.demo.warmup import supervised_warmup
    from mcadvantage.testing import build_char_tokenizer, build_tiny_llama

    torch.manual_seed(config.seed)
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(
        tokenizer,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=256,
        seed=config.seed,
    )
    every = eval_every or max(1, config.warmup_steps // config.warmup_evals)
    curve: list[tuple[float, float]] = []
    if evaluate is not None:
        curve.append((0.0, evaluate(model)))

    def progress(step: int, loss: float) -> None:
        if evaluate is not None and (step % every == 0 or step == config.warmup_steps):
            curve.append((float(step), evaluate(model)))
            model.train()  # evaluation switched it to eval mode
        if on_step is not None:
            on_step(step, loss)

    supervised_warmup(
        model,
        tokenizer,
        data.warmup,
        steps=config.warmup_steps,
        batch_size=config.warmup_batch_size,
        learning_rate=config.warmup_lr,
        seed=config.seed,
        progress=progress,
    )
    model.eval()
    save_dir = Path(save_dir)
    model.save_pretrained(save_dir)
    tokenizer.save_pretrained(save_dir)
    return model, tokenizer, curve


def rl_training_args(config: DemoConfig, arm: ArmSpec, output_dir: str | Path) -> Any:
    """The ``VinePPOConfig`` of an RL arm: the demo's settings, with the arm's estimator, ``K`` and
    prompts per step. Every RL arm shares everything else (seed, learning rate, temperature, batch
    layout per prompt), so the data order is the same: TRL's sampler draws prompts from ``seed``."""
    from mcadvantage import VinePPOConfig

    if arm.kind != "rl":
        raise ValueError(f"rl_training_args: arm {arm.name!r} is not an RL arm.")
    prompts = arm.prompts_per_step or config.prompts_per_step
    return VinePPOConfig(
        output_dir=str(output_dir),
        advantage_estimator=arm.advantage_estimator,
        max_steps=config.rl_steps,
        learning_rate=config.rl_lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=prompts * config.num_generations,
        gradient_accumulation_steps=1,
        num_generations=config.num_generations,
        num_iterations=config.num_iterations,
        num_mc_rollouts=arm.num_mc_rollouts or config.num_mc_rollouts,
        step_segmenter="gsm8k",
        temperature=config.temperature,
        top_p=1.0,
        beta=config.beta,
        max_completion_length=config.max_completion_length,
        # Every rollout of a step in one or two generate calls: at this model size transformers'
        # per-decoding-step overhead, not the arithmetic, is the cost.
        mc_max_batch_sequences=1024,
        # A 1M-parameter model on CPU: no checkpointing (it only costs time here), no bf16.
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=config.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **dict(arm.mc_options),
    )


def run_rl_arm(
    config: DemoConfig,
    arm: ArmSpec,
    policy_dir: str | Path,
    data: DemoData,
    output_dir: str | Path,
    *,
    evaluate: Callable[[Any], float],
    eval_every: int,
    on_record: Callable[[ArmRecord], None] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[Any, list[ArmRecord], list[dict[str, float]]]:
    """Train one RL arm from the policy in ``policy_dir`` for ``config.rl_steps`` steps.

    ``evaluate(model) -> accuracy`` is called after every ``eval_every`` steps and after the last one
    (its time is not counted as training time); each result becomes an :class:`ArmRecord` passed to
    ``on_record``. ``on_step(step, logs)`` sees every step's logged metrics (for progress bars).
    Returns the trained model, the records (without step 0: the caller owns the starting policy's
    evaluation) and the per-step logs.
    """
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from mcadvantage import GSM8KVerifier, VinePPOTrainer

    if eval_every < 1:
        raise ValueError(f"run_rl_arm: eval_every must be >= 1, got {eval_every}.")
    args = rl_training_args(config, arm, output_dir)
    batch = args.per_device_train_batch_size
    records: list[ArmRecord] = []
    logs_out: list[dict[str, float]] = []
    state_box: dict[str, Any] = {"tokens": 0.0, "eval_seconds": 0.0, "start": None}

    class Recorder(TrainerCallback):
        # Evaluates in on_log, not on_step_end: transformers logs a step after its on_step_end, and the
        # record must count that step's sampled tokens.
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            state_box["start"] = time.perf_counter()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not logs or "reward" not in logs:
                return
            step = int(state.global_step)
            # Policy responses (mean completion length x responses per step) plus Monte Carlo rollouts.
            tokens = float(logs.get("completions/mean_length", 0.0)) * batch
            tokens += float(logs.get("mc/generated_tokens", 0.0))
            state_box["tokens"] += tokens
            kept = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
            kept.update(step=float(step), sampled_tokens=tokens)
            logs_out.append(kept)
            if on_step is not None:
                on_step(step, kept)
            if step % eval_every == 0 or step == config.rl_steps:
                train_seconds = time.perf_counter() - state_box["start"] - state_box["eval_seconds"]
                t0 = time.perf_counter()
                accuracy = evaluate(trainer.model)
                trainer.model.train()
                state_box["eval_seconds"] += time.perf_counter() - t0
                record = ArmRecord(arm.name, config.seed, step, accuracy, state_box["tokens"], train_seconds)
                records.append(record)
                if on_record is not None:
                    on_record(record)

    trainer = VinePPOTrainer(
        model=str(policy_dir),
        reward_funcs=GSM8KVerifier(),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in data.rl_set]),
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
        callbacks=[Recorder()],
    )
    trainer.remove_callback(PrinterCallback)  # with disable_tqdm, transformers prints every log dict
    trainer.train()
    model = trainer.model
    model.eval()
    if callable(getattr(trainer.advantage_estimator, "state_dict", None)):
        # An estimator with its own state (the "ppo" arm's critic): keep the final policy and the critic together
        # for the diagnostics (benchmarks/credit_diagnostics.py --critic).
        final = Path(output_dir) / "final"
        trainer.save_model(str(final))
        trainer.save_estimator_state(str(final))
    return model, records, logs_out


def run_sft_arm(
    config: DemoConfig,
    policy_dir: str | Path,
    data: DemoData,
    *,
    steps: int,
    learning_rate: float,
    evaluate: Callable[[Any], float],
    eval_every: int,
    on_record: Callable[[ArmRecord], None] | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[Any, list[ArmRecord]]:
    """More supervised steps: continue training the policy in ``policy_dir`` on the warm-up
    demonstrations (the same flawed data a user has) at a constant ``learning_rate`` for ``steps``
    steps of ``config.warmup_batch_size`` examples, evaluating every ``eval_every`` steps. The arm a
    comparison needs to show that RL beats simply training longer. No response is sampled, so its
    records have ``sampled_tokens = 0``."""
    from mcadvantage.demo.warmup import supervised_warmup

    if eval_every < 1 or steps < 1:
        raise ValueError(f"run_sft_arm: steps and eval_every must be >= 1, got {steps} and {eval_every}.")
    model, tokenizer = load_policy(policy_dir)
    records: list[ArmRecord] = []
    box = {"eval_seconds": 0.0}
    start = time.perf_counter()

    def progress(step: int, loss: float) -> None:
        if on_step is not None:
            on_step(step, loss)
        if step % eval_every == 0 or step == steps:
            train_seconds = time.perf_counter() - start - box["eval_seconds"]
            t0 = time.perf_counter()
            accuracy = evaluate(model)
            model.train()
            box["eval_seconds"] += time.perf_counter() - t0
            record = ArmRecord("sft", config.seed, step, accuracy, 0.0, train_seconds)
            records.append(record)
            if on_record is not None:
                on_record(record)

    # A fresh shuffle of the same demonstrations (seed + 1: not the warm-up's order again), no warm-up
    # or decay phase: a constant learning rate continuing from where the warm-up's schedule ended.
    supervised_warmup(
        model,
        tokenizer,
        data.warmup,
        steps=steps,
        batch_size=config.warmup_batch_size,
        learning_rate=learning_rate,
        warmup_ratio=0.0,
        decay_ratio=0.0,
        seed=config.seed + 1,
        progress=progress,
    )
    model.eval()
    return model, records


def _sample_graded(
    config: DemoConfig, policy: Any, tokenizer: Any, rows: list[dict[str, str]], verifier: Any
) -> tuple[list[Any], float]:
    """The RL-free arms' data: ``config.num_generations`` responses per row at the RL temperature, graded, and
    the tokens sampled (what the arms' records count)."""
    from mcadvantage import TransformersSampler
    from mcadvantage.trainer.self_training import sample_and_grade

    sampler = TransformersSampler(policy, tokenizer, temperature=config.temperature, max_batch_sequences=1024)
    graded = sample_and_grade(
        sampler,
        tokenizer,
        rows,
        verifier,
        num_samples=config.num_generations,
        max_new_tokens=config.max_completion_length,
    )
    tokens = sum(
        len(tokenizer(c, add_special_tokens=False)["input_ids"]) for g in graded for c in g.completions
    )
    return graded, float(tokens)


def run_restem_arm(
    config: DemoConfig,
    policy_dir: str | Path,
    data: DemoData,
    *,
    iterations: int,
    prompts_per_iteration: int,
    epochs: int,
    learning_rate: float,
    evaluate: Callable[[Any], float],
    on_record: Callable[[ArmRecord], None] | None = None,
    steps_per_iteration: int | None = None,
) -> tuple[Any, list[ArmRecord]]:
    """RestEM (Singh et al., 2024) on the demo task, as the paper ran it: each iteration samples
    ``config.num_generations`` responses (temperature ``config.temperature``) to ``prompts_per_iteration``
    new RL prompts from the previous iteration's policy, keeps the verified-correct ones
    (:func:`mcadvantage.trainer.self_training.restem_examples`), and fine-tunes the *starting* policy on them for
    ``epochs`` epochs (the paper resets to the base model every iteration). Evaluated after every
    iteration; a record's ``step`` is the RL step that has consumed as many prompts
    (``steps_per_iteration``, default ``prompts_per_iteration / config.prompts_per_step``), so its curve
    lines up with the RL arms' by data consumed. The paper picks each iteration's checkpoint on a
    validation split; here every iteration is kept (no validation split is held out), which is stated with
    the results."""
    from mcadvantage import GSM8KVerifier
    from mcadvantage.demo.warmup import supervised_warmup
    from mcadvantage.trainer.self_training import restem_examples

    if min(iterations, prompts_per_iteration, epochs) < 1:
        raise ValueError(
            f"run_restem_arm: iterations, prompts_per_iteration and epochs must be >= 1, got {iterations}, "
            f"{prompts_per_iteration} and {epochs}."
        )
    if iterations * prompts_per_iteration > len(data.rl_set):
        raise ValueError(
            f"run_restem_arm: {iterations} x {prompts_per_iteration} prompts exceed the {len(data.rl_set)} RL prompts."
        )
    steps_per_iteration = steps_per_iteration or max(1, prompts_per_iteration // config.prompts_per_step)
    verifier = GSM8KVerifier()
    policy, tokenizer = load_policy(policy_dir)
    records: list[ArmRecord] = []
    tokens = 0.0
    train_seconds = 0.0
    for it in range(iterations):
        t0 = time.perf_counter()
        rows = [
            {"prompt": p.prompt, "answer": p.answer}
            for p in data.rl_set[it * prompts_per_iteration : (it + 1) * prompts_per_iteration]
        ]
        graded, sampled = _sample_graded(config, policy, tokenizer, rows, verifier)
        tokens += sampled
        examples = [(r["prompt"], r["completion"]) for r in restem_examples(graded)]
        policy, _ = load_policy(policy_dir)  # RestEM fine-tunes the starting policy every iteration
        if examples:
            steps = max(1, epochs * len(examples) // config.warmup_batch_size)
            supervised_warmup(
                policy,
                tokenizer,
                examples,
                steps=steps,
                batch_size=config.warmup_batch_size,
                learning_rate=learning_rate,
                warmup_ratio=0.0,
                decay_ratio=0.0,
                seed=config.seed + it,
            )
        train_seconds += time.perf_counter() - t0
        record = ArmRecord(
            "restem", config.seed, (it + 1) * steps_per_iteration, evaluate(policy), tokens, train_seconds
        )
        records.append(record)
        if on_record is not None:
            on_record(record)
    policy.eval()
    return policy, records


def run_dpo_plus_arm(
    config: DemoConfig,
    policy_dir: str | Path,
    data: DemoData,
    output_dir: str | Path,
    *,
    prompts: int,
    pairs_per_prompt: int,
    epochs: int,
    learning_rate: float,
    beta: float,
    evaluate: Callable[[Any], float],
    on_record: Callable[[ArmRecord], None] | None = None,
    step: int | None = None,
) -> tuple[Any, list[ArmRecord]]:
    """DPO+ (Pal et al., 2024) on the demo task, as the paper ran it: ``config.num_generations`` responses
    (temperature ``config.temperature``) to each of the first ``prompts`` RL prompts, sampled once from the
    starting policy; up to ``pairs_per_prompt`` (correct, incorrect) pairs per prompt
    (:func:`mcadvantage.trainer.self_training.preference_pairs`); ``trl.DPOTrainer`` for ``epochs`` epochs with ``beta`` and
    ``loss_type=["sigmoid", "sft"]`` (DPO plus the chosen response's NLL: TRL 1.16 has no DPO-Positive loss, see
    ``docs/howto/restem-dpo-plus.md``). Evaluated once trained; the record's ``step`` is ``step`` (default the RL
    step that has consumed as many prompts)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import DPOConfig, DPOTrainer

    from mcadvantage import GSM8KVerifier
    from mcadvantage.trainer.self_training import preference_pairs

    if min(prompts, pairs_per_prompt, epochs) < 1 or prompts > len(data.rl_set):
        raise ValueError(
            f"run_dpo_plus_arm: prompts ({prompts}, at most {len(data.rl_set)}), pairs_per_prompt "
            f"({pairs_per_prompt}) and epochs ({epochs}) must be >= 1."
        )
    t0 = time.perf_counter()
    policy, tokenizer = load_policy(policy_dir)
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in data.rl_set[:prompts]]
    graded, tokens = _sample_graded(config, policy, tokenizer, rows, GSM8KVerifier())
    pairs = preference_pairs(graded, pairs_per_prompt=pairs_per_prompt, seed=config.seed)
    if pairs:
        args = DPOConfig(
            output_dir=str(output_dir),
            num_train_epochs=epochs,
            per_device_train_batch_size=config.warmup_batch_size,
            learning_rate=learning_rate,
            lr_scheduler_type="constant",
            beta=beta,
            loss_type=["sigmoid", "sft"],
            max_length=256,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            seed=config.seed,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = DPOTrainer(
            model=str(policy_dir),
            args=args,
            train_dataset=Dataset.from_list(pairs),
            processing_class=AutoTokenizer.from_pretrained(policy_dir),
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        policy = trainer.model
    train_seconds = time.perf_counter() - t0
    step = step if step is not None else max(1, prompts // config.prompts_per_step)
    policy.eval()
    record = ArmRecord("dpo_plus", config.seed, step, evaluate(policy), tokens, train_seconds)
    if on_record is not None:
        on_record(record)
    return policy, [record]


def summarize_curve(records: Sequence[ArmRecord]) -> dict[str, float]:
    """Final and best accuracy of one arm's records (sorted by step)."""
    if not records:
        raise ValueError("summarize_curve: no records.")
    ordered = sorted(records, key=lambda r: r.step)
    return {
        "final_accuracy": ordered[-1].accuracy,
        "best_accuracy": max(r.accuracy for r in ordered),
        "sampled_tokens": ordered[-1].sampled_tokens,
        "train_seconds": ordered[-1].train_seconds,
    }
