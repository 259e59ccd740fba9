"""The drop-in promise (issue 53): ``VinePPOTrainer(advantage_estimator="grpo")`` with a default ``VinePPOConfig``
trains to the same weights, bit for bit, as ``trl.GRPOTrainer`` with a default ``GRPOConfig``; the two configs
differ only in the fields listed in ``GRPO_DEFAULT_DIFFERENCES``; and an error GRPO raises for an input keeps
GRPO's words under ``VinePPOTrainer``.

"Default" means only what a CPU run must say (``output_dir``, ``use_cpu=True``, which ``GRPOConfig`` needs on a
machine without a bf16 GPU, ``report_to``) and what keeps the run a few seconds (two steps of short responses). bf16,
gradient checkpointing, the learning rate, the group size and everything else are each class's own default.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from mcadvantage import VinePPOConfig, VinePPOTrainer  # noqa: E402
from mcadvantage.testing import build_char_tokenizer, build_tiny_llama  # noqa: E402
from mcadvantage.trainer.config import GRPO_DEFAULT_DIFFERENCES  # noqa: E402

#: What a CPU run needs to say, and what keeps it short; nothing else is set.
CPU_RUN = dict(use_cpu=True, report_to="none", max_steps=2, max_completion_length=8, disable_tqdm=True)


def vowel_share(completions, **kwargs) -> list[float]:
    """Share of vowels per response: a dense reward, so the groups' rewards differ."""
    return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]


def _prompts() -> Dataset:
    return Dataset.from_dict({"prompt": ["1+2=", "3+4=", "5+6=", "7+8="]})


def _train(trainer_cls, config, **settings) -> dict[str, torch.Tensor]:
    tok = build_char_tokenizer(chat_template=False)
    torch.manual_seed(1234)
    model = build_tiny_llama(tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = trainer_cls(
        model=model, reward_funcs=vowel_share, args=config, train_dataset=_prompts(), processing_class=tok
    )
    trainer.train()
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert any(not torch.equal(before[n], after[n]) for n in before), "the run did not move the weights"
    return after


def test_grpo_estimator_with_default_configs_gives_grpotrainers_weights(tmp_path):
    grpo_args = GRPOConfig(output_dir=str(tmp_path / "grpo"), **CPU_RUN)
    vine_args = VinePPOConfig(output_dir=str(tmp_path / "vine"), advantage_estimator="grpo", **CPU_RUN)
    # The defaults a CPU user meets first are GRPO's (bf16 on with use_cpu=True: issue 53 found it off).
    assert vine_args.bf16 is grpo_args.bf16 is True
    grpo = _train(GRPOTrainer, grpo_args)
    vine = _train(VinePPOTrainer, vine_args)
    differing = [name for name in grpo if not torch.equal(grpo[name], vine[name])]
    assert differing == [], f"weights differ after 2 steps: {differing}"
    # The check has power: the old default (bf16 off on CPU) ends elsewhere.
    fp32 = _train(
        VinePPOTrainer,
        VinePPOConfig(
            output_dir=str(tmp_path / "fp32"), advantage_estimator="grpo", **{**CPU_RUN, "bf16": False}
        ),
    )
    assert any(not torch.equal(grpo[name], fp32[name]) for name in grpo)


def _resolved_differences(grpo: GRPOConfig, vine: VinePPOConfig) -> set[str]:
    return {
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if f.init and f.name != "output_dir" and getattr(grpo, f.name) != getattr(vine, f.name)
    }


@pytest.mark.parametrize("estimator", ["grpo", "vineppo", "rloo", "gae", "hybrid", "tree"])
def test_configs_differ_only_in_the_listed_fields(estimator):
    """Every GRPOConfig field, compared after both configs resolve their defaults: the only differences are
    listed (with their reason) in GRPO_DEFAULT_DIFFERENCES, and under "grpo" there is none."""
    grpo = GRPOConfig(output_dir="unused", use_cpu=True)
    vine = VinePPOConfig(output_dir="unused", use_cpu=True, advantage_estimator=estimator)
    differing = _resolved_differences(grpo, vine)
    assert differing <= set(GRPO_DEFAULT_DIFFERENCES), {
        n: (getattr(grpo, n), getattr(vine, n)) for n in differing
    }
    if estimator == "grpo":
        assert differing == set()
    # The declared defaults too: a field whose default VinePPOConfig overrides is listed.
    vine_fields = {f.name: f for f in dataclasses.fields(VinePPOConfig)}
    overridden = {
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if (f.default, f.default_factory)
        != (vine_fields[f.name].default, vine_fields[f.name].default_factory)
    }
    assert overridden <= set(GRPO_DEFAULT_DIFFERENCES), overridden


def test_bf16_is_off_only_where_grpoconfig_is_refused():
    """The one bf16 difference: without use_cpu on a machine with no bf16 GPU GRPOConfig raises, VinePPOConfig
    trains in float32; everywhere GRPOConfig builds, the two agree."""
    from transformers.utils import is_torch_bf16_gpu_available

    if is_torch_bf16_gpu_available():
        pytest.skip("a bf16 GPU: GRPOConfig builds without use_cpu, and both turn bf16 on")
    with pytest.raises(ValueError, match="doesn't support bf16"):
        GRPOConfig(output_dir="unused")
    assert VinePPOConfig(output_dir="unused").bf16 is False
    assert VinePPOConfig(output_dir="unused", bf16=True, use_cpu=True).bf16 is True
    assert VinePPOConfig(output_dir="unused", fp16=False, use_cpu=True).bf16 is True


def test_the_differences_are_rendered_on_the_grpo_to_vineppo_page():
    """The page holds the marker the docs hook replaces with a row per listed field, reason included."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "_config_hook", root / "docs" / "_hooks" / "config_defaults.py"
    )
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (root / "docs" / "howto" / "grpo-to-vineppo.md").read_text("utf-8")
    assert hook.TABLE_MARKER in page
    rendered = hook.render(page)
    for name, reason in GRPO_DEFAULT_DIFFERENCES.items():
        assert f"| `{name}` | {reason} |" in rendered, f"the rendered page lacks the row for {name}"


@pytest.mark.parametrize("estimator", ["vineppo", "gae", "rloo"])
def test_one_generation_is_refused_in_vineppos_words_with_trls_after(estimator):
    """Monte Carlo values need no group, but GRPOTrainer's batching does: refused naming the field, the
    estimator and the fix, and TRL's own words follow. Under "grpo" the message is TRL's alone."""
    with pytest.raises(ValueError) as trl_error:
        GRPOConfig(output_dir="unused", use_cpu=True, num_generations=1, per_device_train_batch_size=8)
    with pytest.raises(
        ValueError,
        match=rf"^num_generations=1 is refused under advantage_estimator='{estimator}'.*num_generations=2",
    ) as ours:
        VinePPOConfig(
            output_dir="unused",
            num_generations=1,
            per_device_train_batch_size=8,
            advantage_estimator=estimator,
        )
    assert str(ours.value).endswith(str(trl_error.value))
    with pytest.raises(ValueError) as grpo_estimator:
        VinePPOConfig(
            output_dir="unused", num_generations=1, per_device_train_batch_size=8, advantage_estimator="grpo"
        )
    assert str(grpo_estimator.value) == str(trl_error.value)


@pytest.mark.parametrize("estimator", ["anchor", "tree", "rloo", "vineppo", "hybrid"])
def test_the_one_generation_refusal_names_only_settings_the_estimator_reads(estimator):
    """Issue 59: the fix for ``num_generations=1`` suggests fewer ``num_mc_rollouts`` only under an estimator that
    reads it; ``"anchor"`` (which refuses that field) was told to lower it."""
    from mcadvantage.estimators import get_advantage_estimator

    with pytest.raises(ValueError) as ours:
        VinePPOConfig(
            output_dir="unused",
            num_generations=1,
            per_device_train_batch_size=8,
            advantage_estimator=estimator,
        )
    reads = "num_mc_rollouts" in get_advantage_estimator(estimator).config_fields
    assert ("num_mc_rollouts" in str(ours.value)) is reads
    assert reads is (estimator in ("vineppo", "hybrid"))


def test_use_cpu_set_after_construction_trains_as_grpoconfig_does(tmp_path, monkeypatch):
    """Issue 59: TRL's test fixture builds the config, then sets ``use_cpu=True``. ``GRPOConfig`` had turned bf16 on
    and trains in bf16; ``VinePPOConfig`` had turned it off (no bf16 GPU, no ``use_cpu`` yet) and trained in float32,
    so two steps ended with other weights. Setting ``use_cpu`` now resolves bf16 as ``GRPOConfig`` does: the same
    bf16, the same mixed precision, the same weights bit for bit."""
    import transformers.training_args as training_args

    settings = {k: v for k, v in CPU_RUN.items() if k != "use_cpu"}
    # Build both configs as on a bf16 GPU (TrainingArguments' own check passes), then move them to the CPU.
    with monkeypatch.context() as patched:
        patched.setattr(training_args, "is_torch_bf16_gpu_available", lambda *a, **k: True)
        grpo_args = GRPOConfig(output_dir=str(tmp_path / "grpo"), **settings)
        vine_args = VinePPOConfig(output_dir=str(tmp_path / "vine"), advantage_estimator="grpo", **settings)
    for args in (grpo_args, vine_args):
        args.use_cpu = True
    assert grpo_args.bf16 is vine_args.bf16 is True
    assert vine_args.mixed_precision == grpo_args.mixed_precision == "bf16"
    grpo = _train(GRPOTrainer, grpo_args)
    vine = _train(VinePPOTrainer, vine_args)
    assert all(torch.equal(grpo[n], vine[n]) for n in grpo), [
        n for n in grpo if not torch.equal(grpo[n], vine[n])
    ]


def test_use_cpu_set_after_construction_keeps_an_explicit_bf16():
    """Only an unset bf16 follows ``use_cpu``: an explicit ``bf16=False`` stays off."""
    args = VinePPOConfig(output_dir="unused", bf16=False)
    args.use_cpu = True
    assert args.bf16 is False and args.mixed_precision == "no"
