"""Training through the gymnasium adapter on slippery FrozenLake with the tiny offline tool-calling model:
``"grpo"`` equals ``trl.GRPOTrainer`` bit for bit on the same adapter, and ``"vineppo"`` trains with every Monte
Carlo continuation rebuilt in exactly its prefix's state (checked against gymnasium itself) before its fresh
randomness.

A random model almost never writes a well-formed tool call, so each turn is, with probability 1/2 (drawn from torch's
global generator, the same draws for both trainers), a call ``act(<random move>)``, and otherwise the model's own
sample; the continuations come from a scripted sampler that moves or answers. Everything else (TRL's tool loop, the
adapter, rewards, Monte Carlo rebuilds, the loss) is the real code path.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
gym = pytest.importorskip("gymnasium")

from _helpers import TINY_CPU_SETTINGS  # noqa: E402

from mcadvantage.envs import environment_dataset, gymnasium_environment  # noqa: E402
from mcadvantage.samplers.base import Continuation  # noqa: E402
from mcadvantage.testing import IM_END, build_tiny_llama, build_tool_calling_tokenizer  # noqa: E402

MOVES = ("left", "down", "right", "up")
FrozenLake = gymnasium_environment("FrozenLake-v1", env_kwargs={"is_slippery": True})
PROMPT = "Reach G. Board:\n"  # short: the character tokenizer spends a token per character

SETTINGS = TINY_CPU_SETTINGS | dict(
    num_generations=2,
    max_completion_length=160,
    max_tool_calling_iterations=4,
    max_steps=2,
    learning_rate=0.05,
    logging_steps=1,
    disable_tqdm=True,
)


def move_text(move: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'act', 'arguments': {'action': move}})}\n</tool_call>{IM_END}"


def moved(environments, **kwargs) -> list[float]:
    """A dense reward so that groups differ: the moves made, plus where on the board the episode ended."""
    return [len(env._actions) + env.state_key / 16 for env in environments]


@pytest.fixture
def scripted_moves(monkeypatch):
    """Each turn of both trainers: with probability 1/2 a well-formed ``act`` call with a random move, else the
    model's own sample (torch's generator: both trainers draw the same)."""
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_single_turn

    def turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok = self.processing_class
        moves = [
            MOVES[int(torch.randint(0, 4, ()))] if bool(torch.rand(()) < 0.5) else None for _ in prompt_ids
        ]
        rows = [i for i, m in enumerate(moves) if m is None]
        sampled = original(self, [prompt_ids[i] for i in rows], None, {}, 1)[0] if rows else []
        by_row = dict(zip(rows, sampled, strict=True))
        return [
            tok(move_text(m), add_special_tokens=False)["input_ids"] if m else list(by_row[i])
            for i, m in enumerate(moves)
        ], None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", turn)


def _trainer(trainer_cls, config_cls, tmp_path, environment, extra=None, **kwargs):
    tok = build_tool_calling_tokenizer()
    im_end = tok.convert_tokens_to_ids(IM_END)
    model = build_tiny_llama(
        tok, hidden_size=64, num_layers=1, num_heads=2, head_dim=32, intermediate_size=128,
        max_position_embeddings=2048,
    )  # fmt: skip
    args = config_cls(
        output_dir=str(tmp_path / trainer_cls.__name__),
        generation_kwargs={"sequence_bias": [[[im_end], 3.0]]},  # the model's own turns stay short
        **SETTINGS,
        **(extra or {}),
    )
    return trainer_cls(
        model=model,
        args=args,
        processing_class=tok,
        reward_funcs=[moved],
        environment_factory=environment,
        train_dataset=environment_dataset(environment, 2, seed=0, prompt=PROMPT),
        **kwargs,
    )


def _logged(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


def _environment(kind, request):
    """The in-process adapter, or the client class of a real OpenEnv server (a subprocess) serving the same game."""
    if kind == "gymnasium":
        return FrozenLake
    from mcadvantage.envs import openenv_environment

    server = request.getfixturevalue("frozen_lake_server")
    return openenv_environment(server.url, state_key_field="key", name="FrozenLakeV1")


KINDS = ["gymnasium", pytest.param("openenv", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind", KINDS)
def test_grpo_equals_grpo_trainer_bit_for_bit_on_frozen_lake(
    scripted_moves, tmp_path, monkeypatch, request, kind
):
    from trl import GRPOConfig, GRPOTrainer

    from mcadvantage import VinePPOConfig, VinePPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    environment = _environment(kind, request)
    theirs = _trainer(GRPOTrainer, GRPOConfig, tmp_path, environment)
    initial = {n: p.detach().clone() for n, p in theirs.model.named_parameters()}
    theirs.train()
    ours = _trainer(VinePPOTrainer, VinePPOConfig, tmp_path, environment, {"advantage_estimator": "grpo"})
    ours.train()
    assert ours.reward_func_names == ["moved", "FrozenLakeV1"]  # get_reward: the environment's return
    assert theirs.state.global_step == ours.state.global_step == 2
    calls = _logged(theirs, "tools/call_frequency")
    assert calls == _logged(ours, "tools/call_frequency") and sum(calls) > 0
    for key in ("reward", "reward_std", "loss", "tools/failure_frequency", "rewards/FrozenLakeV1/mean"):
        assert _logged(theirs, key) == _logged(ours, key), key
    moved = [n for n, p in theirs.model.named_parameters() if not torch.equal(p, initial[n])]
    assert moved, "training moved no weight: the comparison would be vacuous"
    for (name, want), (_, got) in zip(
        theirs.model.named_parameters(), ours.model.named_parameters(), strict=True
    ):
        assert torch.equal(want, got), name


class MovesOrAnswers:
    """The continuations' engine (a :class:`~mcadvantage.samplers.base.Sampler`): each turn moves at random with
    probability 2/3, else answers; its own generator."""

    def __init__(self, tokenizer, seed: int = 0):
        self.tok, self.rng = tokenizer, torch.Generator().manual_seed(seed)

    def sample(self, requests):
        out = []
        for request in requests:
            turns = []
            for _ in range(request.n):
                pick = int(torch.randint(0, 6, (), generator=self.rng))
                text = move_text(MOVES[pick]) if pick < 4 else f"done{IM_END}"
                ids = self.tok(text, add_special_tokens=False)["input_ids"][: request.max_tokens]
                turns.append(Continuation(tuple(ids), truncated=ids[-1:] != [self.tok.eos_token_id]))
            out.append(turns)
        return out


def recorded(base):
    """``base`` recording, at every rebuild's reseed, what the rebuild reached: the episode's seed, its moves so far
    (action indices), the state key and, in process, the random generator's state."""

    class Recorded(base):
        rebuilds: list = []

        def _reseed(self, seed: int) -> None:
            moves = [a if isinstance(a, int) else MOVES.index(a["action"]) for a in self._actions]
            inner = getattr(self, "_env", None)
            stream = inner.unwrapped.np_random.bit_generator.state if inner is not None else None
            Recorded.rebuilds.append((self._seed, moves, int(self.state_key), stream, seed))
            super()._reseed(seed)

    return Recorded


@pytest.mark.parametrize("kind", KINDS)
def test_vineppo_continuations_start_from_exactly_their_prefix_state(
    scripted_moves, tmp_path, monkeypatch, request, kind
):
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    Recorded = recorded(_environment(kind, request))
    tok = build_tool_calling_tokenizer()
    extra = {"advantage_estimator": "vineppo", "num_mc_rollouts": 2}
    trainer = _trainer(
        VinePPOTrainer, VinePPOConfig, tmp_path, Recorded, extra, mc_sampler=MovesOrAnswers(tok)
    )
    trainer.train()
    assert trainer.state.global_step == 2 and _logged(trainer, "mc/rollouts")
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    rebuilds = Recorded.rebuilds
    assert rebuilds and any(moves for _, moves, *_ in rebuilds)  # some states lie after moves
    for seed, moves, key, stream, _ in rebuilds:
        env = gym.make("FrozenLake-v1", is_slippery=True)  # the episode's own path, without the adapter
        env.reset(seed=seed)
        for move in moves:
            env.step(move)
        assert int(env.unwrapped.s) == key
        if stream is not None:  # in process the random stream is visible too: the replay reproduced it
            assert env.unwrapped.np_random.bit_generator.state == stream
    assert len({fresh for *_, fresh in rebuilds}) == len(rebuilds)  # every continuation its own randomness


def _check_rebuilds_exact(rebuilds) -> None:
    """Every rebuild reached its episode's own path (gymnasium replayed without the adapter), each reseeded anew."""
    assert rebuilds and any(moves for _, moves, *_ in rebuilds)  # some states lie after moves
    for seed, moves, key, stream, _ in rebuilds:
        env = gym.make("FrozenLake-v1", is_slippery=True)
        env.reset(seed=seed)
        for move in moves:
            env.step(move)
        assert int(env.unwrapped.s) == key
        if stream is not None:  # in process the random stream is visible too: the replay reproduced it
            assert env.unwrapped.np_random.bit_generator.state == stream
    assert len({fresh for *_, fresh in rebuilds}) == len(rebuilds)  # every continuation its own randomness


@pytest.mark.slow
def test_vineppo_trains_against_a_server_with_fewer_sessions_than_batch_times_k(
    scripted_moves, tmp_path, monkeypatch, small_frozen_lake_server
):
    """Issue 59: a server that allows 3 sessions, a batch of 4 episodes and K = 2 (8 continuations per state, 4
    batch rows): the episodes and the continuations share ``env_max_sessions=3`` sessions, each continuation
    rebuilt by replay on a session as one frees, so training runs (it failed with the server's capacity error),
    every continuation starts from exactly its prefix's state with its own fresh randomness, and no more than 3
    sessions are ever open."""
    from conftest import SMALL_SERVER_SESSIONS

    from mcadvantage import VinePPOConfig, VinePPOTrainer
    from mcadvantage.envs import openenv_environment

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    Remote = openenv_environment(
        small_frozen_lake_server.url, state_key_field="key", name="FrozenLakeV1", message_timeout_s=20
    )
    Recorded = recorded(Remote)
    most = []
    lease = Remote._pool.lease

    def counted(owner, opener):
        out = lease(owner, opener)
        most.append(Remote._pool.open_sessions())
        return out

    monkeypatch.setattr(Remote._pool, "lease", counted)
    extra = {
        "advantage_estimator": "vineppo",
        "num_mc_rollouts": 2,
        "env_max_sessions": SMALL_SERVER_SESSIONS,
    }
    tok = build_tool_calling_tokenizer()
    trainer = _trainer(
        VinePPOTrainer, VinePPOConfig, tmp_path, Recorded, extra, mc_sampler=MovesOrAnswers(tok)
    )
    assert SETTINGS["per_device_train_batch_size"] * extra["num_mc_rollouts"] > SMALL_SERVER_SESSIONS
    try:
        trainer.train()
    finally:
        Remote._close_sessions()
    assert trainer.state.global_step == 2 and _logged(trainer, "mc/rollouts")
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    _check_rebuilds_exact(Recorded.rebuilds)
    assert max(most) == SMALL_SERVER_SESSIONS  # the pool was used to its bound, never past it


@pytest.mark.parametrize("kind", KINDS)
def test_anchor_groups_turns_by_the_adapters_state_key(scripted_moves, tmp_path, monkeypatch, request, kind):
    """``advantage_estimator="anchor"`` trains two steps on FrozenLake, keying each turn by the adapter's
    ``state_key`` (the board position), in process and through the OpenEnv server; its metrics are logged."""
    from mcadvantage import VinePPOConfig, VinePPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = _trainer(
        VinePPOTrainer,
        VinePPOConfig,
        tmp_path,
        _environment(kind, request),
        {"advantage_estimator": "anchor"},
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    logged = {k for e in trainer.state.log_history for k in e if k.startswith("anchor/")}
    assert logged, "no anchor/* metric was logged"
