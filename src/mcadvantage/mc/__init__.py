"""The Monte Carlo machinery: which states of a response to estimate, the rollout requests, the free-sample pool,
where rollouts go under a budget, and :class:`~mcadvantage.mc.estimator.MCValueEstimator`, which turns K sampled
continuations per state into values. Usable without TRL (any :class:`~mcadvantage.samplers.Sampler`).

Modules, each importing only from those listed before it: :mod:`~mcadvantage.mc.budget` (pure allocation
functions), :mod:`~mcadvantage.mc.trajectory` (the input), :mod:`~mcadvantage.mc.planning` (which states),
:mod:`~mcadvantage.mc.stats` (the typed record of what a wave and an estimate cost),
:mod:`~mcadvantage.mc.rollouts` (requests, sampling, grading), :mod:`~mcadvantage.mc.pool` (free samples,
leave-one-out) and :mod:`~mcadvantage.mc.estimator` (the orchestrator: it calls each stage in order, none calls back). The settings
are one :class:`~mcadvantage.core.settings.MCSettings`. :mod:`~mcadvantage.mc.episodes` (standalone) holds what
multi-turn episodes add on the credit side: their states, at turn boundaries and never in a tool result. Agent
episodes take the same pipeline: their continuations come from a sampler
(:class:`~mcadvantage.samplers.episode_sampler.EpisodeSampler`, in the rollout layer, which owns the environments)."""
