"""TRL internals are touched in one module only (mcadvantage.trainer.trl_compat), and the supported TRL range is stated
once (trl_compat.SUPPORTED_TRL, which pyproject's dependency must equal)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[2]
COMPAT = REPO / "src" / "mcadvantage" / "trainer" / "trl_compat.py"
# GRPO internals without a leading underscore that are still internals (the vLLM engine holder, the environments).
UNDERSCORE_FREE_INTERNALS = {"vllm_generation", "environment_factories"}


def trl_private_names() -> set[str]:
    """Every `_`-prefixed attribute or method of GRPOTrainer (class and instance) and of TRL's VLLMGeneration."""
    from trl import GRPOTrainer

    root = Path(trl.__file__).parent
    names = {n for n in dir(GRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    for source in (root / "trainer" / "grpo_trainer.py", root / "generation" / "vllm_generation.py"):
        names |= set(re.findall(r"self\.(_[A-Za-z]\w*)", source.read_text(encoding="utf-8")))
    return names


def touched_names(path: Path, banned: set[str]) -> set[str]:
    """Banned names a module reads, writes, overrides (method or class attribute) or passes to getattr & co."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in banned:
            found.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in banned:
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else []
                found |= {t.id for t in targets if isinstance(t, ast.Name) and t.id in banned}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in banned
        ):
            found.add(node.args[1].value)
    return found


def test_the_scan_sees_what_the_compat_module_touches():
    # Guards the scan itself: the compat module does use these, so a scan that found nothing would be broken.
    used = touched_names(COMPAT, trl_private_names())
    assert {"_generate_and_score_completions", "_calculate_rewards", "_metrics", "_last_loaded_step"} <= used


def test_no_other_module_touches_trl_internals():
    banned = trl_private_names() | UNDERSCORE_FREE_INTERNALS
    offenders = {}
    modules = [p for p in (REPO / "src" / "mcadvantage").rglob("*.py") if p != COMPAT]
    modules += sorted((REPO / "examples").glob("*.py")) + sorted((REPO / "benchmarks").glob("*.py"))
    for path in modules:
        names = touched_names(path, banned)
        if names:
            offenders[str(path.relative_to(REPO))] = sorted(names)
    assert not offenders, f"TRL internals used outside mcadvantage/trainer/trl_compat.py: {offenders}"


def test_supported_range_is_stated_once():
    from mcadvantage.trainer.trl_compat import SUPPORTED_TRL

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [trl_dep] = [d for d in deps if re.match(r"trl\b", d)]
    assert trl_dep == f"trl{SUPPORTED_TRL}"
    # No other module states a TRL version range.
    for path in (REPO / "src" / "mcadvantage").rglob("*.py"):
        if path != COMPAT:
            assert not re.search(r"trl\s*[<>=]=?\s*1\.\d", path.read_text(encoding="utf-8")), path


def test_parse_turn_parses_as_trl_parse_response(tmp_path, monkeypatch):
    """``parse_turn`` (cached tool schemas, the context decoded by the Rust decoder) returns what TRL's
    ``parse_response`` returns with the tools and token context GRPO passes it: a tool call (its argument typed by
    the tool's schema), a plain answer, a malformed call, and a turn with no context."""
    from trl.chat_template_utils import parse_response

    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from testbed.agent_env import AgentEnv, make_agent_dataset
    from testbed.agent_policy import build_agent_model, build_agent_tokenizer, tool_call_text

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tok = build_agent_tokenizer()
    args = VinePPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=64, advantage_estimator="grpo",
    )  # fmt: skip
    trainer = VinePPOTrainer(
        model=build_agent_model(tok, max_position_embeddings=256, num_layers=1, hidden_size=32, head_dim=16),
        reward_funcs=None,
        args=args,
        train_dataset=make_agent_dataset("delayed", 2, 2, seed=0),
        processing_class=tok,
        environment_factory=AgentEnv,
    )
    context = tok.apply_chat_template(
        [{"role": "user", "content": "Play. key=1 choices=4 turns=2 state=bad"}],
        tools=trainer._env_tools[None], chat_template=trainer.chat_template, add_generation_prompt=True,
        tokenize=True, return_dict=False,
    )  # fmt: skip
    turns = [
        tool_call_text(2) + "<|im_end|>",
        "done<|im_end|>",
        '<tool_call>\n{"name": "act", "argu<|im_end|>',
    ]
    cases = [(tok(t, add_special_tokens=False)["input_ids"], list(context)) for t in turns]
    cases.append((cases[0][0], []))
    for ids, ctx in cases * 2:  # twice: the cached schemas give the same
        expected = parse_response(tok, ids, prefix=ctx, tools=trainer._env_tools[None])
        assert trainer.agents.parse_turn(ids, ctx) == expected
    assert trainer.agents.parse_turn(*cases[0])["tool_calls"][0]["function"]["arguments"] == {"choice": 2}
