"""What a reward may be (:mod:`~mcadvantage.rewards.errors`: the finite/unscorable/error rule and
:class:`~mcadvantage.rewards.errors.RewardFunctionError`) and reward models as reward functions that can grade Monte
Carlo rollouts (:mod:`~mcadvantage.rewards.models`)."""
