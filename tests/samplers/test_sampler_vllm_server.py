"""VLLMServerSampler against a real ``vllm serve`` of the tiny offline Llama, started on loopback.

The server fixture picks a free port, waits for ``/health`` with a deadline, and always terminates
the server's whole process group (API server, engine core, worker). Start-up takes ~30-60 s on
2 CPU cores, so the server tests are ``slow``.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from _helpers import free_port, vllm_server

from mcadvantage.samplers import RolloutRequest

pytestmark = pytest.mark.vllm

EOS = 2  # mcadvantage.testing: </s>
MAX_MODEL_LEN = 128
PREFIX_A = (1, 40, 41, 42, 43)
PREFIX_B = (1, 50, 51)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left after 30 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def server_url(tiny_model_dir, tmp_path_factory):
    pytest.importorskip("vllm")
    with vllm_server(
        tiny_model_dir, tmp_path_factory.mktemp("vllm-serve"), stop=_stop, max_model_len=MAX_MODEL_LEN
    ) as (url, _):
        yield url


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32").eval()


# ---- without a server --------------------------------------------------------------------------------


def test_no_server_is_a_clear_error():
    from mcadvantage.samplers import VLLMServerSampler

    with pytest.raises(ConnectionError, match="no healthy vLLM server at http://127.0.0.1:"):
        VLLMServerSampler(f"http://127.0.0.1:{free_port()}")


class _RecordingSession:
    """A stand-in HTTP session that records request bodies and answers like vLLM's
    ``/v1/completions`` (prompt-major choices); used to check how requests are split into POSTs."""

    def __init__(self):
        self.bodies = []

    class _Response:
        status_code = 200

        def __init__(self, payload):
            self._payload = payload
            self.text = ""

        def json(self):
            return self._payload

    def get(self, url, timeout=None):
        if url.endswith("/v1/models"):
            return self._Response({"data": [{"id": "tiny", "max_model_len": 64}]})
        return self._Response({})

    def post(self, url, json, timeout=None):
        self.bodies.append(json)
        choices = [
            {"prompt_token_ids": p, "token_ids": [9] * json["max_tokens"], "finish_reason": "length"}
            for p in json["prompt"]
            for _ in range(json["n"])
        ]
        return self._Response({"choices": choices})


class _FakeClient:
    base_url = "http://fake:1"
    model = "tiny"

    def __init__(self):
        self.session = _RecordingSession()


def test_grouping_budget_cap_and_seed_ranges():
    from mcadvantage.samplers import VLLMServerSampler

    reqs = [
        RolloutRequest(PREFIX_A, n=3, max_tokens=10),
        RolloutRequest(PREFIX_B, n=3, max_tokens=10),
        RolloutRequest(PREFIX_B, n=2, max_tokens=10),
        RolloutRequest((1,) * 60, n=3, max_tokens=10),  # 60 + 10 > 64: budget capped at 4
    ]
    client = _FakeClient()
    sampler = VLLMServerSampler(client=client)
    assert sampler.max_model_len == 64
    out = sampler.sample(reqs)
    bodies = client.session.bodies
    # Unseeded: one POST per (n, budget): (3, 10) x2 prompts, (2, 10), (3, 4).
    assert sorted((b["n"], b["max_tokens"], len(b["prompt"])) for b in bodies) == [
        (2, 10, 1),
        (3, 4, 1),
        (3, 10, 2),
    ]
    assert all("seed" not in b and b["return_token_ids"] for b in bodies)
    assert [len(o) for o in out] == [3, 3, 2, 3]
    assert [len(o[0].token_ids) for o in out] == [10, 10, 10, 4]

    seeded_client = _FakeClient()
    seeded = VLLMServerSampler(client=seeded_client, seed=1000)
    seeded.sample(reqs[:3])
    seeded.sample(reqs[:1])
    # Seeded: one POST per request, seed ranges [s, s + n) disjoint across requests and calls.
    assert [(b["seed"], b["n"], len(b["prompt"])) for b in seeded_client.session.bodies] == [
        (1000, 3, 1),
        (1003, 3, 1),
        (1006, 2, 1),
        (1008, 3, 1),
    ]


def test_client_and_base_url_are_exclusive():
    from mcadvantage.samplers import VLLMServerSampler

    with pytest.raises(ValueError, match="either base_url or client"):
        VLLMServerSampler("http://127.0.0.1:1", client=_FakeClient())


# ---- real server ---------------------------------------------------------------------------------


def _check_termination(conts, max_tokens):
    for c in conts:
        assert 1 <= len(c.token_ids) <= max_tokens
        if c.truncated:
            assert len(c.token_ids) == max_tokens and c.token_ids[-1] != EOS
        else:
            assert c.token_ids[-1] == EOS
        assert EOS not in c.token_ids[:-1]


@pytest.mark.slow
def test_server_counts_budgets_eos_truncation(server_url):
    from mcadvantage.samplers import VLLMServerSampler

    sampler = VLLMServerSampler(server_url)
    assert sampler.max_model_len == MAX_MODEL_LEN
    reqs = [
        RolloutRequest(PREFIX_A, n=3, max_tokens=1),
        RolloutRequest(PREFIX_B, n=1, max_tokens=7),
        RolloutRequest(PREFIX_A, n=40, max_tokens=60),
        RolloutRequest(PREFIX_B, n=5, max_tokens=3),
        RolloutRequest(PREFIX_A, n=2, max_tokens=60),
    ]
    out = sampler.sample(reqs)
    assert [len(o) for o in out] == [3, 1, 40, 5, 2]
    for req, conts in zip(reqs, out, strict=True):
        _check_termination(conts, req.max_tokens)
    # P(no EOS in 60 tokens) ~ 0.55 for the untrained model: among 40 both outcomes occur.
    assert any(c.truncated for c in out[2]) and any(not c.truncated for c in out[2])


@pytest.mark.slow
def test_server_caps_budget_at_max_model_len(server_url):
    from mcadvantage.samplers import VLLMServerSampler

    prefix = (1,) + (40,) * 119  # 120 of 128 tokens: room for 8
    sampler = VLLMServerSampler(server_url, top_k=1, generation_kwargs={"ignore_eos": True})
    [conts] = sampler.sample([RolloutRequest(prefix, n=2, max_tokens=30)])
    assert [len(c.token_ids) for c in conts] == [8, 8]
    assert all(c.truncated for c in conts)
    with pytest.raises(ValueError, match="max_model_len is 128"):
        sampler.sample([RolloutRequest((1,) * 128, n=1, max_tokens=5)])


@pytest.mark.slow
def test_server_independent_samples(server_url):
    from mcadvantage.samplers import VLLMServerSampler

    sampler = VLLMServerSampler(server_url, generation_kwargs={"ignore_eos": True})
    reqs = [RolloutRequest(PREFIX_A, n=4, max_tokens=12) for _ in range(4)]
    seqs = [c.token_ids for conts in sampler.sample(reqs) + sampler.sample(reqs) for c in conts]
    assert len(set(seqs)) == len(seqs) == 32


@pytest.mark.slow
def test_server_greedy_matches_transformers_and_trl_client(server_url, hf_model):
    """Greedy continuations from the server equal transformers' greedy ones; the same holds when the
    sampler reuses a TRL ``VLLMClient`` connection (TRL's server mode)."""
    import torch
    from trl.generation.vllm_client import VLLMClient

    from mcadvantage.samplers import VLLMServerSampler

    prefixes = [PREFIX_A, PREFIX_B, (1, 60, 61, 62, 63, 64, 65, 66)]
    reqs = [RolloutRequest(p, n=2, max_tokens=20) for p in prefixes]
    by_url = VLLMServerSampler(server_url, temperature=0.0).sample(reqs)
    by_client = VLLMServerSampler(client=VLLMClient(base_url=server_url), temperature=0.0).sample(reqs)
    for prefix, conts, conts2 in zip(prefixes, by_url, by_client, strict=True):
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([prefix]),
                attention_mask=torch.ones(1, len(prefix), dtype=torch.long),
                do_sample=False,
                max_new_tokens=20,
                eos_token_id=EOS,
                pad_token_id=0,
            )[0, len(prefix) :].tolist()
        if EOS in ref:
            ref = ref[: ref.index(EOS) + 1]
        assert [list(c.token_ids) for c in conts] == [ref, ref]
        assert [list(c.token_ids) for c in conts2] == [ref, ref]


@pytest.mark.slow
def test_server_draws_tree_groups_for_the_trainer(server_url):
    """advantage_estimator="tree" in server mode: the main process draws the trees on the server
    (``draw_group_trees(main_only=True)``, the path every process takes with a vLLM server) and gets exactly
    ``G`` leaves per group, the leaves of a branch sharing their prefix, the shared tokens generated once."""
    import contextlib
    from types import SimpleNamespace

    from mcadvantage.estimators import TreeEstimator
    from mcadvantage.samplers import VLLMServerSampler
    from mcadvantage.trainer.policy import draw_group_trees

    logged = {}
    trainer = SimpleNamespace(
        advantage_estimator=TreeEstimator(branching=(2, 2), depths=(0, 3)),
        max_completion_length=12,
        accelerator=SimpleNamespace(is_main_process=True, process_index=0, num_processes=1),
        log_metric_values=lambda mode, metrics: logged.update(metrics),
    )
    sampler = VLLMServerSampler(server_url, generation_kwargs={"ignore_eos": True})
    prompts = [list(PREFIX_A)] * 4 + [list(PREFIX_B)] * 4
    completions, paths = draw_group_trees(
        trainer, prompts, 4, contextlib.nullcontext(sampler), main_only=True
    )
    assert len(completions) == len(paths) == 8
    for g in (0, 4):
        group = completions[g : g + 4]
        assert [p.children for p in paths[g : g + 4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert group[0][:3] == group[1][:3] and group[2][:3] == group[3][:3]
        assert all(len(c) == 12 for c in group)  # ignore_eos: every leaf runs to the budget
    # Per group: 2 x 3 shared tokens, then 4 x 9: 42 generated for 48 trained.
    assert logged == {"tree/generated_tokens": 84.0, "tree/leaf_tokens": 96.0}
