"""What the environment adapters cost: a tool call through ``mcadvantage.envs`` (in process, and through a local
OpenEnv server) against a bare ``env.step``, and a Monte Carlo continuation's rebuild by reset and replay.

Usage::

    python benchmarks/env_adapters.py [--rounds 15] [--calls 300] [--rebuilds 20]
                                      [--out benchmarks/results/env_adapters.json]
    python benchmarks/env_adapters.py --quick --out /tmp/env_adapters.json   # a smoke run (numbers meaningless)

The game is ``CliffWalkingSlippery-v1`` (random transitions, no terminal state on the moves used: the agent moves
up and down by the start, so an episode never ends and every call is a step). Arms per call:

* ``bare``: ``gymnasium.make(...).step(action)`` (the same wrappers ``gymnasium.make`` adds for every arm);
* ``adapter``: ``gymnasium_environment(...)().act(name)``: parsing, the step, the board's text, the state key;
* ``openenv``: ``openenv_environment(url)().act(name)`` against ``python -m mcadvantage.envs.openenv_server`` in a
  subprocess on this machine (WebSocket round trip, JSON, the server's adapter).

Rebuilds: ``replay_environment`` of an episode's first H calls (H = 8, 32) with a fresh seed (``_reseed``), in process
and through the server, against H bare steps after a reset.

Each round times a block of ``--calls`` calls per arm (arms in rotated order), then ``--rebuilds`` rebuilds per H and
arm; a round's ratio is one arm's time over the bare arm's in that round, and the reported ratio is the geometric
mean over rounds with a 95% Student-t interval on the log ratios. Writes JSON with the command, machine and load.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._machine import machine_info  # noqa: E402

GAME = "CliffWalkingSlippery-v1"
MOVES = ("up", "down")
ACTIONS = (0, 2)  # CliffWalking: up, down


def _interval(logs: list[float]) -> dict[str, float]:
    from mcadvantage.evaluation.stats import student_t_quantile

    mean = statistics.fmean(logs)
    half = (
        student_t_quantile(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        if len(logs) > 1
        else 0
    )
    return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half)}


def _time_calls(arm: str, envs: dict[str, Any], calls: int) -> float:
    env = envs[arm]
    start = time.perf_counter()
    for i in range(calls):
        if arm == "bare":
            if any(env.step(ACTIONS[i % 2])[2:4]):  # a slip reached the goal: start again (rare)
                env.reset(seed=7)
        else:
            if env.done:
                env.reset(seed=7)
            env.act(MOVES[i % 2])
    return (time.perf_counter() - start) / calls


def _turns(env_cls: Any, h: int) -> tuple[dict[str, Any], list[Any]]:
    from mcadvantage.agents.rebuild import ToolTurn, execute_tool_calls

    for seed in range(1000):  # the first seed whose h calls do not end the episode (a slip into the goal)
        env, row, turns = env_cls(), {"seed": seed}, []
        env.reset(**row)
        for i in range(h):
            env.act(MOVES[i % 2])
            if env.done:
                break
        else:
            break
    env = env_cls()
    env.reset(**row)
    for i in range(h):
        call = {"type": "function", "function": {"name": "act", "arguments": {"action": MOVES[i % 2]}}}
        turns.append(ToolTurn((call,), tuple(execute_tool_calls([call], {"act": env.act}))))
    return row, turns


def _time_rebuilds(arm: str, classes: dict[str, Any], episodes: dict, h: int, n: int) -> float:
    import gymnasium as gym

    from mcadvantage.agents.rebuild import replay_environment

    start = time.perf_counter()
    for k in range(n):
        if arm == "bare":
            env = gym.make(GAME)
            env.reset(seed=7)
            for i in range(h):
                env.step(ACTIONS[i % 2])
        else:
            row, turns = episodes[(arm, h)]
            env = replay_environment(classes[arm], row, turns, reseed=lambda k=k: k)
            if arm == "openenv":
                env._close()
    return (time.perf_counter() - start) / n


def run(rounds: int, calls: int, rebuilds: int, horizons: tuple[int, ...]) -> dict[str, Any]:
    import gymnasium as gym

    from mcadvantage.envs import LocalOpenEnvServer, gymnasium_environment, openenv_environment

    with LocalOpenEnvServer(GAME, start_timeout_s=180) as server:
        classes = {"adapter": gymnasium_environment(GAME), "openenv": openenv_environment(server.url)}
        envs = {"bare": gym.make(GAME), **{arm: cls() for arm, cls in classes.items()}}
        envs["bare"].reset(seed=7)
        for arm in classes:
            envs[arm].reset(seed=7)
        episodes = {(arm, h): _turns(cls, h) for arm, cls in classes.items() for h in horizons}
        per_call: dict[str, list[float]] = {arm: [] for arm in envs}
        per_rebuild: dict[tuple[str, int], list[float]] = {(a, h): [] for a in envs for h in horizons}
        order = list(envs)
        for r in range(rounds):
            rotated = order[r % 3 :] + order[: r % 3]
            for arm in rotated:
                per_call[arm].append(_time_calls(arm, envs, calls))
            for h in horizons:
                for arm in rotated:
                    per_rebuild[(arm, h)].append(_time_rebuilds(arm, classes, episodes, h, rebuilds))
            print(
                f"round {r + 1}/{rounds}",
                {a: f"{v[-1] * 1e6:.1f} us" for a, v in per_call.items()},
                flush=True,
            )
        envs["openenv"]._close()
    out: dict[str, Any] = {
        "per_call_us": {},
        "per_call_ratio_to_bare": {},
        "rebuild_ms": {},
        "rebuild_ratio": {},
    }
    for arm, times in per_call.items():
        out["per_call_us"][arm] = statistics.median(times) * 1e6
        if arm != "bare":
            logs = [math.log(t / b) for t, b in zip(times, per_call["bare"], strict=True)]
            out["per_call_ratio_to_bare"][arm] = _interval(logs)
    for (arm, h), times in per_rebuild.items():
        out["rebuild_ms"][f"{arm}@H={h}"] = statistics.median(times) * 1e3
        if arm != "bare":
            bare = per_rebuild[("bare", h)]
            logs = [math.log(t / b) for t, b in zip(times, bare, strict=True)]
            out["rebuild_ratio"][f"{arm}@H={h}"] = _interval(logs)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rebuilds", type=int, default=20)
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 20 calls and 2 rebuilds (a smoke run)"
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "env_adapters.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.calls, args.rebuilds = 2, 20, 2
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    results = run(args.rounds, args.calls, args.rebuilds, (8, 32))
    from importlib.metadata import version

    import gymnasium
    import openenv  # noqa: F401

    record = {
        "command": "python "
        + " ".join(["benchmarks/env_adapters.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": machine_info(
            gymnasium=gymnasium.__version__,
            openenv_core=version("openenv-core"),
            load_before=load_before,
            load_after=subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        ),  # fmt: skip
        "settings": {"game": GAME, "rounds": args.rounds, "calls": args.calls, "rebuilds": args.rebuilds},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return record


if __name__ == "__main__":
    main()
