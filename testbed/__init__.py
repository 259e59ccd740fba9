"""The research testbed: what the studies in ``benchmarks/`` and the tests need beside the library, kept out of the
wheel (``pip install mcadvantage`` gets the library and the demo, not this).

- :mod:`testbed.tasks`: the studies' task variants (``TASK_PRESETS``: ``long``, ``slip``, ``sign``; ``StudyConfig``,
  the demo's settings plus the ``slip`` and ``sign`` flaws and the harmless lead-ins, and its ``build_data``) and
  their held-out prompt sets;
- :mod:`testbed.arms`: the studies' arm names, the demo's RL arms plus the arms without RL (``sft``, ``restem``,
  ``dpo_plus``, run by ``benchmarks/rl_free_arms.py``);
- :mod:`testbed.make_warmup`: trains and records the warm-up checkpoints the studies start from
  (``python -m testbed.make_warmup``);
- :mod:`testbed.toys`: the exact toy gradient task of the gradient instrument's tests and benchmark;
- :mod:`testbed.machine`: where a record was made (``machine_info``), written the same way by the testbed's tools and
  the studies;
- ``testbed/warmup_policy/``: the fixed-schedule warm-up checkpoint of the 0.1 demo and the first studies (the
  demo's ``--warmup_schedule fixed`` finds it here; the demo's default, plateau checkpoint ships in the package).

How it is imported: it is a package at the repository root, so the root must be on ``sys.path``. ``python -m
testbed.<module>`` run from the root has it; every script in ``benchmarks/`` puts the root there itself (as it puts
``benchmarks/`` there for its neighbours), and pytest does through ``pythonpath`` in ``pyproject.toml``.
``tests/test_layout.py`` checks the direction: the testbed imports the package, the package never the testbed, and
neither imports a study in ``benchmarks/``.

Nothing registers itself with the demo: a study names its settings (``testbed.tasks.StudyConfig``) and builds its data
(``testbed.tasks.build_data``) and arms (``testbed.arms.parse_arm``) here, so the package ships only what the demo
runs.
"""
