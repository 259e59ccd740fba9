"""The research testbed: what the studies in ``benchmarks/`` and the tests need beside the library, kept out of the
wheel (``pip install mcadvantage`` gets the library and the demo, not this).

- :mod:`testbed.tasks`: the studies' task variants (``TASK_PRESETS``: ``long``, ``slip``, ``sign``; the ``slip`` and
  ``sign`` flaws and the harmless lead-ins they add to the demo's data) and their held-out prompt sets;
- :mod:`testbed.make_warmup`: trains and records the warm-up checkpoints the studies start from
  (``python -m testbed.make_warmup``);
- :mod:`testbed.toys`: the exact toy gradient task of the gradient instrument's tests and benchmark;
- ``testbed/warmup_policy/``: the fixed-schedule warm-up checkpoint of the 0.1 demo and the first studies (the
  demo's ``--warmup_schedule fixed`` finds it here; the demo's default, plateau checkpoint ships in the package).

How it is imported: it is a package at the repository root, so the root must be on ``sys.path``. ``python -m
testbed.<module>`` run from the root has it; every script in ``benchmarks/`` puts the root there itself (as it puts
``benchmarks/`` there for its neighbours), and pytest does through ``pythonpath`` in ``pyproject.toml``.
``tests/test_layout.py`` checks the direction: the testbed imports the package, the package never the testbed.

Importing this package imports :mod:`testbed.tasks` (no torch), so the studies' flaws are registered with the demo's
data builder whenever anything of the testbed is in use.
"""

from testbed import tasks as tasks  # registers the studies' flaws and lead-ins (see testbed.tasks)
