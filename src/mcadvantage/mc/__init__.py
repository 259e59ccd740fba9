"""The Monte Carlo machinery: which states of a response to estimate, the rollout requests, the free-sample pool,
where rollouts go under a budget, and :class:`~mcadvantage.mc.estimator.MCValueEstimator`, which turns K sampled
continuations per state into values. Usable without TRL (any :class:`~mcadvantage.samplers.Sampler`)."""
