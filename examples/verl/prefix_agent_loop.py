"""A verl agent loop that generates from token ids (``raw_prompt_ids``): the Monte Carlo states are a prompt plus
a partial response, which verl's single-turn loop (chat messages in ``raw_prompt``) cannot express. Registered
for the rollout workers through config/agent_loops.yaml. tests/integrations/test_integration_verl.py runs it inside verl's own
``AgentLoopWorker`` / ``AgentLoopManager`` code on CPU, with a stand-in LLM server; on verl's rollout servers it
has not been run (that needs GPUs)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

#: The score a Monte Carlo continuation is returned with. verl's agent loop asks its reward loop for a score only
#: when the loop's output has none; a continuation alone is not the response verl's score functions expect (the
#: step prefix is missing), and mcadvantage grades each rollout itself on the whole response, so verl is not asked.
UNSCORED = 0.0


@register("mcadvantage_prefix")
class PrefixAgentLoop(AgentLoopBase):
    """One generation from ``raw_prompt_ids`` with at most ``mc_max_tokens`` new tokens (the rows that
    ``mcadvantage.integrations.verl.VerlRolloutSampler`` packs), cut at ``rollout.response_length``."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = [int(t) for t in kwargs["raw_prompt_ids"]]
        response_length = int(self.rollout_config.response_length)
        params = dict(sampling_params)
        if kwargs.get("mc_max_tokens") is not None:  # the state's own budget: what is left of the response
            params["max_tokens"] = max(1, min(int(kwargs["mc_max_tokens"]), response_length))
        output = await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=params
        )
        response_ids = list(output.token_ids)[:response_length]
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            reward_score=UNSCORED,
            num_turns=2,
            metrics={},
            extra_fields={"turn_scores": [], "tool_rewards": []},
        )
