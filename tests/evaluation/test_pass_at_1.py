"""mcadvantage.evaluation.pass_at_1: Pass@1 arithmetic on hand-made scores, grading TRL-style, the result files, and
evaluate_pass_at_1 / evaluate_checkpoint on a tiny offline model on CPU (transformers engine), checked against
scoring the same seeded samples by hand, in one process and (slow) over two gloo processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from mcadvantage.evaluation.pass_at_1 import PassAt1Result, PassAt1Settings, ScoredSamples, score_samples
from mcadvantage.samplers import Continuation

# --------------------------------------------------------------------------------------------------------------
# Settings and the Pass@1 arithmetic (no model)
# --------------------------------------------------------------------------------------------------------------


def test_default_settings_are_the_papers():
    settings = PassAt1Settings()
    assert (settings.num_samples, settings.temperature, settings.top_p) == (16, 0.35, 0.9)
    assert (settings.max_tokens, settings.seed) == (1024, 42)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_samples": 0}, "num_samples=0 is invalid"),
        ({"max_tokens": 0}, "max_tokens=0 is invalid"),
        ({"batch_size": 2.5}, "batch_size=2.5 is invalid"),
        ({"problems_per_call": 0}, "problems_per_call=0 is invalid"),
        ({"temperature": -0.1}, "temperature=-0.1 is invalid"),
        ({"top_p": 0.0}, "top_p=0.0 must be in (0, 1]"),
        ({"seed": "42"}, "seed='42' is invalid"),
    ],
)
def test_invalid_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=f"PassAt1Settings: .*{message[:12]}") as info:
        PassAt1Settings(**kwargs)
    assert message in str(info.value)


def test_pass_at_1_is_the_mean_over_problems_and_samples():
    settings = PassAt1Settings(num_samples=4)
    scores = [[1.0] * i + [0.0] * (4 - i) for i in range(4)]  # problem i: i correct samples of 4
    result = PassAt1Result.from_scores(scores, truncated=2, engine="test", seconds=1.5, settings=settings)
    assert result.pass_at_1 == pytest.approx(6 / 16)
    # Round j (sample j of every problem) is right for the problems i > j.
    assert result.per_round == pytest.approx([3 / 4, 2 / 4, 1 / 4, 0.0])
    assert result.std_over_rounds == pytest.approx(0.3227486, abs=1e-6)  # sample std of the rounds
    assert result.per_problem == pytest.approx([0.0, 0.25, 0.5, 0.75])
    assert (result.num_problems, result.num_samples, result.truncated_ratio) == (4, 4, 2 / 16)
    assert result.settings["num_samples"] == 4
    assert "Pass@1 = 37.50% (+/- 32.27 over 4 rounds) on 4 problems" in result.summary()
    # One sample per problem: no spread over rounds to measure.
    single = PassAt1Result.from_scores(
        [[1.0], [0.0]], truncated=0, engine="t", seconds=0.0, settings=PassAt1Settings(num_samples=1)
    )
    assert (single.pass_at_1, single.std_over_rounds) == (0.5, 0.0)


def test_from_scores_refuses_missing_samples_and_empty_sets():
    settings = PassAt1Settings(num_samples=2)
    with pytest.raises(ValueError, match="num_samples=2 graded samples; got \\[1, 2\\]"):
        PassAt1Result.from_scores([[1.0, 0.0], [1.0]], truncated=0, engine="t", seconds=0, settings=settings)
    with pytest.raises(ValueError, match="evaluation dataset is empty"):
        PassAt1Result.from_scores([], truncated=0, engine="t", seconds=0, settings=settings)


def test_save_writes_metrics_and_one_response_per_problem(tmp_path):
    settings = PassAt1Settings(num_samples=2)
    result = PassAt1Result.from_scores(
        [[1.0, 0.0], [1.0, 1.0]],
        truncated=0,
        engine="t",
        seconds=0.0,
        settings=settings,
        responses=["a", "b"],
    )
    rows = [{"prompt": "p0", "answer": "1"}, {"prompt": "p1", "answer": "2"}]
    path = result.save(tmp_path / "out", "pass_at_1", dataset=rows, model="m", eval_problems="file.jsonl")
    record = json.loads(path.read_text())
    assert path == tmp_path / "out" / "pass_at_1.json"
    assert list(record)[:2] == ["model", "eval_problems"] and record["pass_at_1"] == 0.75
    assert "responses" not in record
    lines = [json.loads(x) for x in (tmp_path / "out" / "pass_at_1_responses.jsonl").read_text().splitlines()]
    assert lines == [
        {"prompt": "p0", "answer": "1", "accuracy": 0.5, "response": "a"},
        {"prompt": "p1", "answer": "2", "accuracy": 1.0, "response": "b"},
    ]
    with pytest.raises(ValueError, match="pass the dataset that was evaluated"):
        result.save(tmp_path, dataset=rows[:1])


# --------------------------------------------------------------------------------------------------------------
# score_samples: sampling requests and TRL-style grading
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from mcadvantage.testing import build_char_tokenizer

    return build_char_tokenizer()


class ScriptedSampler:
    """Problem ``i`` (recognised by its prompt ids) gets ``i`` correct GSM8K answers, then wrong ones."""

    def __init__(self, tokenizer, answers: dict[tuple[int, ...], int]):
        self.tokenizer = tokenizer
        self.answers = answers
        self.requests = []

    def sample(self, requests):
        self.requests.extend(requests)
        out = []
        for r in requests:
            i = self.answers[r.prefix_ids]
            texts = [f" {i}+{i}={2 * i}\n#### {2 * i}" if j < i else " #### -1" for j in range(r.n)]
            ids = [tuple(self.tokenizer(text=t)["input_ids"]) + (self.tokenizer.eos_token_id,) for t in texts]
            out.append([Continuation(t, truncated=j == r.n - 1) for j, t in enumerate(ids)])
        return out


def test_score_samples_grades_every_sample(tokenizer):
    from mcadvantage import GSM8KVerifier

    rows = [{"prompt": f"Problem {i}:", "answer": f"#### {2 * i}"} for i in range(4)]
    answers = {tuple(tokenizer(text=r["prompt"])["input_ids"]): i for i, r in enumerate(rows)}
    sampler = ScriptedSampler(tokenizer, answers)
    # 3 problems per sampler call: two calls, the sampler's order kept across them.
    settings = PassAt1Settings(num_samples=4, max_tokens=32, problems_per_call=3)
    scored = score_samples(sampler, tokenizer, rows, GSM8KVerifier(), settings, context=512)
    assert isinstance(scored, ScoredSamples)
    assert scored.scores == [[1.0] * i + [0.0] * (4 - i) for i in range(4)]
    assert scored.truncated == 4  # the last sample of each problem was marked truncated
    assert scored.responses[1] == " 1+1=2\n#### 2"  # decoded without the EOS token
    assert [(r.n, r.max_tokens) for r in sampler.requests] == [(4, 32)] * 4
    result = PassAt1Result.from_scores(
        scored.scores, truncated=scored.truncated, engine="t", seconds=0, settings=settings
    )
    assert result.pass_at_1 == pytest.approx(6 / 16)


def test_budgets_are_capped_by_the_context_and_prompts_without_room_score_zero(tokenizer):
    from mcadvantage import GSM8KVerifier

    rows = [{"prompt": "Problem 3:", "answer": "#### 6"}, {"prompt": "y" * 40, "answer": "#### 0"}]
    sampler = ScriptedSampler(tokenizer, {tuple(tokenizer(text="Problem 3:")["input_ids"]): 3})
    settings = PassAt1Settings(num_samples=4, max_tokens=32)
    scores, truncated, responses = score_samples(
        sampler, tokenizer, rows, GSM8KVerifier(), settings, context=40
    )
    assert scores == [[1.0, 1.0, 1.0, 0.0], [0.0] * 4]
    assert [r.max_tokens for r in sampler.requests] == [40 - len("Problem 3:")]  # one char = one token
    assert responses[1] == ""  # never sampled


def test_grading_is_trl_style(tokenizer):
    """The verifier gets prompts, completions, completion ids, every other column and the extra kwargs; a
    conversational prompt is tokenised with the chat template and its completions are assistant messages; an
    unscorable (None) reward counts as wrong."""
    calls = []

    def verifier(prompts, completions, completion_ids, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, "ids": completion_ids, **kwargs})
        return [None if k == 0 else 1.0 for k in range(len(completions))]

    class Echo:  # answers every request with "ok" + EOS, recording the prefixes
        prefixes = []

        def sample(self, requests):
            Echo.prefixes += [r.prefix_ids for r in requests]
            ok = tuple(tokenizer(text="ok")["input_ids"]) + (tokenizer.eos_token_id,)
            return [[Continuation(ok, truncated=False)] * r.n for r in requests]

    chat = [{"role": "user", "content": "1+1?"}]
    rows = [{"prompt": chat, "answer": "2", "level": 3}]
    settings = PassAt1Settings(num_samples=2, max_tokens=4)
    scores, _, _ = score_samples(
        Echo(), tokenizer, rows, verifier, settings, context=None, reward_kwargs={"trainer_state": "S"}
    )
    assert scores == [[0.0, 1.0]]
    expected = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    assert Echo.prefixes == [tuple(expected["input_ids"])]
    [call] = calls
    assert call["prompts"] == [chat, chat]
    assert call["completions"] == [[{"role": "assistant", "content": "ok"}]] * 2
    assert call["ids"][0][-1] == tokenizer.eos_token_id
    assert (call["answer"], call["level"], call["trainer_state"]) == (["2", "2"], [3, 3], "S")

    with pytest.raises(RuntimeError, match="returned 1 rewards for 2 completions"):
        score_samples(Echo(), tokenizer, rows, lambda **kw: [1.0], settings, context=None)


# --------------------------------------------------------------------------------------------------------------
# evaluate_pass_at_1 through a tiny trainer, evaluate_checkpoint (CPU, transformers)
# --------------------------------------------------------------------------------------------------------------


def parity_reward(completions, trainer_state=None, **kwargs):
    """1.0 when the response's character codes sum to an odd number: random text gets both outcomes. Needs the
    trainer's reward kwargs."""
    assert trainer_state is not None, "evaluate_pass_at_1 must pass the trainer's reward kwargs"
    return [float(sum(map(ord, c)) % 2) for c in completions]


def _trainer(tiny_model_dir, tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    args = VinePPOConfig(
        output_dir=str(tmp_path / "out"),
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        num_mc_rollouts=2,
        step_segmenter="newline",
        # Training responses sample differently: the evaluation must use its own settings.
        temperature=0.6,
        top_k=3,
        save_strategy="no",
    )
    dataset = Dataset.from_dict(
        {"prompt": [f"{a}+{a}=" for a in range(4)], "answer": [str(2 * a) for a in range(4)]}
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = VinePPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=parity_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
    )
    return trainer, dataset


def test_evaluate_pass_at_1_equals_scoring_the_seeded_samples_by_hand(tiny_model_dir, tmp_path):
    torch = pytest.importorskip("torch")
    from mcadvantage import evaluate_pass_at_1
    from mcadvantage.samplers import TransformersSampler

    trainer, dataset = _trainer(tiny_model_dir, tmp_path)
    settings = PassAt1Settings(num_samples=3, temperature=1.0, top_p=1.0, max_tokens=6, seed=7, batch_size=4)
    trainer.model.train()
    torch.manual_seed(123)
    result = evaluate_pass_at_1(trainer, dataset, parity_reward, settings)
    after = torch.rand(3)
    # The training run's random state and the model's training mode are left as they were.
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))
    assert trainer.model.training

    # The same samples, drawn by hand: torch seeded with the settings' seed, the evaluation's sampling settings
    # (not the training responses' top-k 3 / temperature 0.6), prompts tokenised as the trainer does.
    sampler = TransformersSampler(
        trainer.model, trainer.processing_class, temperature=1.0, top_p=1.0, max_batch_sequences=4
    )
    torch.manual_seed(7)
    rows = [dict(r) for r in dataset]
    by_hand = score_samples(
        sampler,
        trainer.processing_class,
        rows,
        parity_reward,
        settings,
        context=512,
        reward_kwargs={"trainer_state": trainer.state},
    )
    assert result.engine == "transformers"
    assert result.responses == by_hand.responses
    assert result.per_problem == pytest.approx([sum(s) / 3 for s in by_hand.scores])
    assert result.truncated_ratio == by_hand.truncated / 12
    assert 0.0 < result.pass_at_1 < 1.0  # the reward tells the samples apart
    # Same seed, same result; another seed, other samples.
    again = evaluate_pass_at_1(trainer, dataset, parity_reward, settings)
    assert again.responses == result.responses and again.pass_at_1 == result.pass_at_1
    other = evaluate_pass_at_1(
        trainer, dataset, parity_reward, PassAt1Settings(**{**result.settings, "seed": 8})
    )
    assert other.responses != result.responses


def test_evaluate_pass_at_1_refuses_what_it_cannot_do(tiny_model_dir, tmp_path):
    from mcadvantage import evaluate_pass_at_1

    trainer, dataset = _trainer(tiny_model_dir, tmp_path)
    with pytest.raises(ValueError, match="engine='sglang' is invalid"):
        evaluate_pass_at_1(trainer, dataset, parity_reward, engine="sglang")
    with pytest.raises(ValueError, match="engine='vllm' needs a trainer that uses vLLM"):
        evaluate_pass_at_1(trainer, dataset, parity_reward, engine="vllm")
    with pytest.raises(ValueError, match="evaluation dataset is empty"):
        evaluate_pass_at_1(trainer, [], parity_reward)
    with pytest.raises(TypeError, match="needs a mcadvantage.VinePPOTrainer"):
        evaluate_pass_at_1(object(), dataset, parity_reward)


def test_evaluate_checkpoint_with_transformers(tiny_model_dir):
    pytest.importorskip("transformers")
    from mcadvantage import GSM8KVerifier, evaluate_checkpoint

    dataset = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    settings = PassAt1Settings(num_samples=3, max_tokens=6)
    result = evaluate_checkpoint(
        str(tiny_model_dir), dataset, GSM8KVerifier(), settings, engine="transformers"
    )
    assert result.engine == "transformers"
    assert (result.num_problems, result.num_samples, len(result.per_round)) == (2, 3, 3)
    assert result.truncated_ratio == 1.0  # a random tiny model does not stop within 6 tokens
    assert result.pass_at_1 == 0.0
    again = evaluate_checkpoint(
        str(tiny_model_dir), dataset, GSM8KVerifier(), settings, engine="transformers"
    )
    assert again.responses == result.responses  # seeded
    with pytest.raises(ValueError, match="engine='tgi' is invalid"):
        evaluate_checkpoint(str(tiny_model_dir), dataset, GSM8KVerifier(), settings, engine="tgi")


def test_import_stays_free_of_trl_and_vllm():
    code = (
        "import sys, mcadvantage\n"
        "from mcadvantage import PassAt1Settings, evaluate_pass_at_1, evaluate_checkpoint\n"
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------------------------
# Two processes: problems split round-robin, one seed per rank, the same result everywhere
# --------------------------------------------------------------------------------------------------------------

TWO_PROCESS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from mcadvantage import VinePPOConfig, VinePPOTrainer, evaluate_pass_at_1
    from mcadvantage.evaluation.pass_at_1 import PassAt1Settings, score_samples
    from mcadvantage.samplers import TransformersSampler


    def parity_reward(completions, **kwargs):
        return [float(sum(map(ord, c)) % 2) for c in completions]


    model_dir, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    args = VinePPOConfig(
        output_dir=str(out / "run"), report_to="none", use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=2,
        num_generations=2, max_completion_length=8, step_segmenter="newline", save_strategy="no",
    )
    dataset = Dataset.from_dict({"prompt": [f"{a}*{a}=" for a in range(5)], "answer": ["0"] * 5})
    trainer = VinePPOTrainer(
        model=model_dir, reward_funcs=parity_reward, args=args, train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    settings = PassAt1Settings(num_samples=2, temperature=1.0, top_p=1.0, max_tokens=5, seed=11)
    result = evaluate_pass_at_1(trainer, dataset, parity_reward, settings)
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    mine = list(range(rank, len(dataset), world))
    model = trainer.accelerator.unwrap_model(trainer.model)
    sampler = TransformersSampler(model, trainer.processing_class, temperature=1.0, top_p=1.0)
    torch.manual_seed(11 + rank)
    by_hand = score_samples(sampler, trainer.processing_class, [dataset[i] for i in mine], parity_reward,
                            settings, context=512)
    (out / f"rank{rank}.json").write_text(json.dumps({
        "world": world, "mine": mine, "responses": result.responses, "per_problem": result.per_problem,
        "by_hand_responses": by_hand.responses, "by_hand_scores": by_hand.scores,
    }))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # left to exit, gloo can abort a finished run
    """
)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_processes_split_the_problems_and_agree(tiny_model_dir, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    script = tmp_path / "evaluate_two.py"
    script.write_text(TWO_PROCESS_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # accelerate's multi-process launcher starts CPU processes in a gloo group when no GPU is visible.
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(port), str(script), str(tiny_model_dir), str(tmp_path)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["mine"] for r in ranks] == [[0, 2, 4], [1, 3]]
    # Every process gets the whole result ...
    assert ranks[0]["responses"] == ranks[1]["responses"]
    assert ranks[0]["per_problem"] == ranks[1]["per_problem"]
    # ... in dataset order, each problem sampled by its process with that process' seed (11 + rank).
    for r in ranks:
        for k, i in enumerate(r["mine"]):
            assert r["responses"][i] == r["by_hand_responses"][k]
            assert r["per_problem"][i] == pytest.approx(sum(r["by_hand_scores"][k]) / 2)
    assert ranks[0]["responses"][0] != ranks[1]["responses"][1]  # different prompts, different seeds
