"""A verl agent loop that generates from token ids (``raw_prompt_ids``): the Monte Carlo states are a prompt plus
a partial response, which verl's single-turn loop (chat messages in ``raw_prompt``) cannot express. Registered
for the rollout workers through config/agent_loops.yaml. Not run in CI (needs verl's rollout servers)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register


@register("mcadvantage_prefix")
class PrefixAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = [int(t) for t in kwargs["raw_prompt_ids"]]
        response_length = self.rollout_config.response_length
        output = await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params
        )
        response_ids = list(output.token_ids)[:response_length]
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            num_turns=2,
            metrics={},
            extra_fields={"turn_scores": [], "tool_rewards": []},
        )
