"""Building blocks every other part uses, with no imports from the rest of the package (the bottom layer).

- :mod:`~mcadvantage.core.advantages`: the algorithm's math on plain tensors (values to step and token advantages,
  whitening, GAE, PPO's clipped value loss);
- :mod:`~mcadvantage.core.anchors`: anchor-state turn credit from the batch itself (GiGPO's step groups), on plain lists;
- :mod:`~mcadvantage.core.settings`: one definition of which Monte Carlo and sampling settings are valid;
- :mod:`~mcadvantage.core.prompts`: prompt-length checks against the model's context;
- :mod:`~mcadvantage.core.text`: tokenizer and chat-message helpers;
- :mod:`~mcadvantage.core.versions`: the check of a dependency's version against its tested release range.
"""
