"""The Monte Carlo machinery: which states of a response to estimate, the rollout requests, the free-sample pool,
where rollouts go under a budget, and :class:`~mcadvantage.mc.estimator.MCValueEstimator`, which turns K sampled
continuations per state into values. Usable without TRL (any :class:`~mcadvantage.samplers.Sampler`).

Modules, each importing only from those listed before it: :mod:`~mcadvantage.mc.budget` (pure allocation
functions), :mod:`~mcadvantage.mc.trajectory` (the input), :mod:`~mcadvantage.mc.planning` (which states),
:mod:`~mcadvantage.mc.stats` (the typed record of what a wave and an estimate cost),
:mod:`~mcadvantage.mc.rollouts` (requests, sampling, grading), :mod:`~mcadvantage.mc.pool` (free samples,
leave-one-out) and :mod:`~mcadvantage.mc.estimator` (the orchestrator: it calls each stage in order, none calls back). The settings
are one :class:`~mcadvantage.core.settings.MCSettings`. Agent episodes take the same pipeline: their states (at turn
boundaries, never in a tool result: :mod:`mcadvantage.agents.turns`) and their continuations (a sampler,
:class:`~mcadvantage.agents.episode_sampler.EpisodeSampler`, which owns the environments) come from
:mod:`mcadvantage.agents`."""
